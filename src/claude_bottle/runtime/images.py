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
import re
import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from urllib.parse import unquote, urlsplit

import claude_bottle
from claude_bottle.claude_code import DEFAULT_CLAUDE_CODE_VERSION, LATEST
from claude_bottle.errors import ConfigError, DockerError
from claude_bottle.runtime.names import image_repository
from claude_bottle.runtime.seam import BuildFailed, Engine

BASE_IMAGE = "debian:bookworm-slim"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
CLAUDE_CODE_PACKAGE = "@anthropic-ai/claude-code"
# Where systems keep the certificates their administrator added to the system trust store (Debian, Ubuntu,
# Alpine; Fedora, RHEL; Arch, SUSE): a corporate TLS-inspection CA lives here on a host that works behind it.
HOST_CA_DIRS = ("/usr/local/share/ca-certificates", "/etc/pki/ca-trust/source/anchors",
                "/etc/ca-certificates/trust-source/anchors", "/usr/share/pki/trust/anchors")
PEM_MARK = b"-----BEGIN CERTIFICATE-----"
# What the gate imports, pinned with what cryptography needs, so the image tag follows every version.
GATE_REQUIREMENTS = ("brotli", "click", "httptools", "idna", "jiter", "publicsuffixlist", "uvloop", "cryptography",
                     "cffi", "pycparser")
# Pinned too where installed here (no wheel for every machine): DLP's multi-pattern engine. Without it the gate
# uses the standard library's matcher, and says so (gate/dlp.py).
GATE_OPTIONAL = ("hyperscan",)

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
        return f"{image_repository(self.name)}:{digest.hexdigest()[:16]}"


def _ca_files(inputs: BuildInputs) -> dict[str, bytes]:
    files = {"ca/.keep": b""}
    for path in inputs.extra_ca_files:
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            raise ConfigError(f"extra CA certificate {path}: {exc.strerror}") from None
        if PEM_MARK not in data:
            raise ConfigError(f"extra CA certificate {path} is not a PEM certificate")
        # update-ca-certificates only picks up *.crt files
        files[f"ca/{hashlib.sha256(data).hexdigest()[:12]}-{Path(path).stem}.crt"] = data
    return files


def host_ca_files(dirs: tuple[str, ...] = HOST_CA_DIRS) -> tuple[Path, ...]:
    """The PEM certificates this host's administrator added to its trust store (``HOST_CA_DIRS``), sorted;
    files that are not PEM certificates (a DER file, a README) are passed over."""
    found = []
    for folder in dirs:
        root = Path(folder)
        if not root.is_dir():
            continue
        for path in sorted(root.rglob("*")):
            if path.suffix not in (".crt", ".pem") or not path.is_file():
                continue
            try:
                if PEM_MARK in path.read_bytes():
                    found.append(path)
            except OSError:
                continue  # unreadable for this user: it cannot be copied into an image either
    return tuple(found)


def resolve_claude_version(version: str, ca_files: tuple[Path, ...] = ()) -> str:
    """``version`` itself, or for ``latest`` the newest release as npm's registry names it (``npm view``, with
    the host's npm settings, trusting ``ca_files`` as well). A DockerError says what failed."""
    if version != LATEST:
        return version
    npm = shutil.which("npm")
    if npm is None:
        raise DockerError(f'claude.version = "{LATEST}" is resolved with `npm view {CLAUDE_CODE_PACKAGE} version`, and '
                          "npm is not installed: install npm, or set claude.version to a release such as "
                          f"{DEFAULT_CLAUDE_CODE_VERSION}")
    env = dict(os.environ)
    if ca_files:
        with tempfile.NamedTemporaryFile("wb", prefix="claude-bottle-ca-", suffix=".pem", delete=False) as bundle:
            for path in ca_files:
                bundle.write(Path(path).read_bytes().rstrip() + b"\n")
        env["NODE_EXTRA_CA_CERTS"] = bundle.name
    try:
        # Not in the workspace: npm reads the .npmrc of the folder it runs in, which a bottle may have written
        # (a registry of its choosing, asked from the host, outside the gate, and choosing the version built).
        with tempfile.TemporaryDirectory(prefix="claude-bottle-npm-") as neutral:
            result = subprocess.run([npm, "view", CLAUDE_CODE_PACKAGE, "version"], capture_output=True, text=True,
                                    env=env, timeout=60, cwd=neutral)
    except subprocess.TimeoutExpired:
        raise DockerError(f"`npm view {CLAUDE_CODE_PACKAGE} version` did not answer within 60 s; set "
                          "claude.version to a release, or check the network") from None
    finally:
        if ca_files:
            os.unlink(env["NODE_EXTRA_CA_CERTS"])
    found = result.stdout.strip().splitlines()[-1:] if result.returncode == 0 else []
    if not found or not re.fullmatch(r"\d+\.\d+\.\d+", found[0]):
        error = [line for line in result.stderr.splitlines() if "ERR" in line][-2:] or result.stderr.splitlines()[-1:]
        raise DockerError(f"cannot resolve claude.version = \"{LATEST}\": `npm view {CLAUDE_CODE_PACKAGE} version` "
                          f"said {' / '.join(error) or result.stdout.strip() or 'nothing'}"
                          + ("; " + CA_HINT if _certificate_problem(result.stderr) else ""))
    return found[0]


