"""The gate process raises its own limit on open files: each connection and tunnel holds descriptors."""

from __future__ import annotations

import subprocess
import sys


def test_the_gate_raises_its_open_files_limit_to_the_hard_limit() -> None:
    script = (
        "import resource\n"
        "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, hard), hard))\n"
        "from claude_bottle.gate.server import raise_open_files_limit\n"
        "print(raise_open_files_limit(), resource.getrlimit(resource.RLIMIT_NOFILE)[0], hard)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30, check=True)
    returned, soft, hard = map(int, result.stdout.split())
    assert returned == soft == hard
