"""The fast evaluator: the same outputs as seqis/evaluators/plain.py (the definition), computed for speed.

`evaluate_many(comps, batch, agg, ratios)` evaluates compositions on one batch, sharing what they have in common:
the batch's log-ratios and their per-rollout sums (`Ratios`, a frozen record made once per batch) and every
piece several compositions read (a statistic, its per-rollout aggregates and row extremes, a clamped copy, a
token-weight profile: a `Cache` that the call owns). Each composition takes one of two forms, chosen for the
whole composition (`correction`):

    rows    its weights and kept tokens are per-rollout values times the loss mask (a rollout gate, a sequence
            or geometric weight), except in the few rollouts a token-level part touches (found by the row
            extremes of the statistic), which carry their own (R, T) kept tokens and weights (`KeptRows`); every
            other row weighs a token weight's untruncated value (a per-batch `Profile`). Loss and metrics are
            per-rollout sums: no (B, T) tensor of its own in the forward, and the backward writes the gradient
            in one pass.
    tokens  its own (B, T) kept mask and weights, built in place, which become the gradient.

A part decided over the whole batch (M2PO's dropped tokens: the definition's own sort, once per batch and
threshold) stands among the token rules as a `Drop`; tokens that leave the loss's count N (M2PO's, a rule with
leaves_normaliser) scale the row weight by N / N_after; VESPO's gamma is one more rollout weight.

The loss is one autograd node whose backward writes d loss / d log pi directly (_kernels.known_losses). On the
CPU reading a value back is free (`shortcuts`), so data-dependent questions skip whole passes (a clamp that
changes no token, a token rule no row trips); on a GPU the passes run instead. Every primitive is in kernels.py
with the formula it computes. tests/test_evaluators.py holds this module to plain.py on hypothesis-drawn
batches and compositions, both forms and both shortcut settings.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from functools import cache as once
from functools import partial

import torch

from ..core.compose import BatchRule, Composition, Criterion, Penalty, Weight
from ..core.ratios import (
    MAX_LOG_WEIGHT,
    Ratios,
    as_dtype,
    as_float,
    dot,
    k3_of,
    row_extremes,
)
from ..core.types import Batch, EstimatorOutput, Masks
from .kernels import (
    SharedGradient,
    above_on,
    any_per_row,
    band_f,
    band_keep,
    blockwise,
    capped_exp,
    dot_rows,
    gated,
    in_band,
    in_log_band,
    kept_k3_logp_sums,
    known_losses,
    masked_mean,
    outside_band,
    ratio_edges,
    rows_above,
    rows_into,
    rows_outside,
    scaled,
    tokens_of,
)
from .plain import AGGREGATIONS, log_of, m2po_dropped
from .plain import statistic as plain_statistic

# ---------------------------------------------------------------------------------------------------------
# the pieces compositions share (made once per call; the batch's ratios are seqis/core/ratios.py)


@dataclass(eq=False)
class Cache:
    """The pieces several compositions of one call share, made when first asked: each statistic, its
    per-rollout aggregates and row extremes, clamped copies, token-weight profiles, the sparse rows of a
    token-level part. One per call (and one per sub-batch of sparse rows); never kept on a Ratios.

    profiles: a token weight in the rows form, on a per-batch profile (it pays when several compositions
    share it: run_many turns it on for more than one)."""

    profiles: bool = False
    _memo: dict = field(default_factory=dict)

    def memo(self, key, compute: Callable[[], object]):
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    def clamped(self, r: Ratios, c: float | None) -> Ratios:
        return r if c is None else self.memo(("clamped", c), lambda: r.clamped(c))

    def mask_f(self, r: Ratios) -> torch.Tensor:
        """(B, T) the loss mask as 0/1 floats, to multiply finite tensors by (shared, not to be written to)."""
        return self.memo("mask_f", lambda: as_float(r.mask, r.dtype))

    def logp(self, r: Ratios) -> torch.Tensor:
        """(B, T) log pi on loss tokens, 0 elsewhere (shared, not to be written to)."""
        return self.memo("logp", lambda: self._cleaned(r, r.trainer_logprobs))

    def logq(self, r: Ratios) -> torch.Tensor:
        """(B, T) log mu on loss tokens, 0 elsewhere (shared, not to be written to)."""
        return self.memo("logq", lambda: self._cleaned(r, r.inference_logprobs))

    def _cleaned(self, r: Ratios, x: torch.Tensor) -> torch.Tensor:
        return x.to(r.dtype).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0).mul_(self.mask_f(r))

    def k3(self, r: Ratios) -> torch.Tensor:
        """(B, T) k3 per token of r (shared, not to be written to)."""
        return r.k3 if r.k3 is not None else self.memo(("k3", r.clamp), lambda: k3_of(r.log_ratio)[0])

    def k3_rows(self, r: Ratios, rows: torch.Tensor, sub: Ratios | None = None) -> torch.Tensor:
        """(R, T) k3 of the given rollouts: taken from the (B, T) k3 if it was made, else made for them alone
        (from sub's l: r.rows(rows), when the caller has it)."""
        k3 = r.k3 if r.k3 is not None else self._memo.get(("k3", r.clamp))
        if k3 is not None:
            return k3.index_select(0, rows)
        return k3_of(sub.log_ratio if sub is not None else r.log_ratio.index_select(0, rows))[0]


# ---------------------------------------------------------------------------------------------------------
# the rejection rules


_SIGN = {"positive": torch.gt, "negative": torch.lt, "non-negative": torch.ge, "non-positive": torch.le}
Shared = tuple[Ratios, object, torch.Tensor]  # a (B, T) tensor shared per call: (its owner, its key, itself)


def criteria(r: Ratios, cache: Cache, rules: tuple[Criterion, ...]):
    """(gate, token rules, tripped): the rollout-level verdicts folded into one (B,) gate (valid rollouts only;
    None without any), the token-level ones as (criterion, advantage condition) pairs, and the (B, T) tokens
    each rule finds outside its band, as tensors or functions that build them (the "token_masked" mask; for
    max / min: the tokens that trip it). A rollout-level rule conditioned on per-token advantages drops tokens,
    so it is a token rule."""
    gate, token_rules, tripped, every_token = None, [], [], []
    for c in rules:
        cond = None if c.advantage is None else _SIGN[c.advantage](r.advantages, 0)  # (B,) or (B, T)
        if c.agg == "token" or (cond is not None and cond.dim() == 2):
            token_rules.append((c, cond))
        elif c.statistic == "ratio" and cond is None and not c.strict and c.edge_space == "log" and (
                (c.agg == "max" and c.low is None) or (c.agg == "min" and c.high is None)):
            every_token.append(c)  # every token's ratio below hi / above lo: one band, below
        else:
            fail = rollout_fails(r, cache, c)  # (B,)
            if cond is not None:
                fail &= cond
            gate = ~fail if gate is None else gate & ~fail
            if c.agg in ("max", "min"):
                tripped.append(partial(outside, r, cache, c))
    if every_token:  # max_t rho_t <= hi and min_t rho_t >= lo: a rollout with any token outside [lo, hi] goes
        lo = max([c.low for c in every_token if c.low is not None], default=0.0)
        hi = min([c.high for c in every_token if c.high is not None], default=math.inf)
        if r.shortcuts and log_of(lo) <= 0 <= log_of(hi):  # padding's l = 0 is inside: the row extremes answer,
            fail = rows_outside(*extremes(cache, (r, "ratio", r.log_ratio)), log_of(lo), log_of(hi))  # and the
            rows = fail.nonzero().squeeze(1)  # mask keeps only the failing rows' tokens
            l_rows = r.log_ratio.index_select(0, rows)
            out = partial(rows_into, r.mask.shape, rows, outside_band(r.mask.index_select(0, rows), l_rows,
                                                                      log_of(lo), log_of(hi)))
        else:
            out = outside_band(r.mask, r.log_ratio, log_of(lo), log_of(hi))  # (B, T)
            fail = any_per_row(out)
        gate = ~fail if gate is None else gate & ~fail
        tripped.append(out)
    if gate is not None:
        gate &= r.valid
    return gate, token_rules, tripped


@dataclass(frozen=True, eq=False)
class Drop:
    """A token rule given by its verdict, decided over the whole batch at once (M2PO's): the loss tokens it drops.
    It stands among a composition's token rules (keep_of, outside, the sparse rows); its rows of the batch, for
    the few rows the sparse form evaluates in full, are `rows(index)`."""

    tokens: torch.Tensor  # (B, T) bool, loss tokens only

    def rows(self, rows: torch.Tensor) -> Drop:
        return Drop(self.tokens.index_select(0, rows))


def batch_dropped(r: Ratios, cache: Cache, rule: BatchRule) -> Drop | None:
    """M2PO's dropped tokens, once per batch and threshold: the definition's own sort (evaluate.m2po_dropped) of
    the batch's l^2, on the unclamped log-ratios. None when it drops nothing, asked with shortcuts: a mean l^2
    below 0.9 threshold (one dot product, no sort: the definition's own margin), or a sort that drops nothing."""
    def compute():
        l, n = r.unclamped_log_ratio, float(r.n_tokens)  # (B, T), 0 off the loss mask
        if r.shortcuts and (n == 0 or float(dot(l, l)) / n < 0.9 * rule.threshold):
            return None
        tokens = m2po_dropped(l, r.mask, rule.threshold)  # (B, T) bool
        return None if r.shortcuts and not bool(any_per_row(tokens).any()) else Drop(tokens)

    return cache.memo(("batch rule", rule.threshold), compute)


def edges(c: Criterion) -> tuple[float, float]:
    """The band's edges, open sides as 0 (a ratio) or -inf, and inf."""
    return (c.low if c.low is not None else (0.0 if c.statistic == "ratio" else -math.inf),
            c.high if c.high is not None else math.inf)


def rule_edges(c: Criterion, dtype: torch.dtype) -> tuple[float, float, bool]:
    """(lo, hi, strict): the rule's band in its statistic's space, a ratio's as log-ratio edges; a ratio band in
    ratio space (exp(x) against C in the dtype) as the inclusive log-ratio edges that decide the same."""
    lo, hi = edges(c)
    if c.statistic != "ratio":
        return lo, hi, c.strict
    if c.edge_space == "ratio":
        return (*ratio_edges(lo, hi, dtype, c.strict), False)
    return log_of(lo), log_of(hi), c.strict


def weight_band(w: Weight, dtype: torch.dtype) -> tuple[float, float]:
    """The weight's band as inclusive log-ratio edges (in ratio space: the ones that decide the same)."""
    lo, hi = w.band
    return ratio_edges(lo, hi, dtype) if w.edge_space == "ratio" else (log_of(lo), log_of(hi))


def compared(c: Criterion, x: torch.Tensor) -> torch.Tensor:
    """(same shape) bool: x inside the rule's band, x in the statistic's space (a ratio's log): inclusive, or
    open edges (strict) with no rounding tolerance; a nan is inside no band."""
    lo, hi, strict = rule_edges(c, x.dtype)
    return (x > lo) & (x < hi) if strict else (x >= lo) & (x <= hi)


def statistic(r: Ratios, cache: Cache, name: str) -> torch.Tensor:
    """(B, T) the per-token statistic, 0 off the loss mask: log rho for "ratio" (its bands compare in log
    space), k1 = -l, k2 = l^2 / 2, k3 = rho - 1 - l, or prob_diff = exp(log pi) - exp(log mu) (the two log-probs,
    as prime-rl takes them).
    Shared, not to be written to."""
    if name == "ratio":
        return r.log_ratio
    if name == "k3":
        return cache.k3(r)
    make = {"k1": lambda: r.log_ratio.neg(), "k2": lambda: r.log_ratio.square().mul_(0.5),
            # torch.exp, not exp2: the decision on a band edge follows prime-rl's own arithmetic to the bit
            "prob_diff": lambda: torch.exp(cache.logp(r)).sub_(torch.exp(cache.logq(r)))}.get(name)
    if make is None:  # e^|l|, |rho - 1|, the binary KLs: the definition's own elementwise pass, 0 off the mask
        def make():  # in blocks of rows (blockwise: the same values as one pass)
            if name in ("exp_abs_log_ratio", "abs_ratio_minus_one"):  # from l alone, finite off the mask (l = 0)
                return blockwise(lambda lc, mf: plain_statistic(name, lc, None, None).mul_(mf), r.log_ratio,
                                 cache.mask_f(r))
            # the binary KLs: off the mask log pi = log mu = 0, and in float32 1 - 1e-8 is 1 (0 * log 0: nan)
            return blockwise(lambda lc, p, q, m: plain_statistic(name, lc, p, q).masked_fill_(~m, 0.0), r.log_ratio,
                             cache.logp(r), cache.logq(r), r.mask)
    return cache.memo((name, r.clamp), make)


def aggregate(r: Ratios, cache: Cache, name: str, agg: str) -> torch.Tensor:
    """(B,) the statistic's sum, mean, max or min over each rollout's loss tokens (computed once per call)."""
    def compute():
        if name == "k1" and agg in ("sum", "mean"):  # -S_j, -S_j / T_j: no (B, T) pass
            return (r.seq_log_ratio if agg == "sum" else r.geo_log_ratio).neg()
        if name == "k3" and agg in ("sum", "mean"):
            return r.k3_rollout if agg == "sum" else r.k3_rollout / r.length_1
        x = statistic(r, cache, name)  # (B, T), 0 off the mask
        if x.shape[-1] == 0:
            return x.sum(-1)
        if agg in ("sum", "mean"):
            total = x.sum(-1)
            return total if agg == "sum" else total / r.length_1
        if agg == "max" and name in ("k2", "k3"):  # >= 0: the zeros off the mask change no row's max
            return x.amax(-1)
        x = x.masked_fill(~r.mask, -math.inf if agg == "max" else math.inf)
        return x.amax(-1) if agg == "max" else x.amin(-1)

    return cache.memo(("aggregate", r.clamp, name, agg), compute)


def outside(r: Ratios, cache: Cache, c: Criterion) -> torch.Tensor:
    """(B, T) bool: the loss tokens whose own statistic lies outside the band (built when a mask is read)."""
    if isinstance(c, Drop):
        return c.tokens
    if c.statistic == "ratio" and not c.strict and c.edge_space == "log":
        lo, hi = edges(c)
        return outside_band(r.mask, r.log_ratio, log_of(lo), log_of(hi))
    return r.mask & ~compared(c, statistic(r, cache, c.statistic))


def rollout_fails(r: Ratios, cache: Cache, c: Criterion) -> torch.Tensor:
    """(B,) bool: the rollouts whose aggregated statistic lies outside the band (a product or geometric ratio
    under clamp order "aggregate": from the unclamped log-ratios, the aggregate clamped)."""
    lo, hi = edges(c)
    product = c.statistic == "ratio" and c.agg in ("mean", "sum")
    tolerant = c.statistic == "ratio" and not c.strict and c.edge_space == "log"
    clamp = None
    if product and r.raw is not None:
        r, clamp = r.raw, r.aggregate_clamp
    if product and tolerant:  # the geometric or product ratio, edges tolerant
        x, tol = (r.geo_log_ratio, r.edge_tolerance) if c.agg == "mean" else (r.seq_log_ratio,
                                                                              r.edge_tolerance * r.length)
        return ~in_band(_clamped(x, clamp), lo, hi, tol)
    x = (r.geo_log_ratio if c.agg == "mean" else r.seq_log_ratio) if product else aggregate(r, cache, c.statistic,
                                                                                              c.agg)  # (B,)
    if tolerant:
        return ~in_band(x, lo, hi)
    return ~compared(c, _clamped(x, clamp))  # nan fails


def keep_of(r: Ratios, cache: Cache, c: Criterion, cond: torch.Tensor | None) -> torch.Tensor:
    """(B, T) 0/1 floats: the loss tokens a token rule keeps (a rollout rule under per-token advantages: all
    but the failing rollouts' tokens of the advantage's sign; a Drop: every loss token it does not drop)."""
    if isinstance(c, Drop):
        return cache.mask_f(r) - as_float(c.tokens, r.dtype)  # (B, T) a new tensor: the caller writes to it
    if c.agg == "token":
        lo, hi = edges(c)
        x = statistic(r, cache, c.statistic)
        if c.strict or c.edge_space == "ratio":
            keep = as_float(compared(c, x), r.dtype)  # (B, T) 1.0 inside the open band (or the ratio's)
        else:
            keep = band_f(x, log_of(lo), log_of(hi)) if c.statistic == "ratio" else x.clamp(lo, hi).eq_(x)
    else:
        keep = as_float(~rollout_fails(r, cache, c), r.dtype)[:, None]  # (B, 1)
    if cond is not None:  # the rule drops only where A has the sign: every other token is kept
        exempt = as_float(~cond, r.dtype)
        exempt = exempt if exempt.dim() == 2 else exempt[:, None]
        if keep.shape == torch.broadcast_shapes(keep.shape, exempt.shape):  # in place on its own (B, T) keep
            keep = torch.maximum(keep, exempt, out=keep)
        else:
            keep = torch.maximum(keep, exempt)
    mask_f = cache.mask_f(r)
    return keep.mul_(mask_f) if keep.shape == mask_f.shape else keep * mask_f


def extremes(cache: Cache, shared: Shared) -> tuple[torch.Tensor, torch.Tensor]:
    """(B,) row maxima and minima of a shared (B, T) tensor, made once per call."""
    owner, key, x = shared
    if x is owner.log_ratio and owner.row_max is not None:  # made with the log-ratios
        return owner.row_max, owner.row_min
    return cache.memo(("extremes", owner.clamp, key), lambda: row_extremes(x))


def token_keep(cache: Cache, rules, band) -> torch.Tensor | None:
    """(B, T) 0/1: the loss tokens every token rule (and the weight's band) keeps; None without any."""
    keeps = [band] if band is not None else []
    keeps += [keep_of(rc, cache, c, cond) for rc, c, cond in rules]
    if not keeps:
        return None
    keep = keeps[0]
    for k in keeps[1:]:
        keep.mul_(k)
    return keep


# ---------------------------------------------------------------------------------------------------------
# a composition on the batch: its Correction, in the rows or the tokens form


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
    """What a composition does to one batch; `_outputs` turns it into the output. Two forms:

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
    if w.per_rollout:
        out = _rollout_weight(r, cache, w, comp.log_ratio_clamp, gate, rules, tripped, each)
    else:
        out = _token_weight(r, cache, w, comp.log_ratio_clamp, gate, rules, tripped, each)
    left = _left_out(r, rc, cache, comp.criteria, drop)
    if left is not None and not (r.shortcuts and not bool(left > 0)):  # the kept weights scale by N / N_after
        factor = r.n_tokens / (r.n_tokens - left).clamp(min=1)  # ()
        out.row_weight = factor.expand(r.length.shape) if out.row_weight is None else out.row_weight * factor
    return out


def _left_out(r: Ratios, rc: Ratios, cache: Cache, rules: tuple[Criterion, ...], drop: Drop | None):
    """() how many loss tokens leave the loss's token count N, each counted once: those a rule with
    leaves_normaliser drops (NeMo-RL's sample_mask: a rollout rule's whole rollouts) and the batch rule's
    (M2PO's). None when no part takes tokens out of N."""
    rows, tokens = None, [] if drop is None else [drop.tokens]
    for c in rules:
        if not c.leaves_normaliser:
            continue
        cond = None if c.advantage is None else _SIGN[c.advantage](rc.advantages, 0)  # (B,) or (B, T)
        if c.agg != "token" and (cond is None or cond.dim() == 1):  # a verdict on whole rollouts
            fail = rollout_fails(rc, cache, c)  # (B,)
            fail = fail if cond is None else fail & cond
            rows = fail if rows is None else rows | fail
        else:  # a verdict per token: the loss tokens it does not keep
            tokens.append(keep_of(rc, cache, c, cond).ne_(cache.mask_f(rc)).bool())
    if rows is None and not tokens:
        return None
    n = gated(rows, r.length).sum() if rows is not None else r.n_tokens.new_zeros(())
    if tokens:
        out = _union(tokens)  # (B, T) bool
        n = n + (out if rows is None else tokens_of(out, ~rows)).sum()
    return n


def _clamped(x: torch.Tensor, clamp: float | None) -> torch.Tensor:
    return x if clamp is None else x.clamp(-clamp, clamp)


def _exponent(r: Ratios, cache: Cache, level: str, clamp: float | None, each: bool = False) -> Shared:
    """A token or prefix weight's exponent (l_t or sum_{s<=t} l_s, clamped; each: the prefix sums of the
    clamped l_s) (B, T), shared: not to be written to. Off the loss mask it holds 0 or (a prefix) the value of
    the row's last loss token before it."""
    if level == "token" or (each and clamp is not None):  # the clamped record's own log-ratios (or their sums)
        rc = cache.clamped(r, clamp)
        if level == "token":
            return rc, "ratio", rc.log_ratio
        r, clamp = rc, None
    key = ("prefix", clamp)
    return r, key, cache.memo((key, r.clamp), lambda: _clamped(r.log_ratio.cumsum(-1), clamp))


def _truncated_rows(r: Ratios, cache: Cache, w: Weight, ex: Shared) -> torch.Tensor:
    """(B,) bool: the rows with a loss token whose weight exponent x lies beyond the truncation (from the row
    extremes where an edge is on the far side of 0, which padding holds, else from the mask)."""
    (x_max, x_min), x = extremes(cache, ex), ex[2]
    c = log_of(w.upper)
    clipped = x_max > c if c >= 0 else rows_above(x, r.mask, c)
    if w.clip_low > 0:
        c = log_of(w.clip_low)
        clipped |= x_min < c if c <= 0 else rows_above(x.neg(), r.mask, -c)
    return clipped


def _rollout_weight(r: Ratios, cache: Cache, w: Weight, clamp, gate, rules, tripped, each=False) -> Correction:
    """A sequence or geometric weight: one finite weight per rollout (each: of the clamped log-ratios' sum or
    mean, with no clamp after it; per token under VESPO's gamma with per-token advantages)."""
    rw = cache.clamped(r, clamp) if each else r  # the record whose sums the weight reads
    if w.token_clip is not None:  # the product of the token ratios, each clamped, then truncated
        x = _token_clipped_sum(r, cache, clamp, w.token_clip)  # (B,)
    else:
        x = rw.seq_log_ratio if w.level == "sequence" else rw.geo_log_ratio  # (B,)
    x = x if each else _clamped(x, clamp)
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
        ok = r.valid & in_log_band(x, *weight_band(w, r.dtype), tol)
        gate = ok if gate is None else gate & ok
    if w.self_normalize:  # by the mean over valid rollouts, before the criteria
        count = max(len(r.valid), 1) if w.normalize_all else r.n_valid  # slime's: every rollout, empty ones too
        mean = gated(r.valid & (ok if w.band is not None else r.valid), weight).sum() / count
        weight = weight / torch.where(mean > 1e-8, mean, 1.0)
    if gate is not None:
        weight = gated(gate, weight)
        clipped = clipped & gate if clipped is not None else None
    sparse = _sparse(r, cache, gate, rules, tripped, None, clamp, row_weight=weight, clipped=clipped)
    return sparse or _filtered(r, cache, gate, rules, tripped, {}, row_weight=weight, clipped=clipped)


def _token_clipped_sum(r: Ratios, cache: Cache, clamp: float | None, token_clip: float) -> torch.Tensor:
    """(B,) sum over each rollout's loss tokens of min(l_t, log token_clip), l_t clamped to [-c, c] (TRL's token
    TIS inside VESPO), once per call. With shortcuts only the rows with a token above the clip are summed anew
    (found by the row maxima, which padding's 0 can only over-report); every other row's sum is S_j itself."""
    rc, a = cache.clamped(r, clamp), log_of(token_clip)

    def compute():
        if a == math.inf:
            return rc.seq_log_ratio
        if not rc.shortcuts:
            return torch.where(rc.mask, rc.log_ratio.clamp(max=a), 0.0).sum(-1)
        rows = (extremes(cache, (rc, "ratio", rc.log_ratio))[0] > a).nonzero().squeeze(1)  # (R,)
        if len(rows) == 0:
            return rc.seq_log_ratio
        l, m = rc.log_ratio.index_select(0, rows), rc.mask.index_select(0, rows)  # (R, T)
        return rc.seq_log_ratio.index_copy(0, rows, torch.where(m, l.clamp(max=a), 0.0).sum(-1))

    return cache.memo(("token clipped sum", rc.clamp, a), compute)


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
    if gate is not None:
        weight = gated(gate, weight)
    sparse = _sparse(r, cache, gate, rules, tripped, None, clamp, row_weight=weight)
    return sparse or _filtered(r, cache, gate, rules, tripped, {}, row_weight=weight)


def _token_weight(r: Ratios, cache: Cache, w: Weight, clamp, gate, rules, tripped, each=False) -> Correction:
    """A token or prefix weight (B, T), or none (1 on every kept token)."""
    sparse = _sparse(r, cache, gate, rules, tripped, w, clamp, each=each)
    if sparse is not None:
        return sparse
    if w.level == "none":
        return _filtered(r, cache, gate, rules, tripped, {})
    ex = _exponent(r, cache, w.level, clamp, each)
    x = ex[2]
    shared = cache.profiles and not w.truncated and not w.self_normalize  # exp(x) as it is: the shared profile
    exact = w.edge_space == "ratio"  # torch.exp, as the framework that decides the band in ratio space
    if shared:
        weights = cache.memo(("profile", ex[0].clamp, ex[1], exact), lambda: _profile(r, cache, x, exact)).values
    else:
        weights = capped_exp(x if w.clip_low == 0 else x.clamp(min=log_of(w.clip_low)), w.upper, exact)  # (B, T)
    masks, clipped = {}, None
    if w.truncated:
        clipped = _truncated_rows(r, cache, w, ex)
        if gate is not None:
            clipped &= gate
        masks["clipped"] = partial(_clipped_tokens, r.mask, gate, x, w)  # built if read
    band = None
    if w.band is not None:  # outside the band the token is dropped
        edges_ = weight_band(w, r.dtype)
        band = band_keep(x, cache.mask_f(r), *edges_)  # (B, T) 0/1
        tripped = [partial(outside_band, r.mask, x, *edges_), *tripped]
    if w.self_normalize:  # by the mean over all loss tokens, before the criteria
        applied = weights * (band if band is not None else cache.mask_f(r))
        mean = applied.sum() / r.n_tokens.clamp(min=1)
        weights.div_(torch.where(mean > 1e-8, mean, 1.0))
    return _filtered(r, cache, gate, rules, tripped, masks, token_weights=weights, clipped=clipped, band=band,
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


def _shared_parts(r: Ratios, gate, tripped, masks, clipped) -> dict:
    """The metrics every form reports (is_token_masked filled in by the caller) and the "token_masked" mask."""
    n_tok = r.n_tokens.clamp(min=1)
    zero = n_tok.new_zeros(())
    metrics = {"is_clipped": r.valid_mean(as_float(clipped, r.dtype)) if clipped is not None else zero,
               "is_token_masked": zero,
               "is_traj_masked": gated(~gate, r.length).sum() / n_tok if gate is not None else zero}
    if len(tripped) == 1 and isinstance(tripped[0], torch.Tensor):
        masks["token_masked"] = tripped[0]
    elif tripped:
        masks["token_masked"] = partial(_union, tripped)
    return metrics


def _filtered(r: Ratios, cache: Cache, gate, rules, tripped, masks, *, row_weight=None, token_weights=None,
              clipped=None, band=None, shared_weights=False) -> Correction:
    """The Correction in the tokens form: kept = the loss tokens of the gated rollouts that every token rule
    (and the weight's band) keeps (the rows form when there is no token rule, band or token weight)."""
    tripped = [*tripped, *(partial(outside, rc, cache, c) for rc, c, _ in rules)]
    metrics = _shared_parts(r, gate, tripped, masks, clipped)
    form = {}
    keep = token_keep(cache, rules, band)
    if keep is not None:
        kept_len = keep.sum(-1)  # (B,) before the gate
        if gate is not None:
            keep.mul_(as_float(gate, r.dtype)[:, None])
        metrics["is_token_masked"] = (r.n_tokens - kept_len.sum()) / r.n_tokens.clamp(min=1)
        form = dict(keep=keep, kept_len=gated(gate, kept_len) if gate is not None else kept_len)
    return Correction(row_weight=row_weight, token_weights=token_weights, shared_weights=shared_weights, gate=gate,
                      clipped=clipped, masks=masks, metrics=metrics, **form)


def _sparse(r: Ratios, cache: Cache, gate, rules, tripped, w: Weight | None, clamp, *, row_weight=None,
            clipped=None, each=False) -> Correction | None:
    """The rows form of a correction with token-level parts (token rules; a token or prefix weight, truncated,
    banded or self-normalised), when shortcuts are on and those parts change the tokens of few rollouts: the
    row maxima and minima of each statistic find those rows, only they are evaluated in full (on a record of
    their own), and every other row keeps all its loss tokens at the weight's untruncated value (a profile
    shared per call; only when the cache says so). The token-level part is shared by the corrections that have
    the same one. None when it does not apply (a rule under per-token advantages; too many rows): then the
    tokens form follows."""
    token_weight = w is not None and w.level in ("token", "prefix")
    if not r.shortcuts or not (rules or token_weight) or (token_weight and not cache.profiles):
        return None
    if any(cond is not None and cond.dim() == 2 for _, _, cond in rules):
        return None
    own_w = replace(w, self_normalize=False) if token_weight else None
    part = cache.memo(("sparse", own_w, tuple(c for _, c, _ in rules), clamp, each),
                      lambda: _sparse_rows(r, cache, own_w, clamp, rules, each))
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
        ex = _exponent(r, cache, w.level, clamp, each)
        x = ex[2]
        exact = w.edge_space == "ratio"
        profile = cache.memo(("profile", ex[0].clamp, ex[1], exact), lambda: _profile(r, cache, x, exact))
        if w.truncated:
            clipped = _truncated_rows(r, cache, w, ex)
            if gate is not None:
                clipped &= gate
            masks["clipped"] = partial(_clipped_tokens, r.mask, gate, x, w)
        if w.band is not None:
            tripped = [partial(outside_band, r.mask, x, *weight_band(w, r.dtype)), *tripped]
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


def _rows_outside_band(shape, rows: torch.Tensor, sub: Ratios, c: Criterion) -> torch.Tensor:
    """(B, T) bool: the loss tokens outside the rule's band, found in the given rows (`sub` holds them)."""
    return rows_into(shape, rows, outside(sub, Cache(), c))


def _sparse_rows(r: Ratios, cache: Cache, w: Weight | None, clamp, rules, each=False):
    """(KeptRows, kept tokens per rollout (B,), the kept rows' summed (truncated, banded) weights, their clamped
    record) of a token-level part ((None, lengths, None, None) when no row is touched), or None when it changes
    the tokens of more than r.sparse_share of the rollouts."""
    hit = torch.zeros_like(r.valid)
    if w is not None:
        ex = _exponent(r, cache, w.level, clamp, each)
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
        own = _token_weight(sub, sub_cache, w, w_clamp, None, sub_rules, [], each)
        keep = own.keep if own.keep is not None else sub_cache.mask_f(sub)
        x = _exponent(sub, sub_cache, w.level, w_clamp, each)[2]
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


def _profile(r: Ratios, cache: Cache, x: torch.Tensor, exact: bool = False) -> Profile:
    """The untruncated token weights exp(x) (with the e^40 cap; exact: torch.exp), 0 off the loss mask, and their
    row sums."""
    values = capped_exp(x, exact=exact).mul_(cache.mask_f(r))
    return Profile(values, values.sum(-1), dot_rows(values, cache.logp(r)))


# ---------------------------------------------------------------------------------------------------------
# the output: the surrogate loss (plus any penalty), the metrics and the per-rollout values


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


def token_scale(r: Ratios, n_kept: torch.Tensor, agg: str) -> torch.Tensor:
    """The normaliser each aggregation applies: a () or (B, 1) factor s with loss = -sum(s * coef * logp)."""
    if agg == "token-mean":  # N = every loss token, dropped ones included (prime-rl)
        return r.n_tokens.clamp(min=1).reciprocal()
    if agg == "kept-token-mean":  # N = kept tokens only
        return n_kept.clamp(min=1).reciprocal()
    n_seq = r.n_valid
    if agg == "seq-mean-token-mean":
        return (r.length_1 * n_seq).reciprocal()[:, None]
    return n_seq.reciprocal()  # seq-mean-token-sum


def _token_weights(r: Ratios, mask_f: torch.Tensor, c: Correction) -> torch.Tensor:
    """A token-level correction's (B, T) weights before adv_tau * A, built in place on its own tensors (its keep
    mask becomes them when its token weights are a shared profile)."""
    if c.token_weights is None:
        w = c.keep
    elif c.shared_weights:
        w = c.keep.mul_(c.token_weights) if c.keep is not None else c.token_weights * mask_f
    else:
        w = c.token_weights.mul_(c.keep if c.keep is not None else mask_f)
    if c.keep is None and c.gate is not None:  # a rollout gate on token weights (geo_mask's hybrid)
        w.mul_(as_float(c.gate, r.dtype)[:, None])
    return w if c.row_weight is None else w.mul_(c.row_weight[:, None])


def _outputs(r: Ratios, pieces: Cache, batch: Batch, c: Correction, comp: Composition, agg: str,
             again: Callable[[], Correction], n: int = 1) -> list[EstimatorOutput]:
    """Loss, weights, masks, metrics and per-rollout values from a correction, for n keys that name it: n
    outputs, each with its own loss node, sharing every other tensor (detached, not to be written to).

    A correction in the rows form never makes a (B, T) float tensor of its own in the forward: its loss and
    metrics are per-rollout sums, and the backward writes the gradient in one pass. A tokens-form correction's
    own (B, T) tensor becomes the gradient in place, so its weights and kept mask, when somebody reads them,
    come from `again()`, the composition evaluated anew. Every (B, T) tensor derived from log-ratios is finite,
    so masking them by multiplying with the 0/1 mask is safe; trainer_logprobs may hold -inf / NaN on padding
    and only enters the loss through the record's cleaned copy."""
    token_level = c.per_token
    # the rows form reads the loss mask as it is (bool); the tokens form multiplies by it as 0/1 floats
    mask_f = pieces.mask_f(r) if token_level else None

    @once
    def rebuilt() -> tuple[torch.Tensor, torch.Tensor | None]:  # a token-level output's weights and kept mask,
        c2 = again()  # from one fresh evaluation, made when either is first read
        kept_mask = c2.keep.bool() if c2.keep is not None else None
        return _token_weights(r, mask_f, c2), kept_mask

    # which tokens keep a gradient, per rollout (closures hold the mask, not the record: a sequence-level output
    # lets the batch's (B, T) log-ratios go)
    kept_rows, mask = c.kept_rows, r.mask
    if c.keep is not None:
        kept_len = c.kept_len if c.kept_len is not None else c.keep.sum(-1)  # (B,)
        kept = lambda: rebuilt()[1]
    elif kept_rows is not None:  # the sparse form: all loss tokens but in a few rows, times the gate
        gate = c.gate if c.gate is not None else r.valid
        kept_len = c.kept_len if c.kept_len is not None else gated(gate, row_sums(r.length, kept_rows, "count"))
        dtype = r.dtype
        kept = lambda: spread(as_float(gate, dtype), mask, kept_rows).bool()
    elif c.gate is not None:
        kept_len = gated(c.gate, r.length)
        kept = partial(tokens_of, r.mask, c.gate)
    else:
        kept_len, kept = r.length, r.mask
    accepted = c.gate if c.gate is not None else kept_len > 0  # (B,)
    n_tok, n_kept = r.n_tokens, kept_len.sum()

    # common metrics: mismatch KL split into dropped / kept tokens (read `kept` before the loss takes it)
    # per rollout, kept and dropped: a rollout that keeps every token drops exactly 0 (the difference of the batch's
    # sums, 2^-15 of rounding on a batch that dropped nothing, was reported as the dropped tokens' KL)
    if c.keep is not None:
        kept_k3 = dot_rows(pieces.k3(r), c.keep)  # (B,)
    else:
        kept_k3 = gated(accepted, row_sums(r.k3_rollout, kept_rows, "k3"))  # (B,)
    k3_kept, k3_dropped = kept_k3.sum(), (r.k3_rollout - kept_k3).sum()
    common = r.batch_metrics
    metrics = {
        "mismatch_kl": common["mismatch_kl"],
        "masked_mismatch_kl": k3_dropped / (n_tok - n_kept).clamp(min=1),
        "unmasked_mismatch_kl": k3_kept / n_kept.clamp(min=1),
        "is_masked": (n_tok - n_kept) / n_tok.clamp(min=1),
        "seq_log_ratio": common["seq_log_ratio"],
        "geo_log_ratio": common["geo_log_ratio"],
        **c.metrics,
    }

    # surrogate loss = -sum(scale * weight * adv_tau * A * log pi) over loss tokens
    scale = token_scale(r, n_kept, agg)  # () or (B, 1)
    row = scale.expand(r.length.shape) if scale.dim() == 0 else scale[:, 0]  # (B,)
    adv = as_dtype(batch.advantages, r.dtype) * comp.adv_tau
    if adv.dim() == 2:  # per-token advantages: part of the token coefficient
        adv_tok, row_adv = torch.where(r.mask, adv, 0.0), -row
    else:
        adv_tok, row_adv = None, -row * adv

    def gradient(w: torch.Tensor) -> torch.Tensor:  # (B, T) weights -> d loss / d log pi, in place
        return (w if adv_tok is None else w.mul_(adv_tok)).mul_(row_adv[:, None])

    shortcuts, length = r.shortcuts, r.length_1
    if token_level:
        w = _token_weights(r, mask_f, c)
        weight = kept_len / length if c.token_weights is None and c.row_weight is None else w.sum(-1) / length
        weights = lambda: rebuilt()[0]
        G = gradient(w)
        value = dot(G, pieces.logp(r))
        shared = SharedGradient(G, lambda: gradient(_token_weights(r, mask_f, again())), n)
        grad_of = lambda first, g: scaled(shared.take(first), g, shortcuts)
    else:
        base = c.profile.values if c.profile is not None else mask  # each kept token's weight before token_w
        seq_w = c.row_weight if c.row_weight is not None else torch.ones_like(r.length)
        token_w = gated(accepted, seq_w) if c.gate is not None else seq_w  # (B,) times base on each kept token
        if c.profile is not None:  # mean applied weight over the loss tokens
            weight = token_w * row_sums(c.profile.sums, kept_rows, "factor_sums") / length
        else:
            weight = token_w if kept_rows is None else token_w * kept_len / length
        weights = once(lambda: spread(token_w, base, kept_rows, weighted=True))
        if adv_tok is None:  # one coefficient per rollout: no (B, T) tensor in the forward
            row_coef = row_adv * token_w  # (B,) d loss / d log pi on each kept token, per unit of base
            full = c.profile.logp_sums if c.profile is not None else r.logp_rowsum
            value = (row_coef * row_sums(full, kept_rows, "logp")).sum()
            grad_of = lambda first, g: spread(row_coef * g, base, kept_rows, weighted=True)
        else:
            rebuild = lambda: gradient(spread(token_w, base, kept_rows, weighted=True))
            G = rebuild()
            value = dot(G, pieces.logp(r))
            shared = SharedGradient(G, rebuild, n)
            grad_of = lambda first, g: scaled(shared.take(first), g, shortcuts)

    if comp.penalty is not None:
        penalty, add_penalty = _penalty(r, pieces, comp.penalty, scale)
        value = value + penalty
        metrics["penalty"] = penalty
        pg_of = grad_of
        grad_of = lambda first, g: add_penalty(pg_of(first, g), g)
    weight = weight * r.valid_f  # an empty rollout applies no weight (every weight is finite)
    metrics["seq_weight"] = masked_mean(weight, r.valid & (kept_len > 0))

    own = dict(c.masks)
    if c.gate is not None:  # a rollout gate: the loss tokens of the rollouts it rejects
        own.setdefault("traj_masked", partial(tokens_of, r.mask, ~c.gate))
    if c.clipped is not None:
        clipped = c.clipped & r.valid
        own.setdefault("clipped", partial(tokens_of, r.mask, clipped))
    masks = Masks({"kept": kept, **own})
    if c.clipped is None:
        clipped = any_per_row(masks["clipped"]) if "clipped" in masks else torch.zeros_like(r.valid)
    rollouts = {
        "length": r.length,
        "seq_log_ratio": r.seq_log_ratio,
        "geo_log_ratio": r.geo_log_ratio,
        "weight": weight,
        "accepted": accepted & r.valid,
        "clipped": clipped,
        "kept_fraction": kept_len / length,
    }
    logp = as_dtype(batch.trainer_logprobs, r.dtype)  # (B, T) differentiable: the loss nodes' input
    return [EstimatorOutput(loss=loss, weights=weights, masks=masks, metrics=dict(metrics), rollouts=dict(rollouts))
            for loss in known_losses(logp, value, grad_of, n)]


def _penalty(r: Ratios, cache: Cache, p: Penalty, scale: torch.Tensor):
    """(value, add): coef * sum over loss tokens of s_t f(l_t), and add(G, g), which adds its d / d log pi times
    g to a (B, T) gradient G in place (no (B, T) tensor of its own): f = l^2 (f' = 2 l) or k3 = rho - 1 - l
    (f' = rho - 1 = k3 + l), on the batch's cleaned log-ratios (0 on padding: no gradient there). scale: the
    aggregation's normaliser, () or (B, 1)."""
    l = r.unclamped_log_ratio  # (B, T), 0 off the loss mask
    row_scale = scale if scale.dim() == 0 else scale[:, 0]  # () or (B,)
    if p.statistic == "squared_log_ratio":
        l2 = dot_rows(l, l)  # (B,) sum of l^2 over each rollout's loss tokens
        factor = scale * (2 * p.coef)
        return (row_scale * l2).sum() * p.coef, lambda G, g: G.addcmul_(l, factor * g)
    k3 = cache.k3(r)
    factor = scale * p.coef
    return ((r.k3_rollout * row_scale).sum() * p.coef,
            lambda G, g: G.addcmul_(k3, factor * g).addcmul_(l, factor * g))


# ---------------------------------------------------------------------------------------------------------
# the entry point


def evaluate_many(named: dict[Composition, int], batch: Batch, agg: str = "token-mean",
                  ratios: Ratios | None = None, *, profiles: bool | None = None
                  ) -> dict[Composition, list[EstimatorOutput]]:
    """Each composition on the batch, as many outputs as `named` says keys name it (each its own loss node;
    the outputs of one composition share every other tensor). One Ratios and one Cache serve them all.
    profiles: token weights on a shared profile (None: when there are several compositions; the tests force
    it on and off to hold every form to the plain evaluator)."""
    if agg not in AGGREGATIONS:
        raise ValueError(f"agg must be one of {', '.join(AGGREGATIONS)}; got {agg!r}")
    several = len(named) > 1
    r = ratios if ratios is not None else ratios_for(batch, named)  # given without k3: Cache.k3 makes it if read
    pieces = Cache(profiles=several if profiles is None else profiles)  # pays when several share it
    out = {}
    for comp, n in named.items():
        again = partial(correction, r, pieces, comp)
        out[comp] = _outputs(r, pieces, batch, again(), comp, agg, again, n)
    return out


# the parts of a composition this module knows; a composition with any other part goes to the plain evaluator
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
    """Whether a token rule on the ratio, or a sequence weight's token clip, will ask for the rows' extremes of l
    (Ratios.of makes them with l)."""
    return any(c.statistic == "ratio" for c in comp.token_rules) or comp.weight.token_clip not in (None, math.inf)


def supports(comp: Composition) -> bool:
    """Whether this module evaluates the composition (every part one it knows), or the plain evaluator does."""
    return (comp.weight.level in WEIGHT_LEVELS and all(c.agg in AGGREGATES for c in comp.criteria)
            and (comp.penalty is None or comp.penalty.statistic in PENALTIES)
            and comp.centering is None)  # score centering reads the sampler's head: the plain evaluator's