def _context_file(name: str) -> bytes:
    """A file of the images' build contexts (``runtime/dockerfiles/``)."""
    return resources.files("claude_bottle.runtime").joinpath(f"dockerfiles/{name}").read_bytes()


# A name, with an architecture (``:arm64``) or a version (``=1.2-3``) if wanted. Never a leading ``-``: apt-get
# reads that as its own option (``-oDPkg::Pre-Invoke::=...`` runs a command in the build).
_DEBIAN_PACKAGE = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9+.:=~-]*", re.ASCII)


def bottle_spec(inputs: BuildInputs) -> ImageSpec:
    for package in inputs.extra_packages:
        if not _DEBIAN_PACKAGE.fullmatch(package):
            raise ConfigError(f"extra package {package!r} is not a Debian package name (a letter or digit, then "
                              "letters, digits and + - . : = ~)")
    return ImageSpec(
        "bottle",
        {"Dockerfile": _context_file("bottle.Dockerfile"), "bottle-entry.sh": _context_file("bottle-entry.sh"),
         **_ca_files(inputs)},
        {"CLAUDE_CODE_VERSION": inputs.claude_code_version, "EXTRA_PACKAGES": " ".join(inputs.extra_packages)},
    )


def _package_files() -> Iterator[tuple[str, bytes]]:
    root = Path(claude_bottle.__file__).parent
    for path in sorted(root.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
            yield f"claude_bottle/{path.relative_to(root).as_posix()}", path.read_bytes()


def _installed(name: str) -> bool:
    try:
        importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def gate_spec(inputs: BuildInputs) -> ImageSpec:
    """The gate runs this very package, pinned to the dependency versions installed here."""
    pins = "".join(f"{name}=={importlib.metadata.version(name)}\n" for name in GATE_REQUIREMENTS
                   + tuple(name for name in GATE_OPTIONAL if _installed(name)))
    return ImageSpec(
        "gate",
        {"Dockerfile": _context_file("gate.Dockerfile"), "requirements.txt": pins.encode(), **dict(_package_files()),
         **_ca_files(inputs)},
    )


CA_HINT = ("a TLS-inspecting proxy is likely in the way: put its CA certificate (PEM) in the host's trust store "
           f"({HOST_CA_DIRS[0]}/ and update-ca-certificates), or list it in $CLAUDE_BOTTLE_EXTRA_CA_CERTS or an "
           "agent's extra_ca_certificates (docs/engines.md#tls-inspection)")
# What npm, pip, curl, apt and OpenSSL say when a certificate in the chain is not trusted.
_CERTIFICATE_ERRORS = re.compile(
    r"self[- ]signed certificate|unable to get local issuer certificate|certificate verify failed|"
    r"unable to verify the first certificate|SELF_SIGNED_CERT_IN_CHAIN|UNABLE_TO_GET_ISSUER_CERT|"
    r"CERT_UNTRUSTED|server certificate verification failed|certificate is not trusted|x509: certificate",
    re.IGNORECASE)
_STEP = re.compile(r"^(?:\[\d+/\d+\] )?(?:Step|STEP) (\d+)/(\d+)\s*:?\s*(.*)$")


def _certificate_problem(log: str) -> bool:
    return bool(_CERTIFICATE_ERRORS.search(log))


def build_failure(name: str, step: str, error: str, log: list[str], proxy: str = "") -> DockerError:
    """The one error a failed build ends with: which image, which step, what it said, and what to do.
    ``proxy``: the URL (password masked) of the upstream proxy the build's downloads went through."""
    last = [line for line in log if line.strip()][-12:]
    shown = "\n".join(f"    {line}" for line in last)
    text = "\n".join([*log, error])
    if _certificate_problem(text):
        hint = CA_HINT
    elif proxy and re.search(r"\b407\b|Proxy Authentication Required", text):
        hint = (f"the upstream proxy {proxy} refused the build's credentials (407): set USER:PASSWORD in its URL, "
                "or USER in it and the password with `claude-bottle login proxy` (docs/upstream-proxy.md)")
    elif re.search(r"Temporary failure resolving|Could not resolve|getaddrinfo|ENOTFOUND|EAI_AGAIN|"
                   r"Network is unreachable|timed out|ETIMEDOUT|ECONNREFUSED|Could not connect|"
                   r"Failed to fetch|Some index files failed", text):
        hint = (f"the build could not reach a package registry through the upstream proxy {proxy}: check that it "
                "answers from the engine's build containers (docs/upstream-proxy.md)" if proxy else
                "the build could not reach a package registry: check this machine's network, or set the "
                "upstream proxy the host must use (docs/upstream-proxy.md)")
    else:
        hint = "the output above shows why; fix it and run `claude-bottle build` again"
    where = f" at {step}" if step else ""
    return DockerError(f"building the {name} image failed{where}: {error.strip()}\n  last output:\n{shown}\n"
                       f"  what to do: {hint}")


def build(engine: Engine, spec: ImageSpec, progress: Progress, proxy: dict[str, str] | None = None) -> str:
    """Build ``spec`` unless an image with its tag exists. Returns the tag.

    ``proxy``: the proxy variables for the RUN steps (``UpstreamProxy.environment``), passed as build
    arguments under the engine's predefined proxy names, which the Dockerfiles never declare with ARG: so
    the engine keeps them out of the image's config and history, and they are not part of the tag (they change
    nothing in the image). Their secrets are masked in the build's output.

    Progress shows one line per Dockerfile step with the seconds the previous one took; the steps' own
    output is kept and shown only when the build fails (``build_failure``)."""
    if engine.image_exists(spec.tag):
        return spec.tag
    ensure_base_image(engine, progress)
    progress(f"building the {spec.name} image {spec.tag}")
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="claude-bottle-build-") as context:
        for relative, data in spec.files.items():
            target = Path(context, relative)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        build_id = secrets.token_hex(8)
        buildargs = {**spec.buildargs, **(proxy or {})}
        secrets_shown = _proxy_secrets(proxy or {})
        if STAGE_ARG in spec.files["Dockerfile"]:
            buildargs["BUILD_ID"] = build_id
        log: list[str] = []
        step, step_began = "", began
        took: dict[str, float] = {}
        try:
            for line in engine.build_image(Path(context), spec.tag, buildargs):
                if not line.strip():
                    continue
                for secret in secrets_shown:
                    line = line.replace(secret, "***")
                log.append(line)
                del log[:-200]
                if match := _STEP.match(line.strip()):
                    now = time.monotonic()
                    if step:
                        took[step] = now - step_began
                    step, step_began = f"step {match[1]}/{match[2]} ({match[3][:70]})", now
                    progress(f"  {spec.name} {step}")
        except BuildFailed as exc:
            error = str(exc)
            for secret in secrets_shown:
                error = error.replace(secret, "***")
            shown_proxy = next(iter((proxy or {}).values()), "")
            for secret in secrets_shown:
                shown_proxy = shown_proxy.replace(secret, "***")
            raise build_failure(spec.name, step, error, log, shown_proxy) from None
    remove_build_stage(engine, build_id)
    if step:
        took[step] = time.monotonic() - step_began
    slowest = max(took, key=took.__getitem__, default="")
    progress(f"built the {spec.name} image in {time.monotonic() - began:.1f} s"
             + (f" (slowest: {slowest}, {took[slowest]:.1f} s)" if slowest else ""))
    return spec.tag


