"""The fast evaluator's rows form (seqis/evaluators/fast.py) and the record both forms fill (`Correction`).

In the rows form a composition's weights and kept tokens are per-rollout values times the loss mask (a rollout
gate, a sequence or geometric weight), except in the few rollouts a token-level part touches (found by the row
extremes of its statistic), which carry their own (R, T) kept tokens and weights (`KeptRows`); every other row
weighs a token weight's untruncated value (a per-batch `Profile`). Loss and metrics are per-rollout sums, and the
backward writes the gradient in one pass (seqis/evaluators/outputs.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial

import torch

from ..core.compose import Weight
from ..core.ratios import Ratios, as_float, dot
from .kernels import (
    above_on,
    any_per_row,
    band_keep,
    capped_exp,
    dot_rows,
    gated,
    kept_k3_logp_sums,
    outside_band,
    rows_above,
    rows_into,
    rows_outside,
    tokens_of,
)
from .plain import log_of
from .rules import (
    Cache,
    Criterion,
    Drop,
    Shared,
    clamped_to,
    extremes,
    outside,
    rule_edges,
    shared_parts,
    statistic,
    token_keep,
    weight_band,
)


@dataclass(eq=False)
class KeptRows:
    """The few rows (R,) of a rows-form correction that carry their own tokens: `keep` (R, T) 0/1 floats, the
    loss tokens they keep, and `factor` (R, T) each token's weight (keep itself for a pure filter; the
    truncated token weights times keep for a token weight), with their per-row sums (R,): kept tokens
    ("count"), weights ("factor_sums"), k3 over the kept tokens ("k3") and the weights against the detached
    log pi ("logp"). Every other row keeps all its loss tokens."""

    rows: torch.Tensor
    keep: torch.Tensor
    factor: torch.Tensor
    count: torch.Tensor
    factor_sums: torch.Tensor
    k3: torch.Tensor
    logp: torch.Tensor



@dataclass(eq=False)
class Profile:
    """A token weight's untruncated value exp(x), 0 off the loss mask, shared by every row outside the KeptRows,
    with its per-row sums and per-row sums against the detached log pi."""

    values: torch.Tensor  # (B, T)
    sums: torch.Tensor  # (B,)
    logp_sums: torch.Tensor  # (B,)



@dataclass(eq=False)
class Correction:
    """What a composition does to one batch; `outputs_of` turns it into the output. Two forms:

    rows    (keep and token_weights None): every kept token of rollout j weighs row_weight_j times the
            profile's value (None: 1); the kept tokens are the loss tokens of the rollouts `gate` accepts,
            except in the rows of `kept_rows`, which carry their own kept masks and token weights.
    tokens  (keep or token_weights set): keep (B, T) 0/1 floats, the kept loss tokens with the gate applied
            (None: the loss tokens of the gated rollouts), times token_weights (B, T) (None: 1) and row_weight.
            Both are the correction's own tensors: they become the gradient in place, and the weights and kept
            mask are rebuilt from a fresh evaluation when read.

    row_weight  (B,) one finite weight per rollout (None: 1)
    gate        (B,) bool, the rollouts the rollout-level rules accept (None: every one)
    kept_len    (B,) kept tokens per rollout, when a token rule drops some (else counted from the mask)
    clipped     (B,) bool, the rollouts whose weight was truncated (None: no truncation)
    masks       its own (B, T) bool masks ("clipped", "token_masked"), each a tensor or a function that builds
                it (called only if somebody reads the mask: seqis.core.types.Masks)
    metrics     its own metrics (beyond the common ones every output reports)
    """

    row_weight: torch.Tensor | None = None
    gate: torch.Tensor | None = None
    kept_rows: KeptRows | None = None
    profile: Profile | None = None
    token_weights: torch.Tensor | None = None
    shared_weights: bool = False  # token_weights is a per-call profile several corrections read: not to be written
    keep: torch.Tensor | None = None
    kept_len: torch.Tensor | None = None
    clipped: torch.Tensor | None = None
    masks: dict[str, torch.Tensor | Callable[[], torch.Tensor]] = field(default_factory=dict)
    metrics: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def per_token(self) -> bool:
        """The tokens form (a (B, T) keep or weight tensor) rather than the rows form."""
        return self.keep is not None or self.token_weights is not None



def exponent(r: Ratios, cache: Cache, level: str, clamp: float | None, each: bool = False) -> Shared:
    """A token or prefix weight's exponent (l_t or sum_{s<=t} l_s, clamped; each: the prefix sums of the
    clamped l_s) (B, T), shared: not to be written to. Off the loss mask it holds 0 or (a prefix) the value of
    the row's last loss token before it."""
    if level == "token" or (each and clamp is not None):  # the clamped record's own log-ratios (or their sums)
        rc = cache.clamped(r, clamp)
        if level == "token":
            return rc, "ratio", rc.log_ratio
        r, clamp = rc, None
    key = ("prefix", clamp)
    return r, key, cache.memo((key, r.clamp), lambda: clamped_to(r.log_ratio.cumsum(-1), clamp))



