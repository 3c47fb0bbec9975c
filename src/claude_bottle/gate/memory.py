"""The gate's C allocator, told to keep the memory a large request body used for the next one.

A Messages body is judged whole: its pieces joined into one buffer, then parsed into a value holding its
strings, two allocations of the body's size per request. glibc's malloc serves an allocation that large with
a fresh ``mmap`` (or hands freed heap back to the kernel), so every request touched about 2 x 2,500 new pages
for a 10 MB body, each a page fault and a page zeroed: measured 3 us a page here, some 14 ms of the gate's
30 ms of CPU per 10 MB request, after the body's last byte. With the thresholds raised the buffers come from
the heap and freed ones stay there for the next body: the gate's memory after a large body stays at its
peak (bounded by ``TRIM_THRESHOLD``) instead of falling back to its idle size.
"""

from __future__ import annotations

import ctypes

# glibc's mallopt parameters (malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
# Allocations below this come from the heap: 32 MiB is glibc's largest (and its dynamic threshold's ceiling),
# the size of a Messages body at Anthropic's limit.
MMAP_THRESHOLD = 32 * 1024 * 1024
# Freed memory at the heap's top is given back to the kernel only beyond this: a large body's buffers stay.
TRIM_THRESHOLD = 64 * 1024 * 1024


def keep_large_buffers() -> bool:
    """Raise glibc's mmap and trim thresholds for this process (``MMAP_THRESHOLD``, ``TRIM_THRESHOLD``).
    True when set; False where the C library is not glibc (musl, macOS), which changes nothing else."""
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the process's own symbols: no search for the library at start
    except (OSError, AttributeError, TypeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
