"""Section `train`: a training run under policy lag (seqis.lab.train) against drawing its random numbers."""

from __future__ import annotations

import math
import time

import torch

from ..estimators import ESTIMATORS
from ..lab import BitChain, train

ORDER = 35


def run(device: str, quick: bool) -> None:
    """2,000 updates of 4 estimators (seq_is, token IS, geo_is, seq_tis) x 8 seeds on BitChain(H = 256,
    k = 154, p = 0.5), B = 64, lag 100, lr 0.3: 32 runs in one vectorised loop, exact J every update (target:
    under 60 s on a CPU). The floor is drawing the same uniforms with torch.rand, update by update (float32,
    one (32, 64, 256) tensor per update). "CPU s" is the process's CPU time (wall time on an idle machine with
    one thread; a busy machine inflates only the wall time). --quick: 200 updates. On CUDA the same run on the
    device too."""
    names = ["seq_is", ("token_tis", ESTIMATORS["token_tis"].config(token_clip=math.inf)), "geo_is", "seq_tis"]
    H, B, seeds, lag = 256, 64, 8, 100
    steps = 200 if quick else 2000
    chain = BitChain(H, 154, 0.5, 0.5)
    print(f"\n## Training: {len(names)} estimators x {seeds} seeds, {steps:,} updates of B = {B} on BitChain(H={H}), "
          f"lag {lag}")
    print("floor: torch.rand of each update's uniforms (float32), the same number of updates\n")
    print("| device | updates | runs | seconds | CPU s | updates/s | floor s | x floor "
          "| final J (seq_is, token IS, geo, seq_tis) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    devices = ["cpu"] + ([device] if torch.device(device).type == "cuda" else [])
    for dev in devices:
        sync = torch.cuda.synchronize if torch.device(dev).type == "cuda" else (lambda: None)
        sync()
        t0, c0 = time.perf_counter(), time.process_time()
        res = train(chain, names, steps=steps, lr=0.3, lag=lag, batch_size=B, seeds=seeds, device=dev)
        sync()
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
        gen = torch.Generator(device=dev).manual_seed(0)
        t0 = time.perf_counter()
        for _ in range(steps):
            torch.rand(len(names) * seeds, B, H, generator=gen, device=dev)
        sync()
        floor = time.perf_counter() - t0
        final = ", ".join(f"{v:.3f}" for v in res.final.mean(1))
        print(f"| {dev} | {steps:,} | {len(names) * seeds} | {seconds:.1f} | {cpu:.1f} | {steps / seconds:,.0f} "
              f"| {floor:.2f} | "
              f"{seconds / floor:.1f} | {final} |")