def truncated_rows(r: Ratios, cache: Cache, w: Weight, ex: Shared) -> torch.Tensor:
    """(B,) bool: the rows with a loss token whose weight exponent x lies beyond the truncation (from the row
    extremes where an edge is on the far side of 0, which padding holds, else from the mask)."""
    (x_max, x_min), x = extremes(cache, ex), ex[2]
    c = log_of(w.upper)
    clipped = x_max > c if c >= 0 else rows_above(x, r.mask, c)
    if w.clip_low > 0:
        c = log_of(w.clip_low)
        clipped |= x_min < c if c <= 0 else rows_above(x.neg(), r.mask, -c)
    return clipped



def clipped_tokens(mask, gate, x, w: Weight) -> torch.Tensor:
    """(B, T) bool: the loss tokens (of gated rollouts) whose weight was truncated."""
    own = mask if gate is None else tokens_of(mask, gate)
    out = above_on(own, x, log_of(w.upper))
    if w.clip_low > 0:
        out |= above_on(own, x.neg(), -log_of(w.clip_low))
    return out


# ---------------------------------------------------------------------------------------------------------
# the rows form: only the rows a token-level part touches, in full


def sparse_form(r: Ratios, cache: Cache, gate, rules, tripped, w: Weight | None, clamp, *, row_weight=None,
                clipped=None, each=False, in_full: Callable[..., Correction] | None = None) -> Correction | None:
    """The rows form of a correction with token-level parts (token rules; a token or prefix weight, truncated,
    banded or self-normalised), when shortcuts are on and those parts change the tokens of few rollouts: the
    row maxima and minima of each statistic find those rows, only they are evaluated in full (on a record of
    their own), and every other row keeps all its loss tokens at the weight's untruncated value (a profile
    shared per call; only when the cache says so). The token-level part is shared by the corrections that have
    the same one. None when it does not apply (a rule under per-token advantages; too many rows): then the
    tokens form follows. in_full: the tokens form's token weight (fast.py's), which a token weight's few rows
    take."""
    token_weight = w is not None and w.level in ("token", "prefix")
    if not r.shortcuts or not (rules or token_weight) or (token_weight and not cache.profiles):
        return None
    if any(cond is not None and cond.dim() == 2 for _, _, cond in rules):
        return None
    own_w = replace(w, self_normalize=False) if token_weight else None
    part = cache.memo(("sparse", own_w, tuple(c for _, c, _ in rules), clamp, each),
                      lambda: sparse_rows(r, cache, own_w, clamp, rules, each, in_full))
    if part is None:
        return None
    kept_rows, kept_len, applied, sub_rc = part  # kept_len: (B,) before the gate
    # a rule's tokens outside its band lie in the kept rows, unless an advantage condition exempted their row
    tripped = [*tripped, *(partial(outside, rc, cache, c) if cond is not None or isinstance(c, Drop) else
                           partial(torch.zeros_like, r.mask) if kept_rows is None else
                           partial(_rows_outside_band, r.mask.shape, kept_rows.rows, sub_rc, c)
                           for rc, c, cond in rules)]
    masks, profile = {}, None
    if token_weight:
        ex = exponent(r, cache, w.level, clamp, each)
        x = ex[2]
        exact = w.edge_space == "ratio"
        profile = cache.memo(("profile", ex[0].clamp, ex[1], exact), lambda: profile_of(r, cache, x, exact))
        if w.truncated:
            clipped = truncated_rows(r, cache, w, ex)
            if gate is not None:
                clipped &= gate
            masks["clipped"] = partial(clipped_tokens, r.mask, gate, x, w)
        if w.band is not None:
            tripped = [partial(outside_band, r.mask, x, *weight_band(w, r.dtype)), *tripped]
        if w.self_normalize:  # by the mean over all loss tokens of the (truncated, banded) weight
            total = profile.sums.sum() if kept_rows is None else (  # a sum, never a difference
                profile.sums.index_fill(0, kept_rows.rows, 0.0).sum() + applied)
            mean = total / r.n_tokens.clamp(min=1)
            row_weight = torch.where(mean > 1e-8, mean, 1.0).reciprocal().expand(r.length.shape)
    metrics = shared_parts(r, gate, tripped, masks, clipped)
    metrics["is_token_masked"] = (r.n_tokens - kept_len.sum()) / r.n_tokens.clamp(min=1)
    return Correction(row_weight=row_weight, gate=gate, kept_rows=kept_rows, profile=profile,
                      kept_len=gated(gate, kept_len) if gate is not None else kept_len, clipped=clipped,
                      masks=masks, metrics=metrics)



def _rows_outside_band(shape, rows: torch.Tensor, sub: Ratios, c: Criterion) -> torch.Tensor:
    """(B, T) bool: the loss tokens outside the rule's band, found in the given rows (`sub` holds them)."""
    return rows_into(shape, rows, outside(sub, Cache(), c))



