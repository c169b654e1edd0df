"""The rejection rules of a Composition on one batch: each statistic, its per-rollout aggregates and row extremes
(made once per batch and shared by every correction of a run_many), the rollouts a rule rejects (folded into
one gate) and the tokens a token rule keeps. evaluate.py puts them together with the weight."""

from __future__ import annotations

import math
from functools import partial

import torch

from ._common import Ratios
from ._kernels import (
    any_per_row,
    as_float,
    band_f,
    exp_,
    exp_of,
    in_band,
    log_of,
    outside_band,
    row_extremes,
    rows_into,
    rows_outside,
)
from .compose import Criterion

_SIGN = {"positive": torch.gt, "negative": torch.lt, "non-negative": torch.ge, "non-positive": torch.le}


def criteria(r: Ratios, rules: tuple[Criterion, ...]):
    """(gate, token rules, tripped): the rollout-level verdicts folded into one (B,) gate (valid rollouts only;
    None without any), the token-level ones as (criterion, advantage condition) pairs whose keep masks
    evaluate.py builds, and the (B, T) tokens each rule finds outside its band, as tensors or functions that
    build them (the "token_masked" mask; for max / min: the tokens that trip it). A rollout-level rule
    conditioned on per-token advantages drops tokens, so it is a token rule."""
    gate, token_rules, tripped, every_token = None, [], [], []
    for c in rules:
        cond = None if c.advantage is None else _SIGN[c.advantage](r.advantages, 0)  # (B,) or (B, T)
        if c.agg == "token" or (cond is not None and cond.dim() == 2):
            token_rules.append((c, cond))  # (its "token_masked" tokens: added with its keep mask)
        elif c.statistic == "ratio" and cond is None and ((c.agg == "max" and c.low is None)
                                                          or (c.agg == "min" and c.high is None)):
            every_token.append(c)  # every token's ratio below hi / above lo: one band, below
        else:
            fail = rollout_fails(r, c)  # (B,)
            if cond is not None:
                fail &= cond
            gate = ~fail if gate is None else gate & ~fail
            if c.agg in ("max", "min"):
                tripped.append(partial(outside, r, c))
    if every_token:  # max_t rho_t <= hi and min_t rho_t >= lo: a rollout with any token outside [lo, hi] goes
        lo = max([c.low for c in every_token if c.low is not None], default=0.0)
        hi = min([c.high for c in every_token if c.high is not None], default=math.inf)
        if r.shortcuts and log_of(lo) <= 0 <= log_of(hi):  # padding's l = 0 is inside: the row extremes answer,
            fail = rows_outside(*extremes((r, "ratio", r.log_ratio)), log_of(lo), log_of(hi))  # and the mask
            rows = fail.nonzero().squeeze(1)  # keeps only the failing rows' tokens (it holds no Ratios)
            l_rows = r.log_ratio.index_select(0, rows)
            out = partial(rows_into, r.mask.shape, rows, outside_band(r.mask.index_select(0, rows), l_rows, lo, hi))
        else:
            out = outside_band(r.mask, r.log_ratio, lo, hi)  # (B, T), kept as the mask (it holds no Ratios)
            fail = any_per_row(out)
        gate = ~fail if gate is None else gate & ~fail
        tripped.append(out)
    if gate is not None:
        gate &= r.valid
    return gate, token_rules, tripped


def edges(c: Criterion) -> tuple[float, float]:
    """The band's edges, open sides as 0 (a ratio) or -inf, and inf."""
    return (c.low if c.low is not None else (0.0 if c.statistic == "ratio" else -math.inf),
            c.high if c.high is not None else math.inf)


def statistic(r: Ratios, name: str) -> torch.Tensor:
    """(B, T) the per-token statistic, 0 off the loss mask: log rho for "ratio" (its bands compare in log
    space), k1 = -l, k2 = l^2 / 2, k3 = rho - 1 - l, or prob_diff = pi_t - mu_t (from the unclamped log-probs).
    Shared, not to be written to."""
    if name == "ratio":
        return r.log_ratio
    if name == "k1":
        return r.memo("k1", lambda: r.log_ratio.neg())
    if name == "k2":
        return r.memo("k2", lambda: r.log_ratio.square().mul_(0.5))
    if name == "k3":
        return r.k3
    return r.memo("prob_diff", lambda: exp_of(r.logp).sub_(exp_(r.logp - r.unclamped_log_ratio)))


