"""What each estimator's gate and clip do as rollouts grow: the simulations behind "Length & thresholds".

Every simulated batch is made of fixed-length rollouts run through `seqis.run_many`, so the points a
chart shows are what the estimators themselves do; `seqis.theory.formulas` gives the closed forms they are
drawn against.

- Valid IS noise: l_t ~ N(-s^2/2, s^2) i.i.d., so E_mu[rho] = 1 and the per-token KL(mu || pi) is s^2/2.
  Then S_j ~ N(-T s^2/2, T s^2): a band on the product ratio exp(S_j) accepts fewer and fewer rollouts
  as T grows, while a band on the geometric ratio exp(S_j / T_j) becomes a sharp per-token KL cutoff.
- A catastrophic token: one token with l = -L (or +L) among on-policy tokens (l = 0). Its geometric
  ratio exp(-L/T) passes a lower bound a iff T >= L / -log a: long rollouts dilute catastrophes, a
  token band or a max criterion catches them at every length.
- Deterministic drift: l_t = log r on every token (Li's illustration; not a valid IS model, since
  E_mu[rho] = r != 1). w = r^T grows without bound while the geometric ratio stays exactly r.

Estimators are given as (label, name, cfg) triples, so one estimator can appear with two configs.
Randomness comes from one explicit torch.Generator seeded per call: same arguments, same numbers.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import pandas as pd
import torch

from ..core.ratios import Ratios
from ..core.types import Batch, Config
from ..evaluators.kernels import in_band
from ..registry import run_many

Estimator = tuple[str, str, Config | None]  # (label, registry name, config or None for defaults)

# the inference log-prob every simulated token gets; only the ratio pi / mu matters to an estimator
_LOG_MU = -1.0


def _generator(seed: int, device: torch.device) -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return g


def _batch(log_ratio: torch.Tensor, loss_mask: torch.Tensor | None = None) -> Batch:
    """A batch whose trainer / inference log-probs differ by `log_ratio` (B, T); advantages 1."""
    inference = torch.full_like(log_ratio, _LOG_MU)  # (B, T)
    adv = torch.ones(log_ratio.shape[0], dtype=log_ratio.dtype, device=log_ratio.device)  # (B,)
    return Batch(inference + log_ratio, inference, adv, loss_mask)


def gaussian_batch(
    n_rollouts: int,
    length: int,
    s: float,
    *,
    generator: torch.Generator | None = None,
    seed: int = 0,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> Batch:
    """n_rollouts rollouts of `length` tokens with valid IS noise l ~ N(-s^2/2, s^2), drawn from
    `generator` (or a fresh one seeded with `seed` on `device`)."""
    if generator is None:
        generator = _generator(seed, torch.device(device) if device is not None else torch.device("cpu"))
    z = torch.randn(n_rollouts, length, generator=generator, device=device, dtype=dtype)  # (B, T)
    return _batch(z * s - s * s / 2)


def _resolve(estimators: Iterable[Estimator | str]) -> list[Estimator]:
    return [(e, e, None) if isinstance(e, str) else tuple(e) for e in estimators]


def _rollout_stats(estimators: list[Estimator], batch: Batch) -> list[dict]:
    """Per estimator: the fraction of rollouts it accepts and the mean / variance of its applied
    sequence weight (0 for a dropped rollout), with standard errors. Shared log-ratios computed once."""
    r = Ratios.of(batch)
    n = batch.shape[0]
    rows = []
    for label, name, cfg in estimators:
        out = run_many([(name, cfg)], batch, ratios=r)[name].rollouts
        acc = out["accepted"].double().mean().item()
        w = out["weight"].double()  # (B,) applied sequence weight
        dev = w - w.mean()  # (B,)
        var = (dev.square().sum() / max(n - 1, 1)).item()
        m4 = dev.pow(4).mean().item()  # the variance's standard error needs the 4th central moment
        rows.append(dict(label=label, estimator=name, accepted=acc, accepted_se=math.sqrt(acc * (1 - acc) / n),
                         weight_mean=w.mean().item(), weight_mean_se=math.sqrt(var / n), weight_var=var,
                         weight_var_se=math.sqrt(max(m4 - var * var, 0.0) / n)))
    return rows


def _band_row(label: str, log_ratio: torch.Tensor, low: float, high: float, tol: torch.Tensor) -> dict:
    """The fraction of rollouts whose log_ratio (B,) lies in [log low, log high], a value within tol (B,) of an
    edge on it (the edges of seqis.run: seqis.estimators.Ratios.edge_tolerance)."""
    n = log_ratio.shape[0]
    acc = in_band(log_ratio, low, high, tol).double().mean().item()
    return dict(label=label, estimator="", accepted=acc, accepted_se=math.sqrt(acc * (1 - acc) / n),
                weight_mean=math.nan, weight_mean_se=math.nan, weight_var=math.nan, weight_var_se=math.nan)


def length_sweep(
    estimators: Iterable[Estimator | str],
    lengths: Sequence[int],
    s: float,
    *,
    n_rollouts: int = 2000,
    seed: int = 0,
    device: torch.device | str | None = None,
    product_band: tuple[float, float] | None = None,
) -> pd.DataFrame:
    """Valid-IS-noise batches of n_rollouts rollouts at each fixed length T, through every estimator.

    One row per (estimator, T): label, estimator, T, s, accepted (fraction of rollouts that keep a
    gradient, rollouts["accepted"]) and accepted_se; weight_mean, weight_var and their standard errors
    (the applied sequence weight, 0 for a dropped rollout: for seq_tis the mean is E[min(w, C)], for
    seq_mis_product the kept mass E[w 1(w <= C)]). `product_band=(a, b)` adds a row "product band" per T: the
    fraction with a <= exp(S_j) <= b (no registry estimator has a two-sided product band).
    """
    device = torch.device(device) if device is not None else torch.device("cpu")
    ests = _resolve(estimators)
    g = _generator(seed, device)
    rows = []
    for T in lengths:  # a handful of lengths; each is one vectorised (n_rollouts, T) batch
        batch = gaussian_batch(n_rollouts, int(T), s, generator=g, device=device)
        stats = _rollout_stats(ests, batch)
        if product_band is not None:
            r = Ratios.of(batch)
            stats.append(_band_row("product band", r.seq_log_ratio, *product_band, r.edge_tolerance * r.length))
        rows += [dict(T=int(T), s=s, **row) for row in stats]
    return pd.DataFrame(rows)


def running_ratios(
    n_rollouts: int,
    lengths: Sequence[int],
    s: float,
    *,
    seed: int = 0,
    device: torch.device | str | None = None,
) -> pd.DataFrame:
    """n_rollouts rollouts of max(lengths) tokens with valid IS noise, read after each prefix length T: how one
    rollout's product ratio and geometric ratio move as it grows. float64.

    One row per (rollout, T): rollout, T, w (the product ratio exp(S_T), S_T the sum of the first T log-ratios)
    and geo (the geometric ratio exp(S_T / T)).
    """
    device = torch.device(device) if device is not None else torch.device("cpu")
    lengths = sorted({int(T) for T in lengths})
    batch = gaussian_batch(n_rollouts, lengths[-1], s, seed=seed, device=device, dtype=torch.float64)
    S = torch.cumsum(batch.trainer_logprobs - batch.inference_logprobs, dim=-1)  # (B, T) running sums
    at = torch.as_tensor(lengths, device=device)  # (L,)
    S_at = S[:, at - 1]  # (B, L)
    rollout = torch.arange(n_rollouts, device=device)[:, None].expand_as(S_at)  # (B, L)
    return pd.DataFrame({"rollout": rollout.flatten().tolist(), "T": at.expand_as(S_at).flatten().tolist(),
                         "w": torch.exp(S_at).flatten().tolist(),
                         "geo": torch.exp(S_at / at.to(S_at.dtype)).flatten().tolist()})


def kl_sweep(
    estimators: Iterable[Estimator | str],
    lengths: Sequence[int],
    kls: Sequence[float],
    *,
    n_rollouts: int = 500,
    seed: int = 0,
    device: torch.device | str | None = None,
) -> pd.DataFrame:
    """Acceptance as a function of the per-token KL(mu || pi) = s^2/2, at several fixed lengths.

    One row per (estimator, T, kl): label, estimator, T, kl, s = sqrt(2 kl), accepted, accepted_se.
    """
    device = torch.device(device) if device is not None else torch.device("cpu")
    ests = _resolve(estimators)
    g = _generator(seed, device)
    rows = []
    for T in lengths:
        for kl in kls:
            s = math.sqrt(2 * kl)
            batch = gaussian_batch(n_rollouts, int(T), s, generator=g, device=device)
            for row in _rollout_stats(ests, batch):
                rows.append(dict(T=int(T), kl=kl, s=s, label=row["label"], estimator=row["estimator"],
                                 accepted=row["accepted"], accepted_se=row["accepted_se"]))
    return pd.DataFrame(rows)


def _prefix_mask(lengths: Sequence[int], device: torch.device) -> torch.Tensor:
    """(B, max T) bool: rollout j's first lengths[j] positions are loss tokens."""
    L = torch.as_tensor(list(lengths), device=device)  # (B,)
    pos = torch.arange(int(L.max()), device=device)  # (T,)
    return pos[None, :] < L[:, None]  # (B, T)


