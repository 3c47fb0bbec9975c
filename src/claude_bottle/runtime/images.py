"""The bottle and gate images: build contexts, tags derived from their inputs, and the base image.

A tag is a digest of everything that goes into an image (Dockerfile, build arguments, CA certificates,
the gate's code and pinned dependencies), so an image is rebuilt exactly when one of them changed.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import os
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import docker
import docker.errors

import claude_bottle
from claude_bottle.errors import ConfigError, DockerError

BASE_IMAGE = "debian:bookworm-slim"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
DEFAULT_CLAUDE_CODE_VERSION = "2.1.126"
# What the gate imports, pinned with what cryptography needs, so the image tag follows every version.
GATE_REQUIREMENTS = ("click", "h11", "idna", "publicsuffixlist", "cryptography", "cffi", "pycparser")

Progress = Callable[[str], None]


@dataclass(frozen=True)
class BuildInputs:
    """What a user may change about the images."""

    claude_code_version: str = DEFAULT_CLAUDE_CODE_VERSION
    extra_ca_files: tuple[Path, ...] = ()  # PEM certificates trusted in both images and by the gate upstream
    extra_packages: tuple[str, ...] = ()  # Debian packages added to the bottle


@dataclass(frozen=True)
class ImageSpec:
    name: str  # "bottle" or "gate"
    files: dict[str, bytes] = field(repr=False)  # the build context, path -> content
    buildargs: dict[str, str] = field(default_factory=dict)

    @property
    def tag(self) -> str:
        digest = hashlib.sha256()
        digest.update(json.dumps(self.buildargs, sort_keys=True).encode())
        for path in sorted(self.files):
            digest.update(path.encode() + b"\0" + hashlib.sha256(self.files[path]).digest())
        return f"claude-bottle-{self.name}:{digest.hexdigest()[:16]}"


def _ca_files(inputs: BuildInputs) -> dict[str, bytes]:
    files = {"ca/.keep": b""}
    for path in inputs.extra_ca_files:
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            raise ConfigError(f"extra CA certificate {path}: {exc.strerror}") from None
        if b"-----BEGIN CERTIFICATE-----" not in data:
            raise ConfigError(f"extra CA certificate {path} is not a PEM certificate")
        # update-ca-certificates only picks up *.crt files
        files[f"ca/{hashlib.sha256(data).hexdigest()[:12]}-{Path(path).stem}.crt"] = data
    return files


def _dockerfile(name: str) -> bytes:
    return resources.files("claude_bottle.runtime").joinpath(f"dockerfiles/{name}.Dockerfile").read_bytes()


def bottle_spec(inputs: BuildInputs) -> ImageSpec:
    for package in inputs.extra_packages:
        if not package or not all(c.isalnum() or c in "+-.:=~" for c in package):
            raise ConfigError(f"extra package {package!r} is not a Debian package name")
    return ImageSpec(
        "bottle",
        {"Dockerfile": _dockerfile("bottle"), **_ca_files(inputs)},
        {"CLAUDE_CODE_VERSION": inputs.claude_code_version, "EXTRA_PACKAGES": " ".join(inputs.extra_packages)},
    )


def _package_files() -> Iterator[tuple[str, bytes]]:
    root = Path(claude_bottle.__file__).parent
    for path in sorted(root.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
            yield f"claude_bottle/{path.relative_to(root).as_posix()}", path.read_bytes()


def gate_spec(inputs: BuildInputs) -> ImageSpec:
    """The gate runs this very package, pinned to the dependency versions installed here."""
    pins = "".join(f"{name}=={importlib.metadata.version(name)}\n" for name in GATE_REQUIREMENTS)
    return ImageSpec(
        "gate",
        {"Dockerfile": _dockerfile("gate"), "requirements.txt": pins.encode(), **dict(_package_files()),
         **_ca_files(inputs)},
    )


def image_exists(client: docker.DockerClient, tag: str) -> bool:
    try:
        client.images.get(tag)
        return True
    except docker.errors.ImageNotFound:
        return False


def build(client: docker.DockerClient, spec: ImageSpec, progress: Progress) -> str:
    """Build ``spec`` unless an image with its tag exists. Returns the tag."""
    if image_exists(client, spec.tag):
        return spec.tag
    ensure_base_image(client, progress)
    progress(f"building {spec.tag}")
    with tempfile.TemporaryDirectory(prefix="claude-bottle-build-") as context:
        for relative, data in spec.files.items():
            target = Path(context, relative)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        tail: list[str] = []
        build_id = secrets.token_hex(8)
        buildargs = dict(spec.buildargs)
        if STAGE_ARG in spec.files["Dockerfile"]:
            buildargs["BUILD_ID"] = build_id
        try:
            for chunk in client.api.build(path=context, tag=spec.tag, buildargs=buildargs, rm=True,
                                          forcerm=True, decode=True, pull=False):
                if "error" in chunk:
                    raise DockerError(f"building the {spec.name} image failed: {chunk['error'].strip()}\n"
                                      + "\n".join(tail[-15:]))
                for line in str(chunk.get("stream", "")).splitlines():
                    if line.strip():
                        tail.append(line)
                        progress(f"  {line}")
        except docker.errors.APIError as exc:
            raise DockerError(f"building the {spec.name} image failed: {exc.explanation or exc}") from None
    remove_build_stage(client, build_id)
    return spec.tag


# A Dockerfile with a throwaway stage declares this and labels the stage with it (bottle.Dockerfile).
STAGE_ARG = b"ARG BUILD_ID"


def remove_build_stage(client: docker.DockerClient, build_id: str) -> None:
    """Remove the throwaway stage the classic builder kept for build ``build_id``, and only that build's."""
    with contextlib.suppress(docker.errors.APIError):
        client.images.prune(filters={"dangling": True, "label": f"claude-bottle.stage={build_id}"})


