"""The Docker engine connection, with errors that say what to do."""

from __future__ import annotations

import docker
import docker.errors

from claude_bottle.errors import DockerError

# Engines before 25.0.5 let containers on internal networks resolve external names (CVE-2024-29018).
DNS_FIXED_VERSION = (25, 0, 5)


def connect() -> docker.DockerClient:
    try:
        client = docker.from_env(timeout=120)
        client.ping()
    except docker.errors.DockerException as exc:
        raise DockerError(
            f"cannot reach the Docker engine ({exc}); start Docker, or set DOCKER_HOST to where it listens"
        ) from None
    return client


def version(client: docker.DockerClient) -> tuple[int, ...]:
    text = str(client.version().get("Version", "0"))
    numbers = []
    for part in text.split("+")[0].split("-")[0].split("."):
        numbers.append(int(part) if part.isdigit() else 0)
    return tuple(numbers)
