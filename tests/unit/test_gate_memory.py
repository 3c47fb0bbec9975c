"""The gate keeps a large body's buffers for the next body (gate/memory.py): no page faulted in afresh."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

# In a process of its own: the thresholds are the process's for its whole life.
PROGRAM = """
import resource, sys
from claude_bottle.gate.memory import keep_large_buffers
assert keep_large_buffers()
faults = []
for _ in range(5):  # as the gate judges 10 MB bodies: pieces joined, then a value as large
    pieces = [bytes(256 * 1024) for _ in range(40)]
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    whole = b"".join(pieces)
    value = whole.decode()
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    del pieces, whole, value
print(faults)
sys.exit(0 if max(faults[1:]) < 500 else 1)  # the first body faults its pages in: 2 x 2,560; glibc alone, every one
"""


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc's mallopt")
def test_a_large_body_s_buffers_are_reused_not_faulted_in_again() -> None:
    done = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"page faults per body: {done.stdout} {done.stderr}"

