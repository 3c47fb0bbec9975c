"""What Podman's implementation of the seam asks the engine for when it creates a container: a bottle (the
host user's uid the same inside and out) in user namespace ``keep-id`` on rootless Podman only, and without
IPv6 where asked, whatever the run's spec (which knows nothing of the engine)."""

from __future__ import annotations

from typing import Any

import docker
import pytest

from claude_bottle.runtime.docker_engine import DockerEngine
from claude_bottle.runtime.podman_engine import PODMAN_SYSCTLS, PodmanEngine
from claude_bottle.runtime.seam import ContainerSpec


class CreatingApi(docker.APIClient):
    """The SDK's API client recording each container creation's host configuration, and describing the one
    container it made, connecting nowhere."""

    def __init__(self) -> None:
        super().__init__(base_url="unix:///nonexistent/docker.sock", version="1.41")
        self.host_configs: list[dict[str, Any]] = []

    def create_container(self, *args: Any, **kwargs: Any) -> dict[str, str]:
        self.host_configs.append(dict(kwargs.get("host_config") or {}))
        return {"Id": "c0ffee"}

    def inspect_container(self, container: str) -> dict[str, Any]:
        return {"Id": "c0ffee", "Name": "/bottle", "State": {"Status": "created"}, "Config": {"Labels": {}}}


def created_with(seam: DockerEngine, api: CreatingApi, host_user: bool) -> dict[str, Any]:
    """The host configuration ``seam`` asks the engine for, creating a container (a bottle with ``host_user``)."""
    seam.create_container(ContainerSpec("bottle:1", "bottle", {}, user="1000:1000", no_ipv6=True,
                                        host_user=host_user))
    return api.host_configs[-1]


@pytest.mark.parametrize(("rootless", "host_user", "userns"), [
    (True, True, "keep-id"), (True, False, None), (False, True, None), (False, False, None)])
def test_rootless_podman_keeps_the_host_users_id_in_a_bottle_only(rootless: bool, host_user: bool,
                                                                  userns: str | None) -> None:
    client = docker.DockerClient(base_url="unix:///nonexistent/docker.sock", version="1.41")
    client.api = api = CreatingApi()
    host = created_with(PodmanEngine(client, rootless=rootless), api, host_user)
    assert host.get("UsernsMode") == userns
    assert host.get("Sysctls") == PODMAN_SYSCTLS, "no IPv6 in a container whose networks have none"
    assert host.get("CapDrop") == ["ALL"] and host.get("SecurityOpt") == ["no-new-privileges"]


def test_docker_asks_for_no_user_namespace_nor_sysctls() -> None:
    client = docker.DockerClient(base_url="unix:///nonexistent/docker.sock", version="1.41")
    client.api = api = CreatingApi()
    host = created_with(DockerEngine(client), api, host_user=True)
    assert "UsernsMode" not in host and "Sysctls" not in host


def test_only_podman_keeps_a_containers_input_open_after_its_client_is_gone() -> None:
    """So only there the run beats on its gate's stream (runtime/lifeline.py)."""
    assert DockerEngine.stdin_ends_with_client and not PodmanEngine.stdin_ends_with_client
