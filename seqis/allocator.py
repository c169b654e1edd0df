"""glibc's malloc told to keep freed memory for reuse: an opt-in process setting for CPU work on large batches.

Each estimator allocates a few (B, T) tensors per call. With glibc's defaults, a freed block above the mmap
threshold (128 KiB, raised dynamically) goes back to the OS and the next tensor of that size page-faults in
fresh memory: on 2-core machines that costs as much as the arithmetic (256 x 4096 fp32: seq_tis about 2.5-3x
slower). A long-running CPU trainer usually has a caching allocator (jemalloc, tcmalloc; torch's own on a GPU);
the explorer applies this at start-up, and a trainer can do the same, or set it for the whole process from the
shell before Python starts:

    export GLIBC_TUNABLES=glibc.malloc.trim_threshold=1073741824:glibc.malloc.mmap_threshold=33554432
"""

from __future__ import annotations

import ctypes
import ctypes.util

TRIM_THRESHOLD = 1 << 30  # keep up to 1 GiB of freed memory at the top of the heap
MMAP_THRESHOLD = 32 << 20  # blocks below 32 MiB come from the heap (and are reused), not from mmap
GLIBC_TUNABLES = f"glibc.malloc.trim_threshold={TRIM_THRESHOLD}:glibc.malloc.mmap_threshold={MMAP_THRESHOLD}"


def keep_freed_memory() -> str:
    """Apply the setting to this process (from now on); returns a line saying what was done."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return "glibc malloc defaults (not glibc)"
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
    if mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) and mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD):
        return "freed memory kept for reuse (mallopt: trim 1 GiB, mmap 32 MiB)"
    return "glibc malloc defaults (mallopt refused)"
