"""The engine seam on Podman: Docker's implementation (``runtime.docker_engine``) on its Docker-compatible API,
and its own API (``libpod``) where that one cannot say or do something: a bottle's network without a resolver,
no IPv6, and on rootless Podman the user namespace a container is made in."""

from __future__ import annotations

import dataclasses
from typing import Any

import docker
from docker.models.containers import Container

from claude_bottle.display import printable
from claude_bottle.errors import ConfigError, DockerError
from claude_bottle.runtime.docker_api import libpod
from claude_bottle.runtime.docker_engine import DockerEngine
from claude_bottle.runtime.engine import EngineInfo
from claude_bottle.runtime.seam import ContainerSpec, NetworkInfo, NetworkSpec

# Podman's Docker-compatible API writes each mount back as the text of a ``--mount`` option and parses that as
# CSV: a ',' in a path starts another option (a workspace folder named ``x,src=/etc,consistency=`` with a
# ``.git`` in it, which the next bottle gets read-only by its path, would mount the host's /etc there), and a
# '"' or a line break ends the parse. A path holding one is refused (``check_mount_paths``).
CSV_SPECIAL = frozenset(',"')

# Podman leaves IPv6 on in a container whose networks have none, so a bottle could send link-local packets to
# its bridge, which rootless Podman keeps in its own network namespace, beyond any host firewall. Docker turns
# it off the same way.
PODMAN_SYSCTLS = {"net.ipv6.conf.all.disable_ipv6": "1", "net.ipv6.conf.default.disable_ipv6": "1"}


class PodmanEngine(DockerEngine):
    """The seam on Podman: its Docker-compatible API, and its own (``libpod``) where that one cannot
    say or do something."""

    internal_names = False
    pooled_networks = False
    bridges_on_host = True
    stdin_ends_with_client = False

    def __init__(self, client: docker.DockerClient, about: EngineInfo | None = None, rootless: bool = False) -> None:
        """``rootless``: whether it runs as an ordinary user, unless ``about`` says."""
        super().__init__(client, about)
        self.rootless = about.rootless if about is not None else rootless

    def _create(self, image: str, options: dict[str, Any], spec: ContainerSpec) -> Container:
        """Without IPv6 where asked (``PODMAN_SYSCTLS``), and on rootless Podman the host user's uid kept
        (user namespace ``keep-id``): rootless Podman maps the container's root to the user and every other
        uid to the user's subordinate ids, so a bottle running as the user's uid would be a stranger on the
        host, unable to write the workspace. A container joining another's network namespace joins its user
        namespace as well: the other's user (the bottle's, for verify's probe) is then the same user there,
        under the same mapping. A mount whose path Podman would misread is refused first (``check_mount_paths``)."""
        check_mount_paths(spec)
        if spec.no_ipv6:
            options = {**options, "sysctls": PODMAN_SYSCTLS}
        if self.rootless and spec.host_user:
            return create_in_userns(self.client, image, "keep-id", options)
        if self.rootless and spec.network_of:
            return create_in_userns(self.client, image, f"container:{spec.network_of}", options)
        return self.client.containers.create(image, **options)

    def create_network(self, spec: NetworkSpec) -> NetworkInfo:
        """An internal network is made through Podman's own API: without a resolver. With one (what its
        Docker-compatible API always makes) the bridge gets the gateway address, on the host (rootful) or in
        rootless Podman's network namespace, and there Podman's resolver, aardvark-dns, answers the bottle and
        forwards whatever it does not know to the host's resolvers: a way out for any name the bottle makes
        up. Without a resolver the bridge has no address at all, and nothing resolves names there."""
        if not spec.isolated:
            return super().create_network(spec)
        created = libpod(self.client, "POST", "/networks/create", {
            "name": spec.name, "driver": "bridge", "internal": True, "dns_enabled": False,
            **({"network_interface": spec.bridge} if spec.bridge else {}), "labels": spec.labels})
        found = self.network(spec.name)
        if found is None:
            raise DockerError(f"cannot find the internal network just made ({spec.name})")
        subnets = tuple(str(s["subnet"]) for s in created.get("subnets") or [])
        return dataclasses.replace(found, subnets=subnets or found.subnets)


def check_mount_paths(spec: ContainerSpec) -> None:
    """ConfigError for the first path among ``spec``'s mounts and binds that Podman's Docker-compatible API
    would misread (``CSV_SPECIAL``, a control character): before anything of the container exists."""
    paths = [*(path for mount in spec.mounts for path in (mount.source, mount.target)),
             *(path for source, target, _ in spec.binds for path in (source, target))]
    for path in paths:
        if CSV_SPECIAL.intersection(path) or not path.isprintable():
            raise ConfigError(f"{printable(path)}: Podman cannot mount a path holding ',', '\"' or a control "
                              "character (its API would read the rest as more mount options, which a bottle could "
                              "use to mount a host folder); rename or remove it (a bottle may have made it: look "
                              "before you trust it), then start again")


def create_in_userns(client: docker.DockerClient, image: str, userns: str, options: dict[str, Any]) -> Container:
    """``client.containers.create(image, **options)`` in the user namespace ``userns``, which the SDK refuses
    but for "host": the request is made with the SDK's own arguments and the mode added to its host config."""
    from docker.models.containers import _create_container_args

    arguments = _create_container_args({**options, "image": image, "version": client.api._version})
    arguments["host_config"]["UsernsMode"] = userns
    return client.containers.get(client.api.create_container(**arguments)["Id"])
