"""The command line loads what a command needs and no more: help imports neither the Docker SDK, nor
cryptography, nor keyring (start-up time), and the gate runs without the Docker SDK (its image has none)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

# Runs the CLI as `claude-bottle ARGS` would (after "--serve-nothing", with the gate's serving replaced by a
# line saying it was reached), then prints the heavy packages imported.
PROBE = """
import sys
from claude_bottle.cli import cli

args = sys.argv[1:]
if args[0] == "--serve-nothing":
    from claude_bottle.gate import server

    async def serve_nothing(*args, **kwargs):
        print("serving")

    server.run = serve_nothing
    args = args[1:]
try:
    cli.main(args, prog_name="claude-bottle")
except SystemExit:
    pass
print("imported:", *sorted({name.split(".")[0] for name in sys.modules} & {"docker", "cryptography", "keyring"}))
"""


def run_probe(*args: str) -> list[str]:
    """The lines the probe printed after running the CLI with ``args`` in a fresh interpreter."""
    result = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


@pytest.mark.parametrize("args", [
    ("--help",), ("--version",), ("start", "--help"), ("run", "--help"), ("logs", "--help"), ("allow", "--help"),
    ("policy", "suggest", "--help"), ("exec", "--help"), ("verify", "--help"), ("doctor", "--help"),
    ("gate", "--help"), ("stub-upstream", "--help"), ("login", "--help"),
])
def test_help_imports_no_heavy_package(args: tuple[str, ...]) -> None:
    assert run_probe(*args)[-1] == "imported:"


def test_the_gate_runs_without_the_docker_sdk(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("sk-ant-oat01-" + "a" * 80 + "AA")
    token.chmod(0o600)
    lines = run_probe("--serve-nothing", "gate", "--api-listen", "127.0.0.1:0", "--proxy-listen", "127.0.0.1:0",
                      "--token-file", str(token))
    assert "serving" in lines, lines
    assert lines[-1] == "imported: cryptography", "the gate's CA needs cryptography, and nothing needs docker"