def _proxy_secrets(proxy: dict[str, str]) -> tuple[str, ...]:
    """The user-info parts (``user:password``, raw and percent-decoded) of the proxy URLs in ``proxy``."""
    found: set[str] = set()
    for value in proxy.values():
        with contextlib.suppress(ValueError):
            parts = urlsplit(value)
            if parts.password:
                found.update((parts.password, unquote(parts.password)))
    return tuple(sorted(found, key=len, reverse=True))


# A Dockerfile with a throwaway stage declares this and labels the stage with it (bottle.Dockerfile).
STAGE_ARG = b"ARG BUILD_ID"


def remove_build_stage(engine: Engine, build_id: str) -> None:
    """Remove the throwaway stage the classic builder kept for build ``build_id``, and only that build's."""
    with contextlib.suppress(DockerError):
        engine.prune_images(f"claude-bottle.stage={build_id}")


def ensure_base_image(engine: Engine, progress: Progress) -> None:
    """Make ``debian:bookworm-slim`` available: as it is, pulled, or built here with debootstrap when no
    registry can be reached (air-gapped machines). The Dockerfiles work the same on either."""
    if engine.image_exists(BASE_IMAGE):
        return
    progress(f"pulling {BASE_IMAGE}")
    try:
        engine.pull_image(BASE_IMAGE)
        return
    except DockerError as exc:
        progress(f"cannot pull {BASE_IMAGE} ({exc}); building it locally with debootstrap")
    build_base_image(engine, progress)


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


def build_base_image(engine: Engine, progress: Progress) -> None:
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
        engine.import_image(archive, repository, tag, ('CMD ["bash"]',))

