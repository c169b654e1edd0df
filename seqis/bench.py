"""Benchmarks that print ratios, not timed tests: `python -m seqis.bench [--device cuda] [--quick]`.

Each section prints a table of medians and a ratio to a floor measured in the same run, so the numbers
mean something on a busy machine too. Sections: estimators (each alone, and all through run_many),
diagnostics, then any section added to SECTIONS below (the lab, an Explore rerun).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from .diagnostics import diagnostics
from .estimators import ESTIMATORS, SEED_ESTIMATORS
from .metrics import run, run_many
from .types import Batch


def median_time(fn: Callable[[], object], *, repeats: int = 7, warmup: int = 2, device=None) -> float:
    """Median wall time of fn() in seconds (synchronising CUDA around each call)."""
    sync = torch.cuda.synchronize if device is not None and torch.device(device).type == "cuda" else (lambda: None)
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def ragged_batch(B: int, T: int, *, device="cpu", seed: int = 0, s: float = 0.05) -> Batch:
    """A B x T fp32 batch with ragged lengths (uniform in [T/8, T]), valid-IS noise of scale s and
    -inf padding; trainer_logprobs requires grad."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(T // 8, T + 1, (B,), generator=g)  # (B,)
    mask = torch.arange(T)[None, :] < lengths[:, None]  # (B, T)
    inference = -torch.rand(B, T, generator=g).pow(4) * 4  # (B, T) mostly near 0
    noise = torch.randn(B, T, generator=g) * s - s * s / 2
    trainer = torch.where(mask, inference + noise, torch.tensor(-torch.inf))
    adv = torch.randn(B, generator=g)
    return Batch(trainer.to(device).requires_grad_(), inference.to(device), adv.to(device), mask.to(device))


def floor_pass(batch: Batch) -> torch.Tensor:
    """The floor: one masked elementwise pass over the same inputs."""
    t, i = batch.trainer_logprobs.detach(), batch.inference_logprobs
    return torch.where(batch.loss_mask, t - i, 0).sum(-1)


def _step(name: str, batch: Batch):
    out = run(name, batch)
    (grad,) = torch.autograd.grad(out.loss, batch.trainer_logprobs)
    return out.scalars(), grad


def _step_many(names, batch: Batch):
    outs = run_many(names, batch)
    grads = [torch.autograd.grad(o.loss, batch.trainer_logprobs) for o in outs.values()]
    return [o.scalars() for o in outs.values()], grads


def bench_estimators(device: str, quick: bool) -> None:
    B, T = (64, 1024) if quick else (256, 4096)
    batch = ragged_batch(B, T, device=device)
    floor = median_time(lambda: floor_pass(batch), device=device)
    print(f"\n## Estimators: forward + backward + metrics, {B} x {T} fp32, ragged, {device}")
    print(f"floor (torch.where(mask, t - i, 0).sum(-1)): {floor * 1e3:.2f} ms\n")
    print("| estimator | median ms | x floor |")
    print("|---|---:|---:|")
    times = {}
    for name in ESTIMATORS:
        times[name] = median_time(lambda n=name: _step(n, batch), device=device)
        seed = " (seed)" if name in SEED_ESTIMATORS else ""
        print(f"| {name}{seed} | {times[name] * 1e3:.1f} | {times[name] / floor:.1f} |")
    all_names = list(ESTIMATORS)
    t_all = median_time(lambda: _step_many(all_names, batch), device=device)
    slowest = max(times.values())
    print(f"| all {len(all_names)} through run_many | {t_all * 1e3:.1f} | {t_all / floor:.1f} |")
    print(f"\nall {len(all_names)} together / slowest single ({max(times, key=times.get)}): {t_all / slowest:.2f}x")
    seed4 = list(SEED_ESTIMATORS)
    t4 = median_time(lambda: _step_many(seed4, batch), device=device)
    print(f"four seed estimators through run_many: {t4 * 1e3:.1f} ms ({t4 / floor:.1f}x floor)")
    t_diag = median_time(lambda: diagnostics(batch), device=device)
    print(f"diagnostics(batch): {t_diag * 1e3:.1f} ms ({t_diag / floor:.1f}x floor)")


def bench_large_gpu(device: str, quick: bool) -> None:
    """A 1e8-token batch on CUDA: the four seed estimators and diagnostics."""
    if torch.device(device).type != "cuda":
        return
    B, T = 12_208, 8_192  # 1.0e8 positions
    batch = ragged_batch(B, T, device=device)
    floor = median_time(lambda: floor_pass(batch), device=device, repeats=5)
    t4 = median_time(lambda: _step_many(list(SEED_ESTIMATORS), batch), device=device, repeats=5)
    t_diag = median_time(lambda: diagnostics(batch), device=device, repeats=3)
    print(f"\n## 1e8 positions on {torch.cuda.get_device_name()}: {B} x {T}")
    print(f"floor {floor * 1e3:.1f} ms; four seed estimators (fwd+bwd+metrics) {t4 * 1e3:.1f} ms "
          f"({t4 / floor:.1f}x floor); diagnostics {t_diag * 1e3:.1f} ms")


# (name, function(device, quick)); sections print their own tables
SECTIONS: list[tuple[str, Callable[[str, bool], None]]] = [
    ("estimators", bench_estimators),
    ("large-gpu", bench_large_gpu),
]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke run")
    ap.add_argument("--only", nargs="*", help=f"sections to run, from {[n for n, _ in SECTIONS]}")
    args = ap.parse_args(argv)
    print(f"# seqis benchmark: torch {torch.__version__}, {torch.get_num_threads()} CPU threads, device {args.device}")
    for name, fn in SECTIONS:
        if not args.only or name in args.only:
            fn(args.device, args.quick)


if __name__ == "__main__":
    main()
