"""Image tags follow their inputs: a rebuild happens exactly when something that goes in changed."""

from __future__ import annotations

from pathlib import Path

import pytest

from claude_bottle.errors import ConfigError
from claude_bottle.runtime.images import BuildInputs, bottle_spec, gate_spec

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
    assert {p.split("==")[0] for p in pins} == {"click", "h11", "idna", "publicsuffixlist", "cryptography", "cffi", "pycparser"}
    assert all("==" in p for p in pins)


@pytest.mark.parametrize(("inputs", "words"), [
    (BuildInputs(extra_packages=("git; rm -rf /",)), "is not a Debian package name"),
    (BuildInputs(extra_packages=("",)), "is not a Debian package name"),
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
