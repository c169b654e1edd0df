"""Section `lab`: the Monte Carlo lab's throughput against drawing the same random numbers."""

from __future__ import annotations

import math

import torch

from ..estimators import ESTIMATORS
from ..lab import BitChain, monte_carlo_many
from .timing import paired

ORDER = 30


def run(device: str, quick: bool) -> None:
    """The lab: three estimators x 400 batches x 256 rollouts x H = 64 on the bit chain, through
    lab.monte_carlo_many (one draw, shared log-ratios), as rollouts per second and a ratio to merely drawing
    the same random numbers. Always on the CPU (target: <= 3 s on 2 cores); on CUDA also 100x larger."""
    chain = BitChain(64, 40, 0.6, 0.55)
    names = ["seq_is", ("token_tis", ESTIMATORS["token_tis"].config(token_clip=math.inf)), "seq_tis"]
    B, H = 256, 64
    runs = [("cpu", 40 if quick else 400, 64 << 20)]
    if torch.device(device).type == "cuda":
        runs += [(device, 400, 1 << 30), (device, 4_000 if quick else 40_000, 4 << 30)]
    print(f"\n## Lab: {len(names)} estimators (seq_is, token IS, seq_tis) on BitChain(H={H}), batches of {B}")
    print("floor: torch.rand of the same rollouts' uniforms (float64), measured alternately\n")
    print("| device | batches | rollouts | seconds | rollouts/s | RNG ms | x RNG |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for dev, n_batches, budget in runs:
        N = n_batches * B
        gen = torch.Generator(device=dev).manual_seed(0)
        draw = lambda N=N, dev=dev, gen=gen: torch.rand(N, H, generator=gen, device=dev, dtype=torch.float64)
        mc = lambda n_batches=n_batches, dev=dev, budget=budget: monte_carlo_many(
            chain, names, batch_size=B, n_batches=n_batches, seed=0, device=dev, memory_budget=budget)
        t, f, x = paired(mc, draw, rounds=3 if n_batches > 400 else 5, device=dev)
        print(f"| {dev} | {n_batches:,} | {N:,} | {t:.3f} | {N / t:,.0f} | {f * 1e3:.2f} | {x:.1f} |")
