"""The fast evaluator: the same outputs as seqis/evaluators/plain.py (the definition), computed for speed.

`evaluate_many(comps, batch, agg, ratios)` evaluates compositions on one batch, sharing what they have in common:
the batch's log-ratios and their per-rollout sums (`Ratios`, a frozen record made once per batch) and every
piece several compositions read (a statistic, its per-rollout aggregates and row extremes, a clamped copy: a
`Cache` that the call owns). Each composition takes one of two forms, chosen for the
whole composition (`correction`):

    rows    its weights and kept tokens are per-rollout values times the loss mask (a rollout gate, a sequence
            or geometric weight), except in the few rollouts a token rule touches (found by the row extremes
            of the statistic), which carry their own (R, T) kept tokens (`KeptRows`). Loss and metrics are
            per-rollout sums: no (B, T) tensor of its own in the forward, and the backward writes the gradient
            in one pass.
    tokens  its own (B, T) kept mask and weights, built in place, which become the gradient.

A part decided over the whole batch (M2PO's dropped tokens: the definition's own sort, once per batch and
threshold) stands among the token rules as a `Drop`; tokens that leave the loss's count N (M2PO's, a rule with
leaves_normaliser) scale the row weight by N / N_after; VESPO's gamma is one more rollout weight.

The loss is one autograd node whose backward writes d loss / d log pi directly (seqis/evaluators/outputs.py). On the
CPU reading a value back is free (`shortcuts`), so data-dependent questions skip whole passes (a clamp that
changes no token, a token rule no row trips); on a GPU the passes run instead. The rejection rules are in rules.py, the
rows form in rows.py, the outputs in outputs.py; every primitive is in kernels.py with the formula it
computes. tests/test_evaluators.py holds this module to plain.py on hypothesis-drawn
batches and compositions, both forms and both shortcut settings.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from functools import partial

import torch

from ..core.compose import Composition, Weight
from ..core.ratios import MAX_LOG_WEIGHT, Ratios, as_float
from ..core.types import Batch, EstimatorOutput
from .kernels import band_keep, capped_exp, gated, in_band, outside_band
from .outputs import outputs_of
from .plain import AGGREGATIONS, log_of, within
from .rows import Correction, clipped_tokens, exponent, outside_rows, sparse_rows, truncated_rows
from .rules import (
    Cache,
    Drop,
    batch_dropped,
    clamped_to,
    criteria,
    left_out,
    outside,
    shared_parts,
    token_keep,
)

# ---------------------------------------------------------------------------------------------------------
# a composition on the batch: its Correction, in the rows or the tokens form


def correction(r: Ratios, cache: Cache, comp: Composition) -> Correction:
    """The composition on the batch of `r` (whose advantages decide any sign-conditioned criterion)."""
    c = comp.log_ratio_clamp
    rc = cache.clamped(r, c)
    if comp.clamp_order == "aggregate" and c is not None:
        rc = cache.memo(("aggregate view", c), lambda: rc.aggregate_view(r, c))
    gate, rules, tripped = criteria(rc, cache, comp.criteria)
    rules = [(rc, c, cond) for c, cond in rules]
    drop = None
    if comp.batch_rule is not None:  # M2PO: a token rule decided over the batch (its token_masked mask either way)
        drop = batch_dropped(r, cache, comp.batch_rule)
        if drop is None:
            tripped = [*tripped, partial(torch.zeros_like, r.mask)]
        else:
            rules.append((rc, drop, None))
    w = comp.weight
    each = comp.weight_clamp_order == "token" and comp.log_ratio_clamp is not None  # the weight aggregates lc
    out = (_rollout_weight if w.per_rollout else _token_weight)(r, cache, w, comp.log_ratio_clamp, gate, rules,
                                                                 tripped, each)
    left = left_out(r, rc, cache, comp.criteria, drop)
    if left is not None and not (r.shortcuts and not bool(left > 0)):  # the kept weights scale by N / N_after
        factor = r.n_tokens / (r.n_tokens - left).clamp(min=1)  # ()
        out.row_weight = factor.expand(r.length.shape) if out.row_weight is None else out.row_weight * factor
    return out


def _rollout_weight(r: Ratios, cache: Cache, w: Weight, clamp, gate, rules, tripped, each=False) -> Correction:
    """A sequence or geometric weight: one finite weight per rollout (each: of the clamped log-ratios' sum or
    mean, with no clamp after it; per token under VESPO's gamma with per-token advantages)."""
    rw = cache.clamped(r, clamp) if each else r  # the record whose sums the weight reads
    if w.token_clip is not None:  # the product of the token ratios, each clamped, then truncated
        x = _token_clipped_sum(r, cache, clamp, w.token_clip)  # (B,)
    else:
        x = rw.seq_log_ratio if w.level == "sequence" else rw.geo_log_ratio  # (B,)
    x = x if each else clamped_to(x, clamp)
    if w.gamma is not None:
        return _gamma_weight(r, cache, w.gamma, x, gate, rules, tripped, clamp)
    weight = capped_exp(x if w.clip_low == 0 else x.clamp(min=log_of(w.clip_low)), w.upper,
                        w.edge_space == "ratio")  # (B,)
    clipped = None
    if w.truncated:
        clipped = r.valid & (x > log_of(w.upper))
        if w.clip_low > 0:
            clipped |= r.valid & (x < log_of(w.clip_low))
    if w.band is not None:  # outside the band the rollout is dropped (edges in ratio space: no tolerance)
        tol = 0.0 if w.edge_space == "ratio" else (
            rw.edge_tolerance if w.level == "geometric" else rw.edge_tolerance * r.length)
        ok = r.valid & (within(x, "ratio", *w.band, space="ratio") if w.edge_space == "ratio" else
                        in_band(x, *w.band, tol))
        gate = ok if gate is None else gate & ok
    if w.self_normalize:  # by the mean over valid rollouts, before the criteria
        count = max(len(r.valid), 1) if w.normalize_all else r.n_valid  # slime's: every rollout, empty ones too
        mean = gated(r.valid & (ok if w.band is not None else r.valid), weight).sum() / count
        weight = weight / torch.where(mean > 1e-8, mean, 1.0)
    return _per_rollout(r, cache, gate, rules, tripped, clamp, weight, clipped)


def _per_rollout(r: Ratios, cache: Cache, gate, rules, tripped, clamp, weight=None, clipped=None) -> Correction:
    """One weight per rollout (None: 1), gated: the rows form, or the tokens form where a token rule needs it."""
    if gate is not None and weight is not None:
        weight = gated(gate, weight)
        clipped = clipped & gate if clipped is not None else None
    return _filtered(r, cache, gate, rules, tripped, {}, clamp=clamp, row_weight=weight, clipped=clipped)


def _token_clipped_sum(r: Ratios, cache: Cache, clamp: float | None, token_clip: float) -> torch.Tensor:
    """(B,) sum over each rollout's loss tokens of min(l_t, log token_clip), l_t clamped to [-c, c] (TRL's token
    TIS inside VESPO), once per call."""
    rc, a = cache.clamped(r, clamp), log_of(token_clip)
    return cache.memo(("token clipped sum", rc.clamp, a), lambda: rc.seq_log_ratio if a == math.inf else
                      torch.where(rc.mask, rc.log_ratio.clamp(max=a), 0.0).sum(-1))


def _vespo(x: torch.Tensor, k: float, lam: float) -> torch.Tensor:
    """VESPO's phi(W) = exp(lambda + k log W - lambda W) for log W = x, with the e^40 cap every weight keeps."""
    return torch.exp((lam + k * x - lam * torch.exp(x)).clamp(max=MAX_LOG_WEIGHT))


def _gamma_weight(r: Ratios, cache: Cache, gamma, x: torch.Tensor, gate, rules, tripped, clamp) -> Correction:
    """VESPO's sequence weight phi(exp x_j), (k, lambda) = (k+, lambda+) where A >= 0, else (k-, lambda-): one
    weight per rollout (the rows form), or per token under per-token advantages (the tokens form)."""
    k_pos, lam_pos, k_neg, lam_neg = gamma
    up = r.advantages >= 0  # (B,) or (B, T)
    if up.dim() == 2:
        weights = torch.where(up, _vespo(x, k_pos, lam_pos)[:, None], _vespo(x, k_neg, lam_neg)[:, None])  # (B, T)
        return _filtered(r, cache, gate, rules, tripped, {}, token_weights=weights)
    weight = torch.where(up, _vespo(x, k_pos, lam_pos), _vespo(x, k_neg, lam_neg))  # (B,)
    return _per_rollout(r, cache, gate, rules, tripped, clamp, weight)


def _token_weight(r: Ratios, cache: Cache, w: Weight, clamp, gate, rules, tripped, each=False) -> Correction:
    """A token or prefix weight (B, T), or none (1 on every kept token)."""
    if w.level == "none":
        return _per_rollout(r, cache, gate, rules, tripped, clamp)
    ex = exponent(r, cache, w.level, clamp, each)
    x = ex[2]
    weights = capped_exp(x if w.clip_low == 0 else x.clamp(min=log_of(w.clip_low)), w.upper,
                         w.edge_space == "ratio")  # (B, T); exact: torch.exp, as the framework deciding in ratios
    masks, clipped = {}, None
    if w.truncated:
        clipped = truncated_rows(r, cache, w, ex)
        if gate is not None:
            clipped &= gate
        masks["clipped"] = partial(clipped_tokens, r.mask, gate, x, w)  # built if read
    band = None
    if w.band is not None:  # outside the band the token is dropped (in ratio space: exp(x) against the edges)
        if w.edge_space == "ratio":
            inside = within(x, "ratio", *w.band, space="ratio")  # (B, T) bool
            band, out = as_float(inside, r.dtype).mul_(cache.mask_f(r)), r.mask & ~inside
        else:
            lo, hi = log_of(w.band[0]), log_of(w.band[1])
            band, out = band_keep(x, cache.mask_f(r), lo, hi), partial(outside_band, r.mask, x, lo, hi)  # 0/1
        tripped = [out, *tripped]
    if w.self_normalize:  # by the mean over all loss tokens, before the criteria
        applied = weights * (band if band is not None else cache.mask_f(r))
        mean = applied.sum() / r.n_tokens.clamp(min=1)
        weights.div_(torch.where(mean > 1e-8, mean, 1.0))
    return _filtered(r, cache, gate, rules, tripped, masks, token_weights=weights, clipped=clipped, band=band)


def _filtered(r: Ratios, cache: Cache, gate, rules, tripped, masks, *, clamp=None, row_weight=None,
              token_weights=None, clipped=None, band=None) -> Correction:
    """The Correction: kept = the loss tokens of the gated rollouts that every token rule (and the weight's band)
    keeps; in the rows form with no token weight, where the rules change the tokens of few rollouts (sparse_rows)
    or there is none, else in the tokens form (a (B, T) keep)."""
    sparse = sparse_rows(r, cache, clamp, rules) if token_weights is None else None
    tripped = [*tripped, *(partial(outside, rc, cache, c) if sparse is None or cond is not None or isinstance(c, Drop)
                           else outside_rows(sparse[0], r.mask, c) for rc, c, cond in rules)]
    metrics = shared_parts(r, gate, tripped, masks, clipped)
    form, kept_len = {}, None  # kept_len: (B,) before the gate
    if sparse is not None:
        form["kept_rows"], kept_len = sparse
    elif (keep := token_keep(cache, rules, band)) is not None:
        kept_len = keep.sum(-1)
        if gate is not None:
            keep.mul_(as_float(gate, r.dtype)[:, None])
        form["keep"] = keep
    if kept_len is not None:
        metrics["is_token_masked"] = (r.n_tokens - kept_len.sum()) / r.n_tokens.clamp(min=1)
        form["kept_len"] = gated(gate, kept_len) if gate is not None else kept_len
    return Correction(row_weight=row_weight, token_weights=token_weights, gate=gate, clipped=clipped, masks=masks,
                      metrics=metrics, **form)


# ---------------------------------------------------------------------------------------------------------
# the entry point


def evaluate_many(named: dict[Composition, int], batch: Batch, agg: str = "token-mean",
                  ratios: Ratios | None = None) -> dict[Composition, list[EstimatorOutput]]:
    """Each composition on the batch, as many outputs as `named` says keys name it (each its own loss node;
    the outputs of one composition share every other tensor). One Ratios and one Cache serve them all."""
    if agg not in AGGREGATIONS:
        raise ValueError(f"agg must be one of {', '.join(AGGREGATIONS)}; got {agg!r}")
    r = ratios if ratios is not None else ratios_for(batch, named)  # given without k3: Cache.k3 makes it if read
    pieces = Cache()
    out = {}
    for comp, n in named.items():
        again = partial(correction, r, pieces, comp)
        out[comp] = outputs_of(r, pieces, batch, again(), comp, agg, again, n)
    return out


WEIGHT_LEVELS = ("none", "token", "sequence", "geometric", "prefix")

AGGREGATES = ("token", "sum", "mean", "max", "min")

PENALTIES = ("squared_log_ratio", "k3")


def ratios_for(batch: Batch, comps: Iterable[Composition], *, k3: bool | None = None, chi2: bool = False
               ) -> Ratios:
    """The batch's Ratios as evaluate_many makes them for these compositions: with the (B, T) k3 when there are
    several (k3=None; a token-level one's kept share in the tokens form reads it: made in the pass, it costs a
    (B, T) tensor's memory and no arithmetic; made when first read, a pass) and the rows' extremes of l when one
    reads them. A caller that reads the Ratios itself too (seqis.runs.monitor: k3=False, chi2=True for diagnostics)
    makes them here and passes them on."""
    comps = [comp for comp in comps if supports(comp)]  # the plain evaluator reads none of it
    return Ratios.of(batch, k3=len(comps) > 1 if k3 is None else k3,
                     extremes=any(reads_extremes(comp) for comp in comps), chi2=chi2,
                     tokens=chi2 or not all(reads_row_sums_only(comp) for comp in comps))


def reads_row_sums_only(comp: Composition) -> bool:
    """Whether the composition reads only the per-rollout sums of l (a sequence or geometric weight, rules on a
    rollout's sum or mean of l or k3), so that Ratios.of need not keep l (B, T); a record made without it makes
    it when read, so a wrong answer here costs time, never a value."""
    w = comp.weight
    return (w.level in ("none", "sequence", "geometric") and w.token_clip in (None, math.inf) and w.band is None
            and comp.penalty is None and comp.log_ratio_clamp is None and comp.batch_rule is None
            and all(c.agg in ("sum", "mean") and c.statistic in ("ratio", "k1", "k3") and c.advantage is None
                    for c in comp.criteria))


def reads_extremes(comp: Composition) -> bool:
    """Whether a token rule on the ratio will ask for the rows' extremes of l (Ratios.of makes them with l)."""
    return any(c.statistic == "ratio" for c in comp.token_rules)


def supports(comp: Composition) -> bool:
    """Whether this module evaluates the composition (every part one it knows), or the plain evaluator does."""
    return (comp.weight.level in WEIGHT_LEVELS and all(c.agg in AGGREGATES for c in comp.criteria)
            and (comp.penalty is None or comp.penalty.statistic in PENALTIES))
