"""glibc's malloc told to keep freed memory for reuse: an opt-in process setting, measured by the benchmark.

Each estimator allocates a few (B, T) tensors per call. If a freed block goes back to the OS, the next tensor of
that size page-faults in fresh memory. `python -m seqis.bench --only estimators` prints both: on 256 x 4096 on
a 2-core CPU (2026-11-30) a single estimator call is 1.3-1.9x faster with it, run_many of all twelve 1.1x; the
explorer's server work per slider move did not measurably change (the browser's drawing dominates), so neither
the explorer nor `make run` applies it. A trainer can, from Python or from the shell before Python starts:

    export GLIBC_TUNABLES=glibc.malloc.trim_threshold=1073741824:glibc.malloc.mmap_threshold=33554432

torch's own transparent huge pages for CPU tensors (THP_MEM_ALLOC_ENABLE=1) measured slower on this machine, alone
or with this setting (the section's allocator table: all 62 corrections through run_many 9.4x / 8.1x the slowest
single against 7.6x with the defaults and 6.7x with freed memory kept); it is not recommended.
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
