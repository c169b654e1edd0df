"""What every benchmark section shares: medians, paired timing against a floor, and the benchmark batch."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from ..core.types import Batch
from ..registry import run, run_many


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


def with_catastrophic_tokens(batch: Batch, every: int) -> Batch:
    """The batch with one token of every `every`-th rollout given ratio e^3 (outside any sane token band)."""
    trainer = batch.trainer_logprobs.detach().clone()
    trainer[::every, 0] = batch.inference_logprobs[::every, 0] + 3.0
    return Batch(trainer.requires_grad_(), batch.inference_logprobs, batch.advantages, batch.loss_mask)


def floor_pass(batch: Batch) -> torch.Tensor:
    """The floor: one masked elementwise pass over the same inputs."""
    t, i = batch.trainer_logprobs.detach(), batch.inference_logprobs
    return torch.where(batch.loss_mask, t - i, 0).sum(-1)


def gradient_writes(batch: Batch, n: int) -> Callable[[], object]:
    """n fresh (B, T) float32 tensors written once and kept until the call returns: the gradients' floor."""
    coef, mask_f = batch.advantages.float(), batch.loss_mask.float()
    return lambda: [coef[:, None] * mask_f for _ in range(n)]


def step(name: str, batch: Batch):
    out = run(name, batch)
    (grad,) = torch.autograd.grad(out.loss, batch.trainer_logprobs)
    return out.scalars(), grad


def step_many(names, batch: Batch):
    outs = run_many(names, batch)
    grads = [torch.autograd.grad(o.loss, batch.trainer_logprobs) for o in outs.values()]
    return [o.scalars() for o in outs.values()], grads


def paired(fn: Callable[[], object], floor_fn: Callable[[], object], *, rounds: int = 7, device=None):
    """fn and the floor timed in alternating blocks (each a warm-up call and a median of three), so a busy
    machine slows both alike and each is timed in its steady state. Returns (median fn seconds, median
    floor seconds, median of the per-block ratios): the ratio pairs each fn block with its own floor."""
    t_fn, t_floor = [], []
    for _ in range(rounds):
        t_floor.append(median_time(floor_fn, repeats=3, warmup=1, device=device))
        t_fn.append(median_time(fn, repeats=3, warmup=1, device=device))
    ratio = statistics.median(a / b for a, b in zip(t_fn, t_floor))
    return statistics.median(t_fn), statistics.median(t_floor), ratio


