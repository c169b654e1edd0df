"""What a Composition does to one batch: its weights, kept tokens, rollout gate and own metrics (a Correction).

Read top to bottom it is compose.py's formula: the rollout-level criteria fold into one gate, the token-level
ones into one keep mask; then the IS weight at its level (truncated, masked to a band, self-normalised).
Criteria see the log-ratios clamped to the composition's log_ratio_clamp; the weight clamps its own exponent
after aggregating the raw ones (verl's SAFETY_BOUND, as its code does it). The rules themselves live in
criteria.py, speed in _kernels.py.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial

import torch

from ._common import Correction, Ratios, clipped_metric
from ._kernels import (
    KeptRows,
    Profile,
    above_on,
    as_float,
    band_keep,
    capped_exp,
    dot,
    dot_rows,
    gated,
    in_band,
    log_of,
    outside_band,
    rows_above,
    rows_outside,
    tokens_of,
)
from .compose import Composition, Weight
from .criteria import (
    Shared,
    criteria,
    edges,
    extremes,
    outside,
    rows_outside_band,
    statistic,
    token_keep,
)


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
# weights


def _clamped(x: torch.Tensor, clamp: float | None) -> torch.Tensor:
    return x if clamp is None else x.clamp(-clamp, clamp)


def _exponent(r: Ratios, level: str, clamp: float | None) -> Shared:
    """A token or prefix weight's exponent (l_t or sum_{s<=t} l_s, clamped) (B, T), shared: not to be written
    to. Off the loss mask it holds 0 or (a prefix) the value of the row's last loss token before it."""
    if level == "token":  # the clamped Ratios' own log-ratios (the batch's, when no token is beyond the clamp)
        rc = r if clamp is None else r.clamped(clamp)
        return rc, "ratio", rc.log_ratio
    return r, ("prefix", clamp), r.memo(("prefix", clamp), lambda: _clamped(r.log_ratio.cumsum(-1), clamp))


def _truncated_rows(r: Ratios, w: Weight, ex: Shared) -> torch.Tensor:
    """(B,) bool: the rows with a loss token whose weight exponent x lies beyond the truncation (from the row
    extremes where an edge is on the far side of 0, which padding holds, else from the mask)."""
    (x_max, x_min), x = extremes(ex), ex[2]
    c = log_of(w.upper)
    clipped = x_max > c if c >= 0 else rows_above(x, r.mask, c)
    if w.clip_low > 0:
        c = log_of(w.clip_low)
        clipped |= x_min < c if c <= 0 else rows_above(x.neg(), r.mask, -c)
    return clipped


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
    sparse = _sparse(r, gate, rules, tripped, None, clamp, row_weight=weight, clipped=clipped)
    return sparse or _filtered(r, gate, rules, tripped, {}, row_weight=weight, clipped=clipped)


def _token_weight(r: Ratios, w: Weight, clamp, gate, rules, tripped) -> Correction:
    """A token or prefix weight (B, T), or none (1 on every kept token)."""
    sparse = _sparse(r, gate, rules, tripped, w, clamp)
    if sparse is not None:
        return sparse
    if w.level == "none":
        return _filtered(r, gate, rules, tripped, {})
    ex = _exponent(r, w.level, clamp)
    x = ex[2]
    shared = r.profiles and not w.truncated and not w.self_normalize  # exp(x) as it is: the shared profile
    if shared:
        weights = ex[0].memo(("profile", ex[1]), lambda: _profile(r, x)).values
    else:
        weights = capped_exp(x if w.clip_low == 0 else x.clamp(min=log_of(w.clip_low)), w.upper)  # (B, T)
    masks, clipped = {}, None
    if w.truncated:
        clipped = _truncated_rows(r, w, ex)
        if gate is not None:
            clipped &= gate
        masks["clipped"] = partial(_clipped_tokens, r.mask, gate, x, w)  # built if read
    band = None
    if w.band is not None:  # outside the band the token is dropped
        band = band_keep(x, r.mask_f, *w.band)  # (B, T) 0/1
        tripped = [partial(outside_band, r.mask, x, *w.band), *tripped]
    if w.self_normalize:  # by the mean over all loss tokens, before the criteria
        applied = weights * (band if band is not None else r.mask_f)
        mean = applied.sum() / r.n_tokens.clamp(min=1)
        weights.div_(torch.where(mean > 1e-8, mean, 1.0))
    return _filtered(r, gate, rules, tripped, masks, token_weights=weights, clipped=clipped, band=band,
                     shared_weights=bool(shared))


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