def catastrophic(
    estimators: Iterable[Estimator | str],
    lengths: Sequence[int],
    L: float,
    *,
    device: torch.device | str | None = None,
) -> pd.DataFrame:
    """One catastrophic token (l = -L, "down", or l = +L, "up") at position 0 of an otherwise on-policy
    rollout (l = 0), at each length T. Deterministic: no noise. float32, as a trainer computes it.

    One row per (estimator, direction, T): label, estimator, direction, T, accepted (the rollout keeps a
    gradient), kept (the catastrophic token's gradient survives), weight (the gradient coefficient on
    the catastrophic token), other_weight (on the rollout's other tokens; NaN when T = 1).
    """
    device = torch.device(device) if device is not None else torch.device("cpu")
    ests = _resolve(estimators)
    lengths = [int(T) for T in lengths]
    mask = _prefix_mask(lengths, device)  # (B, T)
    frames = []
    for direction, sign in (("down", -1.0), ("up", 1.0)):
        log_ratio = torch.zeros(mask.shape, device=device)  # (B, T) on-policy
        log_ratio[:, 0] = sign * L  # the catastrophic token
        batch = _batch(log_ratio, mask)
        r = Ratios.of(batch)
        for label, name, cfg in ests:
            out = run_many([(name, cfg)], batch, ratios=r)[name]
            w = out.weights  # (B, T)
            other = w[:, 1] if w.shape[1] > 1 else torch.zeros_like(w[:, 0])  # (B,)
            frames.append(pd.DataFrame({
                "label": label, "estimator": name, "direction": direction, "T": lengths,
                "accepted": out.rollouts["accepted"].tolist(),
                "kept": out.masks["kept"][:, 0].tolist(),
                "weight": w[:, 0].tolist(),
                "other_weight": torch.where(mask[:, 1] if w.shape[1] > 1 else torch.zeros_like(mask[:, 0]),
                                            other, torch.full_like(other, math.nan)).tolist(),
            }))
    return pd.concat(frames, ignore_index=True)


