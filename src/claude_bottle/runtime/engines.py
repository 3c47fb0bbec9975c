"""Opening the engine the host speaks to: connected (``runtime.docker_api``), asked what it is, and given
Docker's implementation of the seam or Podman's."""

from __future__ import annotations

import docker

from claude_bottle.runtime.docker_api import connect, describe_engine
from claude_bottle.runtime.docker_engine import DockerEngine
from claude_bottle.runtime.engine import EngineInfo
from claude_bottle.runtime.podman_engine import PodmanEngine


def engine_for(client: docker.DockerClient, about: EngineInfo) -> DockerEngine:
    """The implementation for the engine ``about`` describes."""
    return PodmanEngine(client, about) if about.podman else DockerEngine(client, about)


def open_engine(client: docker.DockerClient | None = None) -> DockerEngine:
    """The engine answering on the Docker API (``connect()`` unless ``client`` is given), Docker's or
    Podman's implementation as it names itself."""
    client = client or connect()
    return engine_for(client, describe_engine(client))
