"""Sweeps of the Monte Carlo over a knob, batch size, horizon or sampler lag: one row per (estimator, x)."""

from __future__ import annotations

import math
from collections.abc import Iterable

import pandas as pd
import torch

from ..core.types import Config
from ..registry import resolve_config
from .chain import BitChain
from .montecarlo import Progress, _check, _pairs, _simulate, monte_carlo_many

# ---------------------------------------------------------------------------------------------------------
# sweeps: one row per (estimator, x)


def _sub(progress: Progress | None, i: int, n: int, what: str) -> Progress | None:
    """A progress callback for step i of n, mapped into [i / n, (i + 1) / n]."""
    if progress is None:
        return None
    return lambda f, msg: progress((i + f) / n, f"{what}: {msg}")


def _frame(rows: list[dict]) -> pd.DataFrame:
    df = pd.DataFrame(rows)
    first = ["estimator", "sweep", "x", "bias2", "variance", "mse", "stderr_bias2", "stderr_variance", "stderr_mse"]
    return df[[c for c in first if c in df] + [c for c in df if c not in first]]


def sweep_knob(chain, name: str, knob: str, values: Iterable[float], cfg: Config | None = None, *,
               progress: Progress | None = None, **mc_kwargs) -> pd.DataFrame:
    """One estimator with one knob set to each value in turn (the other knobs from cfg), all on the same
    rollouts. Columns: estimator, sweep (the knob), x (its value), bias2, variance, mse, stderr_*, ..."""
    base = resolve_config(name, cfg)
    if knob not in base.as_dict():
        raise ValueError(f"{name} has no knob {knob!r}; its knobs: {', '.join(base.as_dict()) or 'none'}")
    values = list(values)
    pairs = [(name, base.replace(**{knob: v})) for v in values]
    results = monte_carlo_many(chain, pairs, progress=_sub(progress, 0, 1, f"{name}.{knob}"), **mc_kwargs)
    return _frame([{**r.record(), "sweep": knob, "x": v} for v, r in zip(values, results, strict=True)])


def sweep_batch_size(chain, estimators, sizes: Iterable[int], *, n_batches: int = 200, seed: int = 0,
                     device=None, baseline: bool = False, progress: Progress | None = None,
                     memory_budget: int | None = None, dtype: torch.dtype = torch.float64) -> pd.DataFrame:
    """MSE against batch size B: n_batches * max(sizes) rollouts (rounded up to whole batches of every
    size) drawn once and regrouped into batches of each size, so every size sees the same rollouts.
    The frontier is MSE(B) = bias^2 + Var(1) / B: a biased estimator plateaus at bias^2, sequence IS
    keeps falling. Column `frontier` is that curve from the smallest size's variance. With a baseline the
    advantages depend on the batch, so each size gets its own rollouts."""
    sizes = sorted({int(b) for b in sizes})
    _check(min(sizes), n_batches)
    pairs = _pairs(estimators)
    kw = dict(seed=seed, device=device, dtype=dtype, baseline=baseline, memory_budget=memory_budget)
    if baseline:
        res = {}
        for j, B in enumerate(sizes):
            part = _simulate(chain, pairs, batch_sizes=(B,), n_rows=B * n_batches,
                             progress=_sub(progress, j, len(sizes), f"B={B}"), **kw)
            res.update(part)
    else:
        unit = math.lcm(*sizes)
        if unit > 1 << 16:
            raise ValueError(f"batch sizes {sizes} have a least common multiple of {unit}: use sizes that divide "
                             "one another (e.g. powers of two)")
        n_rows = -(-n_batches * max(sizes) // unit) * unit
        res = _simulate(chain, pairs, batch_sizes=tuple(sizes), n_rows=n_rows, progress=progress, **kw)
    rows = []
    for i in range(len(pairs)):
        b0 = res[i, sizes[0]]
        for B in sizes:
            r = res[i, B]
            frontier = r.bias2 + b0.variance * b0.batch_size / B
            rows.append({**r.record(), "sweep": "batch_size", "x": B, "frontier": frontier})
    return _frame(rows)


def _sweep_chains(chains: list, xs: list, what: str, estimators, progress, mc_kwargs) -> pd.DataFrame:
    rows = []
    for j, (x, chain) in enumerate(zip(xs, chains, strict=True)):
        results = monte_carlo_many(chain, estimators, progress=_sub(progress, j, len(xs), f"{what}={x}"),
                                   **mc_kwargs)
        rows += [{**r.record(), "sweep": what, "x": x, "chain": repr(chain)} for r in results]
    return _frame(rows)


def sweep_horizon(chain: BitChain, estimators, horizons: Iterable[int], *, progress: Progress | None = None,
                  **mc_kwargs) -> pd.DataFrame:
    """The chain at each horizon (threshold scaled with it, `BitChain.with_horizon`); the estimators share
    rollouts at each horizon. Sequence IS's variance grows like (1 + chi2)^H."""
    horizons = [int(h) for h in horizons]
    return _sweep_chains([chain.with_horizon(h) for h in horizons], horizons, "horizon", estimators, progress,
                         mc_kwargs)


def sweep_lag(chain, estimators, lags: Iterable[int], *, lr: float = 1.0, progress: Progress | None = None,
              **mc_kwargs) -> pd.DataFrame:
    """The chain with its sampler `lag` updates stale (`chain.with_lag(lag, lr)`; lag 0 is on-policy)."""
    lags = [int(k) for k in lags]
    return _sweep_chains([chain.with_lag(k, lr=lr) for k in lags], lags, "lag", estimators, progress, mc_kwargs)
