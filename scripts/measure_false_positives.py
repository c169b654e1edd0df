"""How often `diagnose` calls a clean batch bad: the tiny transformer's bf16 (or fp16) sampler with no fault,
over many seeds; prints the count of each (kind, severity) and the false-positive rates.

    .venv/bin/python scripts/measure_false_positives.py --seeds 100 [--dtype bf16] [--n-prompts 16]
"""

from __future__ import annotations

import argparse
import collections
import time

import torch

from seqis import diagnose
from seqis.samplers.scenarios import make_batch


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=100)
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"))
    ap.add_argument("--n-prompts", type=int, default=16)
    args = ap.parse_args()
    torch.set_num_threads(1)
    counts: collections.Counter = collections.Counter()
    bad = warn = 0
    t0 = time.perf_counter()
    for seed in range(args.seeds):
        batch = make_batch("tiny_lm", seed=seed, sampler_dtype=args.dtype, n_prompts=args.n_prompts)
        findings = diagnose(batch)
        counts.update((f.kind, f.severity) for f in findings)
        bad += any(f.severity == "bad" for f in findings)
        warn += any(f.severity == "warn" for f in findings)
    print(f"{args.seeds} clean {args.dtype} batches of {args.n_prompts * 8} rollouts "
          f"({time.perf_counter() - t0:.0f} s)")
    for (kind, severity), n in sorted(counts.items()):
        print(f"  {kind:22s} {severity:5s} {n}")
    print(f"false positives: bad in {bad}/{args.seeds} batches ({bad / args.seeds:.0%}), "
          f"warn or worse in {bad + warn}/{args.seeds}")


if __name__ == "__main__":
    main()