def drift(
    estimators: Iterable[Estimator | str],
    lengths: Sequence[int],
    r: float,
    *,
    device: torch.device | str | None = None,
) -> pd.DataFrame:
    """Deterministic drift l_t = log r on every token, at each length T (float64, no noise).

    One row per T: T, w (the product ratio exp(S) = r^T as the estimators compute it), geo (the
    geometric ratio exp(S/T)), and per estimator label two columns: "<label> weight" (applied sequence
    weight) and "<label> accepted".
    """
    device = torch.device(device) if device is not None else torch.device("cpu")
    ests = _resolve(estimators)
    lengths = [int(T) for T in lengths]
    mask = _prefix_mask(lengths, device)  # (B, T)
    batch = _batch(torch.full(mask.shape, math.log(r), dtype=torch.float64, device=device), mask)
    ratios = Ratios.of(batch)
    table = pd.DataFrame({
        "T": lengths,
        "w": torch.exp(ratios.seq_log_ratio).tolist(),
        "geo": torch.exp(ratios.geo_log_ratio).tolist(),
    })
    for label, name, cfg in ests:
        out = run_many([(name, cfg)], batch, ratios=ratios)[name].rollouts
        table[f"{label} weight"] = out["weight"].tolist()
        table[f"{label} accepted"] = out["accepted"].tolist()
    return table


__all__ = ["gaussian_batch", "length_sweep", "running_ratios", "kl_sweep", "catastrophic", "drift"]
