"""Vectorised Monte Carlo on a toy: each estimator's gradient over many seeded batches against the exact gradient."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from ..core.ratios import Ratios
from ..core.types import Config
from ..registry import resolve_config, run_many
from .chain import Rollouts

AGG = "seq-mean-token-sum"  # sum over a rollout's tokens, mean over rollouts: the unbiased policy gradient
DEFAULT_BUDGET = {False: 64 << 20, True: 2 << 30}  # bytes per chunk of rollouts: CPU (cache-friendly), CUDA
Progress = Callable[[float, str], None]
# ---------------------------------------------------------------------------------------------------------
# the gradient of an estimator's loss, per rollout


def _pairs(estimators, cfg: Config | None = None) -> list[tuple[str, Config]]:
    """Names, (name, cfg) pairs or a {name: cfg} dict -> validated (name, cfg) pairs."""
    if isinstance(estimators, str):
        estimators = [(estimators, cfg)]
    items = estimators.items() if isinstance(estimators, dict) else estimators
    pairs = [(e, None) if isinstance(e, str) else tuple(e) for e in items]
    return [(name, resolve_config(name, c)) for name, c in pairs]


def _contributions(chain, rollouts: Rollouts, pairs, baseline_group: int | None):
    """For each estimator, the (n, D) per-rollout gradient estimates: minus d loss / d theta of the
    estimator's seq-mean-token-sum loss, times n (so a batch's estimate is the mean of its rows).

    The loss goes through `run_many` and autograd gives d loss / d trainer_logprobs (n, T); the chain's
    score maps it to theta. One Ratios serves every estimator."""
    batch = rollouts.to_batch(baseline_group=baseline_group, requires_grad=True)
    logp, n = batch.trainer_logprobs, len(rollouts)
    ratios = Ratios.of(batch)
    for name, cfg in pairs:
        out = run_many([(name, cfg)], batch, agg=AGG, ratios=ratios)[name]
        (dlogp,) = torch.autograd.grad(out.loss, logp, allow_unused=True)
        dlogp = torch.zeros_like(logp) if dlogp is None else dlogp  # (n, T) = -weights * adv_tau * A / n
        yield name, cfg, out, chain.score_vjp(rollouts.tokens, -n * dlogp)  # (n, D)


def expected_gradient(chain, name: str, cfg: Config | None = None) -> torch.Tensor:
    """(D,) float64: the exact expectation under mu of the estimator's single-rollout gradient estimate (no
    baseline), summing over every sequence weighted by mu (chains with `enumerate`, e.g. TabularAR or a
    BitChain with H <= 20). Compare with `true_gradient()` for the exact bias."""
    rollouts, prob_mu = chain.enumerate()
    (_, _, _, c), = _contributions(chain, rollouts, _pairs(name, cfg), None)
    return (prob_mu[:, None] * c).sum(0)


# ---------------------------------------------------------------------------------------------------------
# Monte Carlo


@dataclass(eq=False)
class MCResult:
    """What `monte_carlo` returns (tensors are float64 on the CPU).

    mean          (D,) mean gradient estimate over batches;  true: (D,) the exact gradient
    stderr        (D,) standard error of `mean`, per parameter
    bias2         ||mean - true||^2 (it includes a noise floor of variance / n_batches)
    variance      mean over batches of ||g_b - mean||^2;  mse: mean of ||g_b - true||^2 = bias2 + variance
    stderr_bias2 / stderr_variance / stderr_mse   their standard errors (delta method / over batches)
    batch_errors  (n_batches,) ||g_b - true||^2;  batch_norms: (n_batches,) ||g_b||  (numpy, for plots)
    grads         (n_batches, D) every g_b, kept when n_batches * D <= 2^22 (else None)
    metrics       the estimator's metrics (is_masked, is_clipped, ...) averaged over every rollout
    seconds       wall time of the whole run (shared by the estimators of one monte_carlo_many call)
    """

    estimator: str
    config: Config
    mean: torch.Tensor
    true: torch.Tensor
    stderr: torch.Tensor
    bias2: float
    variance: float
    mse: float
    stderr_bias2: float
    stderr_variance: float
    stderr_mse: float
    batch_errors: np.ndarray
    batch_norms: np.ndarray
    batch_size: int
    n_batches: int
    baseline: bool
    seconds: float
    metrics: dict[str, float] = field(default_factory=dict)
    grads: torch.Tensor | None = None

    @property
    def noise_floor(self) -> float:
        """variance / n_batches: the expected bias2 of an unbiased estimator."""
        return self.variance / self.n_batches

    @property
    def relative_bias(self) -> float:
        """||mean - true|| / ||true||."""
        return math.sqrt(self.bias2) / max(float(self.true.norm()), 1e-300)

    @property
    def cosine(self) -> float:
        """Cosine between the mean estimate and the true gradient."""
        return float(F.cosine_similarity(self.mean, self.true, dim=0, eps=1e-300))

    def record(self) -> dict:
        """One flat row for a DataFrame."""
        return {
            "estimator": self.estimator,
            "batch_size": self.batch_size,
            "n_batches": self.n_batches,
            "baseline": self.baseline,
            "bias2": self.bias2,
            "variance": self.variance,
            "mse": self.mse,
            "stderr_bias2": self.stderr_bias2,
            "stderr_variance": self.stderr_variance,
            "stderr_mse": self.stderr_mse,
            "noise_floor": self.noise_floor,
            "relative_bias": self.relative_bias,
            "cosine": self.cosine,
            "true_norm": float(self.true.norm()),
            "mean_norm": float(self.mean.norm()),
            "seconds": self.seconds,
            "config": repr(self.config),
            **self.metrics,
        }


_KEEP_GRADS = 1 << 22


class _Stats:
    """Running sums of per-batch estimates g (nb, D): sum, second-moment matrix, per-batch errors."""

    def __init__(self, true: torch.Tensor, device):
        D = true.numel()
        self.true = true.to(device)
        self.n = 0
        self.sum = torch.zeros(D, dtype=torch.float64, device=device)
        self.m2 = torch.zeros(D, D, dtype=torch.float64, device=device)
        self.errors, self.norms, self.grads = [], [], []
        self.metrics: dict[str, float] = {}
        self.rows = 0

    def add(self, g: torch.Tensor, metrics: dict[str, float], rows: int, keep: bool):
        g = g.to(torch.float64)  # (nb, D)
        self.n += g.shape[0]
        self.sum += g.sum(0)
        self.m2 += g.T @ g
        self.errors.append(((g - self.true) ** 2).sum(-1))
        self.norms.append(g.norm(dim=-1))
        if keep:
            self.grads.append(g)
        for k, v in metrics.items():  # rollout-weighted running mean
            self.metrics[k] = self.metrics.get(k, 0.0) + (v - self.metrics.get(k, 0.0)) * rows / (self.rows + rows)
        self.rows += rows

    def result(self, name, cfg, batch_size, baseline, seconds) -> MCResult:
        nb = self.n
        mean = (self.sum / nb).cpu()
        true = self.true.cpu()
        cov = (self.m2.cpu() / nb - torch.outer(mean, mean))  # (D, D) population covariance of g_b
        variance = float(cov.trace().clamp(min=0))
        d = mean - true
        bias2 = float(d @ d)
        errors = torch.cat(self.errors).cpu().numpy()
        ddof = max(nb - 1, 1)
        stderr = (cov.diagonal().clamp(min=0) / ddof).sqrt()
        grads = torch.cat(self.grads).cpu() if self.grads else None
        if grads is not None:
            dev2 = ((grads - mean) ** 2).sum(-1)  # (nb,) ||g_b - mean||^2
            stderr_variance = float(dev2.std() / math.sqrt(nb)) if nb > 1 else math.nan
        else:  # ||g_b - true||^2 spreads like ||g_b - mean||^2 when the bias is small
            stderr_variance = float(errors.std(ddof=1) / math.sqrt(nb)) if nb > 1 else math.nan
        return MCResult(
            estimator=name,
            config=cfg,
            mean=mean,
            true=true,
            stderr=stderr,
            bias2=bias2,
            variance=variance,
            mse=bias2 + variance,
            # ||mean - true||^2 with mean ~ N(true + d, cov / nb): Var = 4 d' cov d / nb + 2 tr(cov^2) / nb^2
            stderr_bias2=math.sqrt(max(4 * float(d @ cov @ d) / ddof + 2 * float((cov * cov).sum()) / ddof**2, 0.0)),
            stderr_variance=stderr_variance,
            stderr_mse=float(errors.std(ddof=1) / math.sqrt(nb)) if nb > 1 else math.nan,
            batch_errors=errors,
            batch_norms=torch.cat(self.norms).cpu().numpy(),
            batch_size=batch_size,
            n_batches=nb,
            baseline=baseline,
            seconds=seconds,
            metrics=dict(self.metrics),
            grads=grads,
        )


def _chunk_rows(chain, unit: int, total: int, memory_budget: int, itemsize: int) -> int:
    """Rollouts per chunk: a multiple of `unit` (whole batches) whose tensors fit the memory budget."""
    per_rollout = itemsize * (40 * chain.horizon + 4 * chain.dim)  # live [n, T] and [n, D] tensors, roughly
    rows = max(unit, memory_budget // per_rollout // unit * unit)
    return min(rows, total)


def _simulate(chain, pairs, *, batch_sizes: Sequence[int], n_rows: int, seed: int, device, dtype,
              baseline: bool, memory_budget: int | None, progress: Progress | None, label: str = "") -> dict:
    """Draw n_rows rollouts from mu in chunks and accumulate, for every estimator and every batch size B,
    the statistics of the per-batch estimates (consecutive groups of B rollouts)."""
    device = torch.device(device) if device is not None else torch.device("cpu")
    unit = math.lcm(*batch_sizes)
    if baseline and len(batch_sizes) > 1:
        raise ValueError("a baseline is per batch: run one batch size at a time")
    true = chain.true_gradient()
    stats = {(i, B): _Stats(true, device) for i in range(len(pairs)) for B in batch_sizes}
    keep = {B: (n_rows // B) * chain.dim <= _KEEP_GRADS for B in batch_sizes}
    gen = torch.Generator(device=device).manual_seed(int(seed))
    if memory_budget is None:
        memory_budget = DEFAULT_BUDGET[device.type == "cuda"]
    rows = _chunk_rows(chain, unit, n_rows, memory_budget, torch.finfo(dtype).bits // 8)
    start, done = time.perf_counter(), 0
    while done < n_rows:
        n = min(rows, n_rows - done)
        rollouts = chain.sample(n, gen, device, dtype)
        contribs = _contributions(chain, rollouts, pairs, batch_sizes[0] if baseline else None)
        for i, (_, _, out, c) in enumerate(contribs):
            metrics = {k: float(v) for k, v in out.metrics.items()}
            for B in batch_sizes:
                g = c.view(n // B, B, -1).mean(1)  # (n / B, D) per-batch estimates
                stats[i, B].add(g, metrics, n, keep[B])
        done += n
        if progress is not None:
            progress(done / n_rows, f"{label}{done:,} / {n_rows:,} rollouts")
    seconds = time.perf_counter() - start
    return {key: s.result(pairs[key[0]][0], pairs[key[0]][1], key[1], baseline, seconds) for key, s in stats.items()}


def _check(batch_size: int, n_batches: int):
    if int(batch_size) < 1 or int(n_batches) < 1:
        raise ValueError(f"batch_size and n_batches must be >= 1, got {batch_size} and {n_batches}")


def monte_carlo_many(chain, estimators, *, batch_size: int, n_batches: int, seed: int = 0, device=None,
                     baseline: bool = False, progress: Progress | None = None, memory_budget: int | None = None,
                     dtype: torch.dtype = torch.float64) -> list[MCResult]:
    """`monte_carlo` for several estimators on the same rollouts (common random numbers: their
    differences are sharper than independent runs'). `estimators`: names, (name, cfg) pairs or a dict."""
    _check(batch_size, n_batches)
    pairs = _pairs(estimators)
    res = _simulate(chain, pairs, batch_sizes=(int(batch_size),), n_rows=int(batch_size) * int(n_batches),
                    seed=seed, device=device, dtype=dtype, baseline=baseline, memory_budget=memory_budget,
                    progress=progress)
    return [res[i, int(batch_size)] for i in range(len(pairs))]


def monte_carlo(chain, name: str, cfg: Config | None = None, *, batch_size: int, n_batches: int, seed: int = 0,
                device=None, baseline: bool = False, progress: Progress | None = None,
                memory_budget: int | None = None, dtype: torch.dtype = torch.float64) -> MCResult:
    """Sample n_batches batches of batch_size rollouts from the chain's mu, estimate the gradient from each
    with estimator `name` (minus the gradient in theta of its seq-mean-token-sum loss, A = reward, or
    reward - batch mean with `baseline=True`, as a GRPO-style baseline does), and compare with the exact
    gradient. Runs on `device` (default CPU; "cuda" when asked), in chunks of whole batches within
    `memory_budget` bytes (default 64 MiB on CPU, 2 GiB on CUDA). The same seed, device and budget give
    the same result (on CPU the budget changes only the rounding).
    `progress(fraction, message)` is called after each chunk."""
    return monte_carlo_many(chain, [(name, cfg)], batch_size=batch_size, n_batches=n_batches, seed=seed,
                            device=device, baseline=baseline, progress=progress, memory_budget=memory_budget,
                            dtype=dtype)[0]


