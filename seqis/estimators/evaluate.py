"""What a Composition does to one batch: its weights, kept tokens, rollout gate and own metrics (a Correction).

Read top to bottom it is compose.py's formula: the rollout-level criteria fold into one gate, the token-level
ones into one keep mask; then the IS weight at its level (truncated, masked to a band, self-normalised).
Criteria see the log-ratios clamped to the composition's log_ratio_clamp; the weight clamps its own exponent
after aggregating the raw ones (verl's SAFETY_BOUND, as its code does it). Speed lives in _kernels.py.
"""

from __future__ import annotations

import math
from functools import partial

import torch

from ._common import Correction, Ratios, clipped_metric
from ._kernels import (
    above_on,
    any_per_row,
    as_float,
    band_f,
    band_filter,
    capped_exp,
    exp_of,
    gated,
    in_band,
    log_of,
    outside_band,
    rows_above,
    tokens_of,
)
from .compose import Composition, Criterion, Weight

_SIGN = {"positive": torch.gt, "negative": torch.lt, "non-negative": torch.ge, "non-positive": torch.le}


def correction(r: Ratios, comp: Composition) -> Correction:
    """The composition on the batch of `r` (whose advantages decide any sign-conditioned criterion)."""
    rc = r if comp.log_ratio_clamp is None else r.clamped(comp.log_ratio_clamp)
    gate, rules, tripped = criteria(rc, comp.criteria)
    rules = [(rc, c, cond) for c, cond in rules]
    w = comp.weight
    if w.per_rollout:
        return _rollout_weight(r, w, comp.log_ratio_clamp, gate, rules, tripped)
    return _token_weight(r, w, comp.log_ratio_clamp, gate, rules, tripped)


# ---------------------------------------------------------------------------------------------------------
# criteria: a rollout gate and token rules


def criteria(r: Ratios, rules: tuple[Criterion, ...]):
    """(gate, token rules, tripped): the rollout-level verdicts folded into one (B,) gate (valid rollouts only;
    None without any), the token-level ones as (criterion, advantage condition) pairs whose keep masks
    `_filtered` builds, and the (B, T) tokens each rule finds outside its band, as tensors or functions that
    build them (the "token_masked" mask; for max / min: the tokens that trip it). A rollout-level rule
    conditioned on per-token advantages drops tokens, so it is a token rule."""
    gate, token_rules, tripped, every_token = None, [], [], []
    for c in rules:
        cond = None if c.advantage is None else _SIGN[c.advantage](r.advantages, 0)  # (B,) or (B, T)
        if c.agg == "token" or (cond is not None and cond.dim() == 2):
            token_rules.append((c, cond))
            tripped.append(partial(_outside, r, c))
        elif c.statistic == "ratio" and cond is None and ((c.agg == "max" and c.low is None)
                                                          or (c.agg == "min" and c.high is None)):
            every_token.append(c)  # every token's ratio below hi / above lo: one band, below
        else:
            fail = _rollout_fails(r, c)  # (B,)
            if cond is not None:
                fail &= cond
            gate = ~fail if gate is None else gate & ~fail
            if c.agg in ("max", "min"):
                tripped.append(partial(_outside, r, c))
    if every_token:  # max_t rho_t <= hi and min_t rho_t >= lo: a rollout with any token outside [lo, hi] goes
        lo = max([c.low for c in every_token if c.low is not None], default=0.0)
        hi = min([c.high for c in every_token if c.high is not None], default=math.inf)
        out = outside_band(r.mask, r.log_ratio, lo, hi)  # (B, T), kept as the mask (it holds no Ratios)
        gate = ~any_per_row(out) if gate is None else gate & ~any_per_row(out)
        tripped.append(out)
    if gate is not None:
        gate &= r.valid
    return gate, token_rules, tripped


def _edges(c: Criterion) -> tuple[float, float]:
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
    return r.memo("prob_diff", lambda: exp_of(r.logp).sub_(exp_of(r.logp - r.unclamped_log_ratio)))


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


def _outside(r: Ratios, c: Criterion) -> torch.Tensor:
    """(B, T) bool: the loss tokens whose own statistic lies outside the band (built when a mask is read)."""
    lo, hi = _edges(c)
    if c.statistic == "ratio":
        return outside_band(r.mask, r.log_ratio, lo, hi)
    x = statistic(r, c.statistic)
    return r.mask & ((x < lo) | (x > hi))


