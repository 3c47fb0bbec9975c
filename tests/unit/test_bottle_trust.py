"""The gate's CA on its way into a bottle: the system bundle gains it (root-owned, 0644), and every variable
tools read for CA certificates names the whole bundle, never the gate's CA alone."""

from __future__ import annotations

import io
import tarfile
import tomllib
from pathlib import Path

import pytest

from claude_bottle.config import parse_agent
from claude_bottle.credentials import Credential
from claude_bottle.errors import DockerError, GateError
from claude_bottle.gate.ca import RunCA
from claude_bottle.launch import Launch, run_spec
from claude_bottle.runtime.bottle import CA_ENV, SYSTEM_BUNDLE, Run, trust_in_bottle
from tests.helpers import make_token

ROOTS = b"-----BEGIN CERTIFICATE-----\nMIIroot\n-----END CERTIFICATE-----"  # no final newline


def archive(name: str, data: bytes, symlink: bool = False) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo(name)
        if symlink:
            info.type, info.linkname = tarfile.SYMTYPE, "/tmp/elsewhere"
        else:
            info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


class FakeContainer:
    """The two engine calls ``trust_in_bottle`` makes, on an in-memory file system."""

    def __init__(self, bundle: bytes, symlink: bool = False) -> None:
        self.bundle, self.symlink = bundle, symlink
        self.put: list[tuple[str, tarfile.TarInfo, bytes]] = []

    def get_archive(self, path: str) -> tuple[list[bytes], dict[str, object]]:
        assert path == SYSTEM_BUNDLE
        data = archive("ca-certificates.crt", self.bundle, self.symlink)
        return [data[:100], data[100:]], {}

    def put_archive(self, path: str, data: bytes) -> bool:
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            for member in tar.getmembers():
                extracted = tar.extractfile(member)
                assert extracted is not None
                self.put.append((path, member, extracted.read()))
        return True


def test_the_gates_ca_is_appended_to_the_images_bundle_root_owned_and_read_only_to_others() -> None:
    pem = RunCA.generate().certificate_pem
    container = FakeContainer(ROOTS)
    trust_in_bottle(container, pem)  # type: ignore[arg-type]
    ((directory, member, content),) = container.put
    assert f"{directory}/{member.name}" == SYSTEM_BUNDLE
    assert content == ROOTS + b"\n" + pem
    assert (member.uid, member.gid, member.mode) == (0, 0, 0o644)


def test_a_bundle_that_is_not_a_file_is_refused() -> None:
    with pytest.raises(DockerError, match="is not a file"):
        trust_in_bottle(FakeContainer(b"", symlink=True), RunCA.generate().certificate_pem)  # type: ignore[arg-type]


def test_every_ca_variable_names_the_whole_bundle_whatever_the_agent_sets(tmp_path: Path) -> None:
    agent = parse_agent("a", tomllib.loads('version = 1\n[env]\nSSL_CERT_FILE = "/tmp/mine.pem"\n'
                                           'NODE_EXTRA_CA_CERTS = "/tmp/mine.pem"\n'), "a.toml")
    run = Run(None, run_spec(Launch(agent, tmp_path, Credential.parse(make_token(), "t")), "b", "g", "1000:1000"))  # type: ignore[arg-type]
    environment = run.bottle_environment()
    assert {name: environment[name] for name in CA_ENV} == dict.fromkeys(CA_ENV, SYSTEM_BUNDLE)
    assert {"NODE_EXTRA_CA_CERTS", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO",
            "PIP_CERT", "npm_config_cafile"} <= set(CA_ENV)


class FakeGate:
    """A gate container whose log is ``log``."""

    status = "running"

    def __init__(self, log: str) -> None:
        self.log = log

    def logs(self, stdout: bool, stderr: bool) -> bytes:
        return self.log.encode()

    def reload(self) -> None:
        pass


def test_the_host_takes_the_ca_the_gate_announced(tmp_path: Path) -> None:
    ca = RunCA.generate()
    run = Run(None, run_spec(Launch(parse_agent("a", {"version": 1}, "a.toml"), tmp_path,  # type: ignore[arg-type]
                                    Credential.parse(make_token(), "t")), "b", "g", "1000:1000"))
    run.gate = FakeGate(f"{ca.announcement()}\nclaude-bottle gate: API on gate:8080, proxy on gate:3128\n")  # type: ignore[assignment]
    run.wait_for_gate()
    assert run.gate_ca == ca.certificate_pem


def test_a_gate_that_announces_no_ca_is_refused(tmp_path: Path) -> None:
    run = Run(None, run_spec(Launch(parse_agent("a", {"version": 1}, "a.toml"), tmp_path,  # type: ignore[arg-type]
                                    Credential.parse(make_token(), "t")), "b", "g", "1000:1000"))
    run.gate = FakeGate("claude-bottle gate: API on gate:8080, proxy on gate:3128\n")  # type: ignore[assignment]
    with pytest.raises(GateError, match="announced no CA certificate"):
        run.wait_for_gate()