def _shared_parts(r: Ratios, gate, tripped, masks, clipped) -> dict:
    """The metrics every form reports (is_token_masked filled in by the caller) and the "token_masked" mask."""
    n_tok = r.n_tokens.clamp(min=1)
    zero = n_tok.new_zeros(())
    metrics = {"is_clipped": clipped_metric(r, clipped) if clipped is not None else zero,
               "is_token_masked": zero,
               "is_traj_masked": gated(~gate, r.length).sum() / n_tok if gate is not None else zero}
    if len(tripped) == 1 and isinstance(tripped[0], torch.Tensor):
        masks["token_masked"] = tripped[0]
    elif tripped:
        masks["token_masked"] = partial(_union, tripped)
    return metrics


def _filtered(r: Ratios, gate, rules, tripped, masks, *, row_weight=None, token_weights=None, clipped=None,
              band=None, shared_weights=False) -> Correction:
    """The Correction in the tokens form: kept = the loss tokens of the gated rollouts that every token rule
    (and the weight's band) keeps (the rows form when there is no token rule, band or token weight)."""
    tripped = [*tripped, *(partial(outside, rc, c) for rc, c, _ in rules)]
    metrics = _shared_parts(r, gate, tripped, masks, clipped)
    form = {}
    keep = token_keep(rules, band)
    if keep is not None:
        kept_len = keep.sum(-1)  # (B,) before the gate
        if gate is not None:
            keep.mul_(as_float(gate, r.dtype)[:, None])
        metrics["is_token_masked"] = (r.n_tokens - kept_len.sum()) / r.n_tokens.clamp(min=1)
        form = dict(keep=keep, kept_len=gated(gate, kept_len) if gate is not None else kept_len)
    return Correction(row_weight=row_weight, token_weights=token_weights, shared_weights=shared_weights, gate=gate,
                      clipped=clipped, masks=masks, metrics=metrics, **form)


def _sparse(r: Ratios, gate, rules, tripped, w: Weight | None, clamp, *, row_weight=None,
            clipped=None) -> Correction | None:
    """The rows form of a correction with token-level parts (token rules; a token or prefix weight, truncated,
    banded or self-normalised), when shortcuts are on and those parts change the tokens of few rollouts: the
    row maxima and minima of each statistic find those rows, only they are evaluated in full (on a Ratios of
    their own), and every other row keeps all its loss tokens at the weight's untruncated value (a profile
    shared per batch; only when r.profiles says so). The token-level part is shared by the corrections that
    have the same one. None when it does not apply (a rule under per-token advantages; too many rows): then the
    dense form follows."""
    token_weight = w is not None and w.level in ("token", "prefix")
    if not r.shortcuts or not (rules or token_weight) or (token_weight and not r.profiles):
        return None
    if any(cond is not None and cond.dim() == 2 for _, _, cond in rules):
        return None
    own_w = replace(w, self_normalize=False) if token_weight else None
    part = r.memo(("sparse", own_w, tuple(c for _, c, _ in rules), clamp),
                  lambda: _sparse_rows(r, own_w, clamp, rules))
    if part is None:
        return None
    kept_rows, kept_len, applied, sub_rc = part  # kept_len: (B,) before the gate
    # a rule's tokens outside its band lie in the kept rows, unless an advantage condition exempted their row
    tripped = [*tripped, *(partial(outside, rc, c) if cond is not None else
                           partial(torch.zeros_like, r.mask) if kept_rows is None else
                           partial(rows_outside_band, r.mask.shape, kept_rows.rows, sub_rc, c)
                           for rc, c, cond in rules)]
    masks, profile = {}, None
    if token_weight:
        ex = _exponent(r, w.level, clamp)
        x = ex[2]
        profile = ex[0].memo(("profile", ex[1]), lambda: _profile(r, x))
        if w.truncated:
            clipped = _truncated_rows(r, w, ex)
            if gate is not None:
                clipped &= gate
            masks["clipped"] = partial(_clipped_tokens, r.mask, gate, x, w)
        if w.band is not None:
            tripped = [partial(outside_band, r.mask, x, *w.band), *tripped]
        if w.self_normalize:  # by the mean over all loss tokens of the (truncated, banded) weight
            total = profile.sums.sum() if kept_rows is None else (  # a sum, never a difference
                profile.sums.index_fill(0, kept_rows.rows, 0.0).sum() + applied)
            mean = total / r.n_tokens.clamp(min=1)
            row_weight = torch.where(mean > 1e-8, mean, 1.0).reciprocal().expand(r.length.shape)
    metrics = _shared_parts(r, gate, tripped, masks, clipped)
    metrics["is_token_masked"] = (r.n_tokens - kept_len.sum()) / r.n_tokens.clamp(min=1)
    return Correction(row_weight=row_weight, gate=gate, kept_rows=kept_rows, profile=profile,
                      kept_len=gated(gate, kept_len) if gate is not None else kept_len, clipped=clipped,
                      masks=masks, metrics=metrics)