def _rollout_fails(r: Ratios, c: Criterion) -> torch.Tensor:
    """(B,) bool: the rollouts whose aggregated statistic lies outside the band."""
    lo, hi = _edges(c)
    if c.statistic == "ratio" and c.agg in ("mean", "sum"):  # the geometric or product ratio, edges tolerant
        x, tol = (r.geo_log_ratio, r.edge_tolerance) if c.agg == "mean" else (r.seq_log_ratio,
                                                                              r.edge_tolerance * r.length)
        return ~in_band(x, lo, hi, tol)
    x = aggregate(r, c.statistic, c.agg)  # (B,)
    if c.statistic == "ratio":
        return ~in_band(x, lo, hi)
    return (x < lo) | (x > hi)


def _keep(r: Ratios, c: Criterion, cond: torch.Tensor | None) -> torch.Tensor:
    """(B, T) 0/1 floats: the loss tokens a token rule keeps (a rollout rule under per-token advantages: all
    but the failing rollouts' tokens of the advantage's sign)."""
    if c.agg == "token":
        lo, hi = _edges(c)
        x = statistic(r, c.statistic)
        keep = band_f(x, lo, hi) if c.statistic == "ratio" else x.clamp(lo, hi).eq_(x)  # (B, T) 1.0 in band
    else:
        keep = as_float(~_rollout_fails(r, c), r.dtype)[:, None]  # (B, 1)
    if cond is not None:  # the rule drops only where A has the sign: every other token is kept
        exempt = as_float(~cond, r.dtype)
        exempt = exempt if exempt.dim() == 2 else exempt[:, None]
        keep = torch.maximum(keep, exempt, out=keep) if keep.shape == exempt.shape else torch.maximum(keep, exempt)
    return keep.mul_(r.mask_f) if keep.shape == r.mask_f.shape else keep * r.mask_f


# ---------------------------------------------------------------------------------------------------------
# weights


def _clamped(x: torch.Tensor, clamp: float | None) -> torch.Tensor:
    return x if clamp is None else x.clamp(-clamp, clamp)


def _rollout_weight(r: Ratios, w: Weight, clamp, gate, rules, tripped) -> Correction:
    """A sequence or geometric weight: one finite weight per rollout."""
    x = _clamped(r.seq_log_ratio if w.level == "sequence" else r.geo_log_ratio, clamp)  # (B,)
    weight = capped_exp(x if w.clip_low == 0 else x.clamp(min=log_of(w.clip_low)), w.upper)  # (B,)
    clipped = None
    if w.truncated:
        clipped = r.valid & (x > log_of(w.upper))
        if w.clip_low > 0:
            clipped |= r.valid & (x < log_of(w.clip_low))
    if w.band is not None:  # outside the band the rollout is dropped
        tol = r.edge_tolerance if w.level == "geometric" else r.edge_tolerance * r.length
        ok = r.valid & in_band(x, *w.band, tol)
        gate = ok if gate is None else gate & ok
    if w.self_normalize:  # by the mean over valid rollouts, before the criteria
        mean = gated(r.valid & (ok if w.band is not None else r.valid), weight).sum() / r.valid.sum().clamp(min=1)
        weight = weight / torch.where(mean > 1e-8, mean, 1.0)
    if gate is not None:
        weight = gated(gate, weight)
        clipped = clipped & gate if clipped is not None else None
    return _filtered(r, gate, rules, tripped, {}, row_weight=weight, clipped=clipped)


