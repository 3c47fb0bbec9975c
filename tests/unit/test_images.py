"""Image tags follow their inputs: a rebuild happens exactly when something that goes in changed."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from claude_bottle.agent.schema import AgentConfig
from claude_bottle.claude_code import LATEST
from claude_bottle.errors import ConfigError, DockerError
from claude_bottle.launch import HOST_CA_VARIABLE, build_inputs
from claude_bottle.runtime.images import (
    BuildInputs,
    bottle_spec,
    build_failure,
    gate_spec,
    host_ca_files,
    resolve_claude_version,
)

PEM = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


def test_same_inputs_same_tags() -> None:
    assert bottle_spec(BuildInputs()).tag == bottle_spec(BuildInputs()).tag
    assert gate_spec(BuildInputs()).tag == gate_spec(BuildInputs()).tag


def test_every_input_changes_the_bottle_tag(tmp_path: Path) -> None:
    ca = tmp_path / "corp.pem"
    ca.write_bytes(PEM)
    base = bottle_spec(BuildInputs()).tag
    variants = [BuildInputs(claude_code_version="2.1.100"), BuildInputs(extra_packages=("make",)),
                BuildInputs(extra_ca_files=(ca,))]
    tags = {bottle_spec(v).tag for v in variants}
    assert base not in tags and len(tags) == 3
    assert gate_spec(BuildInputs(extra_ca_files=(ca,))).tag != gate_spec(BuildInputs()).tag


def test_extra_ca_certificates_go_into_the_context_as_crt_files(tmp_path: Path) -> None:
    ca = tmp_path / "corp.pem"
    ca.write_bytes(PEM)
    files = bottle_spec(BuildInputs(extra_ca_files=(ca,))).files
    (name,) = [f for f in files if f.startswith("ca/") and f != "ca/.keep"]
    assert name.endswith("-corp.crt") and files[name] == PEM


def test_gate_context_holds_this_package_and_pinned_requirements() -> None:
    files = gate_spec(BuildInputs()).files
    assert "claude_bottle/gate/server.py" in files and "claude_bottle/cli.py" in files
    assert not any("__pycache__" in f for f in files)
    pins = files["requirements.txt"].decode().split()
    engine = {"hyperscan"} if importlib.util.find_spec("hyperscan") else set()  # where installed here
    assert {p.split("==")[0] for p in pins} == {"brotli", "click", "httptools", "idna", "jiter", "publicsuffixlist",
                                                "uvloop", "cryptography", "cffi", "pycparser"} | engine
    assert all("==" in p for p in pins)
    assert b"Vectorscan" in files["claude_bottle/gate/licenses/hyperscan.txt"], "the engine's license notices"
    assert b"Brotli Authors" in files["claude_bottle/gate/licenses/brotli.txt"], "the br decoder's license notice"
    assert b"Samuel Colvin" in files["claude_bottle/gate/licenses/jiter.txt"], "the JSON parser's license notice"


@pytest.mark.parametrize(("inputs", "words"), [
    (BuildInputs(extra_packages=("git; rm -rf /",)), "is not a Debian package name"),
    (BuildInputs(extra_packages=("",)), "is not a Debian package name"),
    (BuildInputs(extra_packages=("-oDPkg::Pre-Invoke::=touch",)), "is not a Debian package name"),  # an apt option
    (BuildInputs(extra_packages=("curl\u0662",)), "is not a Debian package name"),
    (BuildInputs(extra_ca_files=(Path("/nonexistent.crt"),)), "extra CA certificate /nonexistent.crt"),
])
def test_bad_inputs_are_refused(inputs: BuildInputs, words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        bottle_spec(inputs)


def test_a_file_that_is_not_pem_is_refused(tmp_path: Path) -> None:
    bogus = tmp_path / "ca.der"
    bogus.write_bytes(b"\\x30\\x82")
    with pytest.raises(ConfigError, match="not a PEM certificate"):
        bottle_spec(BuildInputs(extra_ca_files=(bogus,)))


def test_host_ca_files_are_the_pem_certificates_an_administrator_added(tmp_path: Path) -> None:
    local, anchors = tmp_path / "local", tmp_path / "anchors"
    (local / "corp").mkdir(parents=True)
    anchors.mkdir()
    (local / "corp" / "proxy.crt").write_bytes(PEM)
    (anchors / "other.pem").write_bytes(PEM)
    (anchors / "binary.crt").write_bytes(b"\x30\x82\x01\x0a")  # DER: update-ca-certificates cannot use it
    (local / "README").write_bytes(PEM)
    found = host_ca_files((str(local), str(anchors), str(tmp_path / "missing")))
    assert found == (local / "corp" / "proxy.crt", anchors / "other.pem")


def test_build_inputs_trust_the_host_cas_unless_told_not_to(tmp_path: Path) -> None:
    (tmp_path / "proxy.crt").write_bytes(PEM)
    listed = tmp_path / "listed.pem"
    listed.write_bytes(PEM)
    dirs = (str(tmp_path),)
    both = build_inputs(AgentConfig(extra_ca_certificates=(listed,)), {}, dirs).extra_ca_files
    assert both == (listed, tmp_path / "proxy.crt")  # listed.pem is in the host folder and listed: once
    assert build_inputs(AgentConfig(), {HOST_CA_VARIABLE: "0"}, dirs).extra_ca_files == ()
    with pytest.raises(ConfigError, match=r"CLAUDE_BOTTLE_HOST_CA_CERTS='maybe'"):
        build_inputs(AgentConfig(), {HOST_CA_VARIABLE: "maybe"}, dirs)


@pytest.mark.parametrize("said", [
    "npm error code SELF_SIGNED_CERT_IN_CHAIN\nnpm error request to https://registry.npmjs.org/x failed, reason: "
    "self-signed certificate in certificate chain",
    "curl: (60) SSL certificate problem: unable to get local issuer certificate",
    "ssl.SSLCertVerificationError: [SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed",
    "Certificate verification failed: The certificate is NOT trusted.",
])
def test_a_certificate_failure_names_the_step_and_the_ca_settings(said: str) -> None:
    error = build_failure("bottle", "step 5/12 (RUN npm install)", "The command returned a non-zero code: 1",
                          ["Step 5/12 : RUN npm install", *said.splitlines()])
    text = str(error)
    assert text.startswith("building the bottle image failed at step 5/12 (RUN npm install): The command")
    assert "CLAUDE_BOTTLE_EXTRA_CA_CERTS" in text and "/usr/local/share/ca-certificates" in text
    assert said.splitlines()[-1] in text


def test_other_failures_say_to_read_the_output_or_check_the_network() -> None:
    plain = str(build_failure("gate", "step 2/9 (RUN false)", "returned 1", ["Step 2/9 : RUN false"]))
    assert "CLAUDE_BOTTLE_EXTRA_CA_CERTS" not in plain and "the output above shows why" in plain
    offline = str(build_failure("gate", "", "returned 100", ["Temporary failure resolving 'deb.debian.org'"]))
    assert "could not reach a package registry" in offline


def test_a_release_is_its_own_version_and_latest_needs_npm(monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_claude_version("2.1.126") == "2.1.126"
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(DockerError, match="npm is not installed"):
        resolve_claude_version(LATEST)


def test_latest_is_what_npm_view_says(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    npm = tmp_path / "npm"
    npm.write_text('#!/bin/sh\n[ "$*" = "view @anthropic-ai/claude-code version" ] && [ -s "$NODE_EXTRA_CA_CERTS" ] '
                   '&& echo 2.1.999\n')
    npm.chmod(0o755)
    ca = tmp_path / "corp.pem"
    ca.write_bytes(PEM)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert resolve_claude_version(LATEST, (ca,)) == "2.1.999"
    workspace = tmp_path / "workspace"  # where the user starts a run, with a .npmrc a bottle wrote
    workspace.mkdir()
    (workspace / ".npmrc").write_text("registry=http://collector.example/data/\n")
    monkeypatch.chdir(workspace)
    npm.write_text('#!/bin/sh\n[ -e .npmrc ] && echo 0.0.1 || echo 2.1.998\n')  # npm reads the .npmrc it runs by
    assert resolve_claude_version(LATEST) == "2.1.998", "npm ran in the workspace"
    npm.write_text("#!/bin/sh\necho 'npm error self-signed certificate in certificate chain' >&2; exit 1\n")
    with pytest.raises(DockerError, match=r"self-signed certificate.*CLAUDE_BOTTLE_EXTRA_CA_CERTS"):
        resolve_claude_version(LATEST)