def _sparse_rows(r: Ratios, w: Weight | None, clamp, rules):
    """(KeptRows, kept tokens per rollout (B,), the kept rows' summed (truncated, banded) weights, their clamped
    Ratios) of a token-level part ((None, lengths, None, None) when no row is touched), or None when it changes
    the tokens of more than r.sparse_share of the rollouts."""
    hit = torch.zeros_like(r.valid)
    if w is not None:
        ex = _exponent(r, w.level, clamp)
        lo, hi = log_of(w.clip_low), log_of(w.upper)
        if w.band is not None:
            lo, hi = max(lo, log_of(w.band[0])), min(hi, log_of(w.band[1]))
        hit |= rows_outside(*extremes(ex), lo, hi)
    for rc, c, cond in rules:
        lo, hi = edges(c)
        if c.statistic == "ratio":
            lo, hi = log_of(lo), log_of(hi)
        out = rows_outside(*extremes((rc, c.statistic, statistic(rc, c.statistic))), lo, hi)
        hit |= out if cond is None else out & cond
    rows = hit.nonzero().squeeze(1)
    if len(rows) > r.sparse_share * len(hit):
        return None
    if len(rows) == 0:  # every rollout keeps all its loss tokens at the profile's weight
        return None, r.length, None, None
    # the rows in full, on their own Ratios (shortcuts off: dense); a clamp that changes no token's l in the
    # batch (r.clamped(c) is r) changes none of theirs (a prefix sum's clamp still applies)
    token_clamp = None if clamp is None or r.clamped(clamp) is r else clamp
    sub = r.rows(rows)
    sub_rc = sub if token_clamp is None else sub.clamped(token_clamp)
    sub_rules = [(sub_rc, c, None if cond is None else cond.index_select(0, rows)) for _, c, cond in rules]
    applied = r.n_tokens.new_zeros(())
    if w is not None:
        w_clamp = token_clamp if w.level == "token" else clamp
        own = _token_weight(sub, w, w_clamp, None, sub_rules, [])
        keep = own.keep if own.keep is not None else sub.mask_f
        band = band_keep(_exponent(sub, w.level, w_clamp)[2], sub.mask_f, *w.band) if w.band else sub.mask_f
        applied = dot(own.token_weights, band)
        factor = own.token_weights.mul_(keep)
    else:
        keep = factor = token_keep(sub_rules, None)
    count = keep.sum(-1)
    kept_rows = KeptRows(rows, keep, factor, count, factor.sum(-1) if factor is not keep else count,
                         dot_rows(r.k3_of(rows), keep), dot_rows(sub.logp, factor))
    return kept_rows, r.length.index_copy(0, rows, count), applied, sub_rc


def _profile(r: Ratios, x: torch.Tensor) -> Profile:
    """The untruncated token weights exp(x) (with the e^40 cap), 0 off the loss mask, and their row sums."""
    values = capped_exp(x).mul_(r.mask_f)
    return Profile(values, values.sum(-1), dot_rows(values, r.logp))