def _token_weight(r: Ratios, w: Weight, clamp, gate, rules, tripped) -> Correction:
    """A token or prefix weight (B, T), or none (1 on every kept token)."""
    if w.level == "none":
        return _filtered(r, gate, rules, tripped, {})
    x = r.log_ratio if w.level == "token" else r.log_ratio.cumsum(-1)  # (B, T) a prefix: padding holds 0
    x = _clamped(x, clamp)
    weights = capped_exp(x if w.clip_low == 0 else x.clamp(min=log_of(w.clip_low)), w.upper)  # (B, T)
    masks, clipped = {}, None
    if w.truncated:
        clipped = rows_above(x, r.mask, log_of(w.upper))  # (B,) a row max where it can
        if w.clip_low > 0:
            clipped |= rows_above(x.neg(), r.mask, -log_of(w.clip_low))
        if gate is not None:
            clipped &= gate
        masks["clipped"] = partial(_clipped_tokens, r.mask, gate, x, w)  # built if read
    band = None
    if w.band is not None:  # outside the band the token is dropped
        band = band_f(x, *w.band).mul_(r.mask_f)  # (B, T) 0/1
        tripped = [partial(outside_band, r.mask, x, *w.band), *tripped]
    if w.self_normalize:  # by the mean over all loss tokens, before the criteria
        applied = weights * (band if band is not None else r.mask_f)
        mean = applied.sum() / r.n_tokens.clamp(min=1)
        weights.div_(torch.where(mean > 1e-8, mean, 1.0))
    return _filtered(r, gate, rules, tripped, masks, token_weights=weights, clipped=clipped, band=band)


def _clipped_tokens(mask, gate, x, w: Weight) -> torch.Tensor:
    """(B, T) bool: the loss tokens (of gated rollouts) whose weight was truncated."""
    own = mask if gate is None else tokens_of(mask, gate)
    out = above_on(own, x, log_of(w.upper))
    if w.clip_low > 0:
        out |= above_on(own, x.neg(), -log_of(w.clip_low))
    return out


def _union(parts) -> torch.Tensor:
    """(B, T) bool: the union of masks given as tensors or as functions that build them."""
    built = [p if isinstance(p, torch.Tensor) else p() for p in parts]
    out = built[0]
    for m in built[1:]:
        out = out | m
    return out


# ---------------------------------------------------------------------------------------------------------
# the gate and the token rules together


def _filtered(r: Ratios, gate, rules, tripped, masks, *, row_weight=None, token_weights=None, clipped=None,
              band=None) -> Correction:
    """The Correction: kept = the loss tokens of the gated rollouts that every token rule (and the weight's
    band) keeps; in the rows form when no token is dropped or the kernel finds the drops in few rows."""
    n_tok = r.n_tokens.clamp(min=1)
    zero = n_tok.new_zeros(())
    metrics = {"is_clipped": clipped_metric(r, clipped) if clipped is not None else zero,
               "is_token_masked": zero,
               "is_traj_masked": gated(~gate, r.length).sum() / n_tok if gate is not None else zero}
    if len(tripped) == 1 and isinstance(tripped[0], torch.Tensor):
        masks["token_masked"] = tripped[0]
    elif tripped:
        masks["token_masked"] = partial(_union, tripped)
    form = {}
    kind, rows, keep = _token_keep(r, rules, band, rows_form=token_weights is None)
    if kind is not None:
        if kind == "sparse":  # every rollout keeps all its loss tokens but a few rows
            kept_len = r.length.index_copy(0, rows, keep.sum(-1))  # (B,)
            form = dict(kept_rows=(rows, keep))
        else:
            kept_len = keep.sum(-1)  # (B,) before the gate
            if gate is not None:
                keep.mul_(as_float(gate, r.dtype)[:, None])
            form = dict(keep=keep)
        metrics["is_token_masked"] = (r.n_tokens - kept_len.sum()) / n_tok
        form["kept_len"] = gated(gate, kept_len) if gate is not None else kept_len
    return Correction(row_weight=row_weight, token_weights=token_weights, gate=gate, clipped=clipped, masks=masks,
                      metrics=metrics, **form)


def _token_keep(r: Ratios, rules, band, *, rows_form: bool):
    """(kind, rows, keep): the loss tokens every token rule keeps, as ("dense", None, (B, T) 0/1) or, for a
    lone plain ratio band when the correction may stay in the rows form, as the kernel's choice (sparse:
    ("sparse", rows, their (R, T) keep)); (None, None, None) without token rules."""
    keeps = [band] if band is not None else []
    if not rules and not keeps:
        return None, None, None
    if rows_form and not keeps and len(rules) == 1:
        rc, c, cond = rules[0]
        if cond is None and c.statistic == "ratio" and c.agg == "token":
            return band_filter(rc.log_ratio, r.mask_f, *_edges(c), shortcuts=r.shortcuts, share=r.sparse_share)
    keeps += [_keep(rc, c, cond) for rc, c, cond in rules]
    keep = keeps[0]
    for k in keeps[1:]:
        keep.mul_(k)
    return "dense", None, keep