def aggregate(r: Ratios, name: str, agg: str) -> torch.Tensor:
    """(B,) the statistic's sum, mean, max or min over each rollout's loss tokens (computed once per batch)."""
    def compute():
        if name == "k1" and agg in ("sum", "mean"):  # -S_j, -S_j / T_j: no (B, T) pass
            return (r.seq_log_ratio if agg == "sum" else r.geo_log_ratio).neg()
        if name == "k3" and agg in ("sum", "mean"):
            return r.k3_rollout if agg == "sum" else r.k3_rollout / r.length.clamp(min=1)
        x = statistic(r, name)  # (B, T), 0 off the mask
        if x.shape[-1] == 0:
            return x.sum(-1)
        if agg in ("sum", "mean"):
            total = x.sum(-1)
            return total if agg == "sum" else total / r.length.clamp(min=1)
        if agg == "max" and name in ("k2", "k3"):  # >= 0: the zeros off the mask change no row's max
            return x.amax(-1)
        x = x.masked_fill(~r.mask, -math.inf if agg == "max" else math.inf)
        return x.amax(-1) if agg == "max" else x.amin(-1)

    return r.memo(("aggregate", name, agg), compute)


def outside(r: Ratios, c: Criterion) -> torch.Tensor:
    """(B, T) bool: the loss tokens whose own statistic lies outside the band (built when a mask is read)."""
    lo, hi = edges(c)
    if c.statistic == "ratio":
        return outside_band(r.mask, r.log_ratio, lo, hi)
    x = statistic(r, c.statistic)
    return r.mask & ((x < lo) | (x > hi))


def rollout_fails(r: Ratios, c: Criterion) -> torch.Tensor:
    """(B,) bool: the rollouts whose aggregated statistic lies outside the band."""
    lo, hi = edges(c)
    if c.statistic == "ratio" and c.agg in ("mean", "sum"):  # the geometric or product ratio, edges tolerant
        x, tol = (r.geo_log_ratio, r.edge_tolerance) if c.agg == "mean" else (r.seq_log_ratio,
                                                                              r.edge_tolerance * r.length)
        return ~in_band(x, lo, hi, tol)
    x = aggregate(r, c.statistic, c.agg)  # (B,)
    if c.statistic == "ratio":
        return ~in_band(x, lo, hi)
    return (x < lo) | (x > hi)


def keep_of(r: Ratios, c: Criterion, cond: torch.Tensor | None) -> torch.Tensor:
    """(B, T) 0/1 floats: the loss tokens a token rule keeps (a rollout rule under per-token advantages: all
    but the failing rollouts' tokens of the advantage's sign)."""
    if c.agg == "token":
        lo, hi = edges(c)
        x = statistic(r, c.statistic)
        keep = band_f(x, lo, hi) if c.statistic == "ratio" else x.clamp(lo, hi).eq_(x)  # (B, T) 1.0 in band
    else:
        keep = as_float(~rollout_fails(r, c), r.dtype)[:, None]  # (B, 1)
    if cond is not None:  # the rule drops only where A has the sign: every other token is kept
        exempt = as_float(~cond, r.dtype)
        exempt = exempt if exempt.dim() == 2 else exempt[:, None]
        if keep.shape == torch.broadcast_shapes(keep.shape, exempt.shape):  # in place on its own (B, T) keep
            keep = torch.maximum(keep, exempt, out=keep)
        else:
            keep = torch.maximum(keep, exempt)
    return keep.mul_(r.mask_f) if keep.shape == r.mask_f.shape else keep * r.mask_f


Shared = tuple[Ratios, object, torch.Tensor]  # a (B, T) tensor shared per batch: (its owner, its key, itself)


def extremes(shared: Shared) -> tuple[torch.Tensor, torch.Tensor]:
    """(B,) row maxima and minima of a shared (B, T) tensor, made once per batch."""
    owner, key, x = shared
    return owner.memo(("extremes", key), lambda: row_extremes(x))


def token_keep(rules, band) -> torch.Tensor | None:
    """(B, T) 0/1: the loss tokens every token rule (and the weight's band) keeps; None without any."""
    keeps = [band] if band is not None else []
    keeps += [keep_of(rc, c, cond) for rc, c, cond in rules]
    if not keeps:
        return None
    keep = keeps[0]
    for k in keeps[1:]:
        keep.mul_(k)
    return keep


def rows_outside_band(shape, rows: torch.Tensor, sub: Ratios, c: Criterion) -> torch.Tensor:
    """(B, T) bool: the loss tokens outside the rule's band, found in the given rows (`sub` holds them)."""
    return rows_into(shape, rows, outside(sub, c))
