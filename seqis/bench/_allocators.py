"""The all-presets run_many row under one allocator setting, in a fresh interpreter:
`python -m seqis.bench._allocators SLOWEST [--kept] [--quick] [--device D]` prints one JSON line.

Both settings are read once per process: torch's transparent huge pages for CPU tensors (the environment
variable THP_MEM_ALLOC_ENABLE=1, read by c10 when it first allocates; the kernel must allow madvise) and glibc's
freed memory kept (seqis.allocator, which cannot be undone), so each setting gets its own interpreter. The line
holds, timed in alternating blocks against the slowest single correction SLOWEST (a key the parent picked):
"run_many", all 12 estimators and every preset through one run_many with a backward each; "writes", the same
number of (B, T) float32 gradients written alone into fresh memory and kept (what any backward per output must
do); each as (median seconds, median of the per-block ratios).
"""

from __future__ import annotations

import argparse
import json
import os

from ..allocator import keep_freed_memory


def gradient_writes(batch, n: int):
    """n fresh (B, T) float32 tensors written once and kept until the call returns: the gradients' floor."""
    coef, mask_f = batch.advantages.float(), batch.loss_mask.float()
    return lambda: [coef[:, None] * mask_f for _ in range(n)]


def measure(slowest: str, device: str, quick: bool) -> dict[str, tuple[float, float]]:
    from ..estimators import ESTIMATORS
    from ..presets import PRESETS
    from .timing import paired, ragged_batch, step, step_many

    B, T = (64, 1024) if quick else (256, 4096)
    batch = ragged_batch(B, T, device=device)
    every = [*ESTIMATORS, *PRESETS]
    single = lambda: step(slowest, batch)
    out = {}
    for label, fn in (("run_many", lambda: step_many(every, batch)), ("writes", gradient_writes(batch, len(every)))):
        t, _, x = paired(fn, single, device=device)
        out[label] = (t, x)
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m seqis.bench._allocators")
    ap.add_argument("slowest")
    ap.add_argument("--kept", action="store_true", help="keep freed memory (seqis.allocator) first")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args(argv)
    setting = keep_freed_memory() if args.kept else "glibc malloc defaults"
    rows = measure(args.slowest, args.device, args.quick)
    print(json.dumps({"malloc": setting, "thp": os.environ.get("THP_MEM_ALLOC_ENABLE", ""), **rows}))


if __name__ == "__main__":
    main()