def ensure_base_image(client: docker.DockerClient, progress: Progress) -> None:
    """Make ``debian:bookworm-slim`` available: as it is, pulled, or built here with debootstrap when no
    registry can be reached (air-gapped machines). The Dockerfiles work the same on either."""
    if image_exists(client, BASE_IMAGE):
        return
    progress(f"pulling {BASE_IMAGE}")
    try:
        client.images.pull(BASE_IMAGE)
        return
    except docker.errors.APIError as exc:
        progress(f"cannot pull {BASE_IMAGE} ({exc.explanation or exc}); building it locally with debootstrap")
    build_base_image(client, progress)


# What Debian's official slim images leave out; the Dockerfiles keep it out of what they install too.
_SLIM_DROP = ("var/cache/apt/archives/*.deb", "var/cache/apt/*.bin", "var/lib/apt/lists/*", "usr/share/man/*",
              "usr/share/info/*", "usr/share/locale/*")


def _slim(root: Path) -> None:
    """Trim a debootstrap tree to about the size of the official debian:bookworm-slim."""
    for pattern in _SLIM_DROP:
        for path in root.glob(pattern):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
    for path in sorted(root.glob("usr/share/doc/**/*"), reverse=True):  # keep only the copyright files
        if path.is_dir() and not path.is_symlink():
            if not any(path.iterdir()):
                path.rmdir()
        elif path.name != "copyright":
            path.unlink()


def build_base_image(client: docker.DockerClient, progress: Progress) -> None:
    debootstrap = shutil.which("debootstrap")
    if debootstrap is None or os.geteuid() != 0:
        raise DockerError(
            f"{BASE_IMAGE} cannot be pulled and building it locally needs debootstrap, run as root: "
            f"install debootstrap and run `sudo claude-bottle build` once, or `docker load` the image"
        )
    with tempfile.TemporaryDirectory(prefix="claude-bottle-base-") as work:
        root = Path(work, "rootfs")
        result = subprocess.run(
            [debootstrap, "--variant=minbase", "bookworm", str(root), DEBIAN_MIRROR],
            capture_output=True, text=True,
        )
        if result.returncode != 0:
            raise DockerError(f"debootstrap failed: {result.stderr.strip().splitlines()[-1:]}")
        _slim(root)
        progress(f"importing {BASE_IMAGE}")
        archive = Path(work, "rootfs.tar")
        subprocess.run(["tar", "-C", str(root), "-cf", str(archive), "."], check=True)
        repository, tag = BASE_IMAGE.split(":")
        client.api.import_image_from_file(str(archive), repository=repository, tag=tag, changes=['CMD ["bash"]'])