def sparse_rows(r: Ratios, cache: Cache, w: Weight | None, clamp, rules, each=False, in_full=None):
    """(KeptRows, kept tokens per rollout (B,), the kept rows' summed (truncated, banded) weights, their clamped
    record) of a token-level part ((None, lengths, None, None) when no row is touched), or None when it changes
    the tokens of more than r.sparse_share of the rollouts."""
    hit = torch.zeros_like(r.valid)
    if w is not None:
        ex = exponent(r, cache, w.level, clamp, each)
        lo, hi = log_of(w.clip_low), log_of(w.upper)
        if w.band is not None:
            band_lo, band_hi = weight_band(w, r.dtype)
            lo, hi = max(lo, band_lo), min(hi, band_hi)
        hit |= rows_outside(*extremes(cache, ex), lo, hi)
    for rc, c, cond in rules:
        if isinstance(c, Drop):  # the rows with a dropped token
            hit |= any_per_row(c.tokens)
            continue
        lo, hi, strict = rule_edges(c, rc.dtype)
        out = rows_outside(*extremes(cache, (rc, c.statistic, statistic(rc, cache, c.statistic))), lo, hi,
                           strict=strict)
        hit |= out if cond is None else out & cond
    rows = hit.nonzero().squeeze(1)
    if len(rows) > r.sparse_share * len(hit):
        return None
    if len(rows) == 0:  # every rollout keeps all its loss tokens at the profile's weight
        return None, r.length, None, None
    # the rows in full, on their own record (shortcuts off: the tokens form) and cache; a clamp that changes no
    # token's l in the batch changes none of theirs (a prefix sum's clamp still applies)
    token_clamp = None if clamp is None or cache.clamped(r, clamp) is r else clamp
    sub, sub_cache = r.rows(rows), Cache()
    sub_rc = sub_cache.clamped(sub, token_clamp)
    sub_rules = [(sub_rc, c.rows(rows) if isinstance(c, Drop) else c, None if cond is None else
                  cond.index_select(0, rows)) for _, c, cond in rules]
    applied = r.n_tokens.new_zeros(())
    if w is not None:
        w_clamp = token_clamp if w.level == "token" or each else clamp
        own = in_full(sub, sub_cache, w, w_clamp, None, sub_rules, [], each)  # the tokens form (no shortcuts)
        keep = own.keep if own.keep is not None else sub_cache.mask_f(sub)
        x = exponent(sub, sub_cache, w.level, w_clamp, each)[2]
        band = band_keep(x, sub_cache.mask_f(sub), *weight_band(w, sub.dtype)) if w.band else sub_cache.mask_f(sub)
        applied = dot(own.token_weights, band)
        factor = own.token_weights.mul_(keep)
        count = keep.sum(-1)
        k3, logp = dot_rows(cache.k3_rows(r, rows, sub), keep), dot_rows(sub_cache.logp(sub), factor)
    else:  # a pure filter: its kept tokens' k3 and log pi summed in one blocked pass
        keep = factor = token_keep(sub_cache, sub_rules, None)
        count = keep.sum(-1)
        k3, logp = kept_k3_logp_sums(sub.log_ratio, sub.trainer_logprobs, keep)
    kept_rows = KeptRows(rows, keep, factor, count, factor.sum(-1) if factor is not keep else count, k3, logp)
    return kept_rows, r.length.index_copy(0, rows, count), applied, sub_rc



def profile_of(r: Ratios, cache: Cache, x: torch.Tensor, exact: bool = False) -> Profile:
    """The untruncated token weights exp(x) (with the e^40 cap; exact: torch.exp), 0 off the loss mask, and their
    row sums."""
    values = capped_exp(x, exact=exact).mul_(cache.mask_f(r))
    return Profile(values, values.sum(-1), dot_rows(values, cache.logp(r)))


# ---------------------------------------------------------------------------------------------------------
# per-rollout values spread over the loss tokens


def row_sums(full: torch.Tensor, kept_rows: KeptRows | None, sums: str) -> torch.Tensor:
    """(B,) per-rollout sums: `full` (the sums over all its loss tokens), but in the rows of kept_rows their own
    sums named by `sums` ("count", "factor_sums", "k3" or "logp": see KeptRows)."""
    if kept_rows is None or len(kept_rows.rows) == 0:
        return full
    return full.index_copy(0, kept_rows.rows, getattr(kept_rows, sums))



def spread(row_values: torch.Tensor, base: torch.Tensor, kept_rows: KeptRows | None, *,
           weighted: bool = False) -> torch.Tensor:
    """(B, T): row_values_j times base on each of rollout j's loss tokens, but in the rows of kept_rows, which
    take their own keep (or factor, when weighted); 0 elsewhere. base: a profile (B, T), or the loss mask (B, T)
    bool, read as 0/1 (the one (B, T) tensor made here)."""
    if base.dtype == torch.bool:
        out = as_float(base, row_values.dtype).mul_(row_values[:, None])
    else:
        out = row_values[:, None] * base
    if kept_rows is not None and len(kept_rows.rows):
        rows = kept_rows.rows
        out.index_copy_(0, rows, row_values[rows, None] * (kept_rows.factor if weighted else kept_rows.keep))
    return out
