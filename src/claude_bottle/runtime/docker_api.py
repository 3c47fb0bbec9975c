"""The Docker SDK's client of the engine: connecting to it, its errors as ours, what it says about itself, and
Podman's own API (``libpod``) beside the Docker-compatible one, for what that one cannot say or do."""

from __future__ import annotations

import shutil
from typing import Any

import docker
import docker.errors

from claude_bottle.errors import DockerError
from claude_bottle.runtime import engine
from claude_bottle.runtime.engine import EngineInfo

# The version of Podman's own API that requests to it name: the first with netavark, which every later Podman
# still answers.
LIBPOD_API = "v4.0.0"


def connect() -> docker.DockerClient:
    """The SDK's client of the engine at $DOCKER_HOST (or the default socket), answering; else a DockerError
    that says what to do."""
    try:
        client = docker.from_env(timeout=120)
        client.ping()
    except docker.errors.DockerException as exc:
        raise DockerError(
            f"cannot reach the container engine ({exc}); start Docker (or `podman system service`), or set "
            "DOCKER_HOST to where it listens"
        ) from None
    return client


def api_failed(exc: docker.errors.APIError) -> DockerError:
    """The engine's refusal ``exc`` as our error, with the engine's own explanation."""
    return DockerError(str(exc.explanation or exc))


def libpod_answer(path: str, status: int, answer: Any) -> Any:
    """Podman's answer to a request to ``path`` of its own API; a DockerError with its message when it refused."""
    if status >= 400:
        message = answer.get("message") if isinstance(answer, dict) else None
        raise DockerError(f"Podman refused {path}: {message or status}")
    return answer


def libpod(client: docker.DockerClient, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    """A request to Podman's own API (``/libpod/...``) beside its Docker-compatible one, for what the latter
    cannot say or do; the decoded JSON answer (``libpod_answer``)."""
    api = client.api
    try:
        response = api.request(method, f"{api.base_url}/{LIBPOD_API}/libpod{path}", json=body,
                               timeout=api.timeout)
        answer = response.json()
    except (docker.errors.DockerException, OSError, ValueError) as exc:
        raise DockerError(f"Podman's API ({path}) failed: {exc}") from None
    return libpod_answer(path, response.status_code, answer)


def describe_engine(client: docker.DockerClient) -> EngineInfo:
    """What the engine says about itself (``engine.engine_info``): its version and info endpoints, and
    Podman's own info for what those do not say."""
    try:
        version, info = client.version(), client.info()
    except docker.errors.APIError as exc:
        raise api_failed(exc) from None
    podman_info = libpod(client, "GET", "/info") if engine.is_podman(version) else None
    return engine.engine_info(version, info, podman_info)


def docker_cli() -> str:
    """The engine's command-line client, which attaches a terminal (``docker`` speaks Podman's API too)."""
    cli = shutil.which("docker")
    if cli is None:
        raise DockerError("the docker command is needed to attach a terminal; install the Docker CLI")
    return cli
