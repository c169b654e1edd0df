"""Peak memory of seqis.io.load_batch on a 512 x 16384 dump, as a multiple of the loaded batch's size.

    .venv/bin/python scripts/measure_load_memory.py [--rollouts 512] [--tokens 16384] [--formats parquet npz]

Writes each dump to a temporary folder (float32 log-probs, a bool mask, per-rollout advantages, every
rollout full length: the worst case, no padding to skip), then loads it in a fresh Python process that
resets its peak resident-set size after the imports (/proc/self/clear_refs), then reads its RSS before
the load and the peak (VmHWM) after it. The ratio printed is
(peak - baseline) / batch bytes, after a warm-up load of a 2-rollout file of the same format (so the
libraries' code pages are not counted); tracemalloc is not used because torch and arrow allocate outside it.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from seqis import Batch
from seqis.io import save_batch

CHILD = r"""
import sys, time
import torch, pyarrow.parquet, numpy, safetensors.torch  # imported before the baseline
from seqis.io import load_batch

def status(key):  # a /proc/self/status entry in bytes (VmRSS: now, VmHWM: the peak since the last reset)
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":"))

load_batch(sys.argv[2])  # warm up: the format's library code is paged in before the baseline
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # reset the peak (VmHWM) to the current RSS, so the imports' peak does not count
base = status("VmRSS")
t = time.perf_counter()
b = load_batch(sys.argv[1], max_bytes=None)
dt = time.perf_counter() - t
peak = status("VmHWM")
size = sum(x.numel() * x.element_size() for x in (b.trainer_logprobs, b.inference_logprobs, b.advantages,
                                                 b.loss_mask))
print(f"{(peak - base) / size:.2f} {size} {peak - base} {dt:.2f}")
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rollouts", type=int, default=512)
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--formats", nargs="+", default=["parquet", "npz", "safetensors"])
    args = ap.parse_args()
    B, T = args.rollouts, args.tokens
    g = torch.Generator().manual_seed(0)
    inference = -torch.rand(B, T, generator=g).pow(8) * 8  # (B, T) float32, LLM-like: mostly near 0
    batch = Batch(inference + 0.01 * torch.randn(B, T, generator=g).clamp(max=0), inference,
                  torch.randn(B, generator=g), torch.ones(B, T, dtype=torch.bool))
    with tempfile.TemporaryDirectory() as d:
        for fmt in args.formats:
            path = Path(d) / f"dump.{fmt}"
            save_batch(batch, path)
            small = Path(d) / f"small.{fmt}"
            save_batch(batch.select(slice(0, 2)), small)
            out = subprocess.run([sys.executable, "-c", CHILD, str(path), str(small)], capture_output=True, text=True,
                                 check=True).stdout.split()
            ratio, size, extra, secs = float(out[0]), int(out[1]), int(out[2]), float(out[3])
            print(f"{fmt:12s} {B} x {T}: file {path.stat().st_size / 2**20:6.1f} MB, batch {size / 2**20:.1f} MB, "
                  f"peak over baseline {extra / 2**20:6.1f} MB = {ratio:.2f}x the batch, load {secs:.2f} s")
            time.sleep(0.1)


if __name__ == "__main__":
    main()
