"""The fast evaluator's rows form (seqis/evaluators/fast.py) and the record both forms fill (`Correction`).

In the rows form a composition's weights and kept tokens are per-rollout values times the loss mask (a rollout
gate, a sequence or geometric weight), except in the few rollouts a token rule touches (found by the row extremes
of its statistic), which carry their own (R, T) kept tokens (`KeptRows`). Loss and metrics are per-rollout sums, and
the backward writes the gradient in one pass (seqis/evaluators/outputs.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import torch

from ..core.compose import Weight
from ..core.ratios import Ratios, as_float
from .kernels import (
    any_per_row,
    dot_rows,
    outside_band,
    rows_outside,
    tokens_of,
)
from .plain import log_of
from .rules import (
    Cache,
    Drop,
    Shared,
    clamped_to,
    extremes,
    log_edges,
    outside,
    statistic,
    token_keep,
)


@dataclass(eq=False)
class KeptRows:
    """The few rows (R,) of a rows-form correction that carry their own tokens: `keep` (R, T) 0/1 floats, the
    loss tokens they keep, with their per-row sums (R,) of k3 ("k3") and of the detached log pi ("logp") over
    them. Every other row keeps all its loss tokens."""

    rows: torch.Tensor
    keep: torch.Tensor
    k3: torch.Tensor
    logp: torch.Tensor
    record: Ratios  # their clamped record, which their token_masked mask reads (none of the batch's)


@dataclass(eq=False)
class Correction:
    """What a composition does to one batch; `outputs_of` turns it into the output. Two forms:

    rows    (keep and token_weights None): every kept token of rollout j weighs row_weight_j (None: 1); the
            kept tokens are the loss tokens of the rollouts `gate` accepts, except in the rows of `kept_rows`,
            which carry their own kept masks.
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
    token_weights: torch.Tensor | None = None
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
    clipped = x_max > c if c >= 0 else any_per_row(outside_band(r.mask, x, -math.inf, c))
    if w.clip_low > 0:
        c = log_of(w.clip_low)
        clipped |= x_min < c if c <= 0 else any_per_row(outside_band(r.mask, x, c, math.inf))
    return clipped


def clipped_tokens(mask, gate, x, w: Weight) -> torch.Tensor:
    """(B, T) bool: the loss tokens (of gated rollouts) whose weight was truncated."""
    own = mask if gate is None else tokens_of(mask, gate)
    return outside_band(own, x, log_of(w.clip_low), log_of(w.upper))


# ---------------------------------------------------------------------------------------------------------
# the rows form: only the rows a token-level part touches, in full


def outside_rows(kept_rows: KeptRows | None, mask: torch.Tensor, c) -> Callable[[], torch.Tensor]:
    """() -> (B, T) bool: a sparse rule's loss tokens outside its band, every one in the kept rows, built from
    their own record (so that a rows-form output holds none of the batch's (B, T) tensors but the mask)."""
    if kept_rows is None:
        return partial(torch.zeros_like, mask)
    rows = kept_rows.rows
    return lambda: torch.zeros_like(mask).index_copy_(0, rows, outside(kept_rows.record, Cache(), c))


def sparse_rows(r: Ratios, cache: Cache, clamp, rules) -> tuple[KeptRows | None, torch.Tensor] | None:
    """The rows form of token rules decided in log space, when shortcuts are on and they change the tokens of few
    rollouts: the row maxima and minima of each statistic find those rows, only they are evaluated in full (on a
    record of their own), and every other row keeps all its loss tokens. (KeptRows, kept tokens per rollout (B,)
    before any gate) ((None, lengths) when no row is touched), shared by the corrections with the same rules;
    None when it does not apply (a rule under per-token advantages or in ratio space; more than r.sparse_share of
    the rollouts touched): then the tokens form follows."""
    if not r.shortcuts or not rules or any(cond is not None and cond.dim() == 2 or
                                           getattr(c, "edge_space", "") == "ratio" for _, c, cond in rules):
        return None
    return cache.memo(("sparse", tuple(c for _, c, _ in rules), clamp), lambda: _kept_rows(r, cache, clamp, rules))


def _kept_rows(r: Ratios, cache: Cache, clamp, rules):
    hit = torch.zeros_like(r.valid)
    for rc, c, cond in rules:
        if isinstance(c, Drop):  # the rows with a dropped token
            hit |= any_per_row(c.tokens)
            continue
        out = rows_outside(*extremes(cache, (rc, c.statistic, statistic(rc, cache, c.statistic))), *log_edges(c),
                           strict=c.strict)
        hit |= out if cond is None else out & cond
    rows = hit.nonzero().squeeze(1)
    if len(rows) > r.sparse_share * len(hit):
        return None
    if len(rows) == 0:  # every rollout keeps all its loss tokens
        return None, r.length
    # the rows in full, on their own record (shortcuts off: the tokens form) and cache; a clamp that changes no
    # token's l in the batch changes none of theirs
    token_clamp = None if clamp is None or cache.clamped(r, clamp) is r else clamp
    sub, sub_cache = r.rows(rows), Cache()
    sub_rc = sub_cache.clamped(sub, token_clamp)
    sub_rules = [(sub_rc, c.rows(rows) if isinstance(c, Drop) else c, None if cond is None else
                  cond.index_select(0, rows)) for _, c, cond in rules]
    keep = token_keep(sub_cache, sub_rules, None)
    count = keep.sum(-1)
    k3, logp = dot_rows(sub_cache.k3(sub), keep), dot_rows(sub_cache.logp(sub), keep)
    return KeptRows(rows, keep, k3, logp, sub_rc), r.length.index_copy(0, rows, count)


# ---------------------------------------------------------------------------------------------------------
# per-rollout values spread over the loss tokens


def row_sums(full: torch.Tensor, kept_rows: KeptRows | None, sums: str) -> torch.Tensor:
    """(B,) per-rollout sums: `full` (the sums over all its loss tokens), but in the rows of kept_rows their own
    sums named by `sums` ("k3" or "logp": see KeptRows)."""
    if kept_rows is None or len(kept_rows.rows) == 0:
        return full
    return full.index_copy(0, kept_rows.rows, getattr(kept_rows, sums))


def spread(row_values: torch.Tensor, mask: torch.Tensor, kept_rows: KeptRows | None) -> torch.Tensor:
    """(B, T): row_values_j on each of rollout j's loss tokens (mask, (B, T) bool), but in the rows of kept_rows
    on their own kept tokens; 0 elsewhere (the one (B, T) tensor made here)."""
    out = as_float(mask, row_values.dtype).mul_(row_values[:, None])
    if kept_rows is not None and len(kept_rows.rows):
        rows = kept_rows.rows
        out.index_copy_(0, rows, row_values[rows, None] * kept_rows.keep)
    return out
