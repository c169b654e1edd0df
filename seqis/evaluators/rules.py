"""The fast evaluator's rejection rules (seqis/evaluators/fast.py): each criterion as a (B,) rollout verdict or a
(B, T) token keep, read from the batch's `Ratios` and from a `Cache` of what several compositions of one call share
(a statistic, its per-rollout aggregates and row extremes, a clamped copy, the sparse rows of a token rule). Every
function computes what seqis/evaluators/plain.py defines; tests/test_evaluators.py holds them to it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import torch

from ..core.compose import BatchRule, Criterion
from ..core.ratios import Ratios, as_float, dot, k3_of, row_extremes
from .kernels import (
    any_per_row,
    band_f,
    gated,
    in_band,
    outside_band,
    rows_outside,
    tokens_of,
)
from .plain import edges, log_of, m2po_dropped, within
from .plain import statistic as plain_statistic


@dataclass(eq=False)
class Cache:
    """The pieces several compositions of one call share, made when first asked: each statistic, its
    per-rollout aggregates and row extremes, clamped copies, the sparse rows of a token rule. One per call (and
    one per sub-batch of sparse rows); never kept on a Ratios."""

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


# ---------------------------------------------------------------------------------------------------------
# the rejection rules


SIGN = {"positive": torch.gt, "negative": torch.lt, "non-negative": torch.ge, "non-positive": torch.le}

Shared = tuple[Ratios, object, torch.Tensor]  # a (B, T) tensor shared per call: (its owner, its key, itself)


def criteria(r: Ratios, cache: Cache, rules: tuple[Criterion, ...]):
    """(gate, token rules, tripped): the rollout-level verdicts folded into one (B,) gate (valid rollouts only;
    None without any), the token-level ones as (criterion, advantage condition) pairs, and the (B, T) tokens
    each rule finds outside its band, as tensors or functions that build them (the "token_masked" mask; for
    max / min: the tokens that trip it). A rollout-level rule conditioned on per-token advantages drops tokens,
    so it is a token rule."""
    gate, token_rules, tripped, every_token = None, [], [], []
    for c in rules:
        cond = None if c.advantage is None else SIGN[c.advantage](r.advantages, 0)  # (B,) or (B, T)
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
        lo = log_of(max([c.low for c in every_token if c.low is not None], default=0.0))
        hi = log_of(min([c.high for c in every_token if c.high is not None], default=math.inf))
        if r.shortcuts and lo <= 0 <= hi:  # padding's l = 0 is inside: the row extremes answer, and the mask is
            fail = rows_outside(*extremes(cache, (r, "ratio", r.log_ratio)), lo, hi)  # the failing rows' tokens,
            rows, mask = fail.nonzero().squeeze(1), r.mask  # found now: built when read without holding l (B, T)
            few = outside_band(mask.index_select(0, rows), r.log_ratio.index_select(0, rows), lo, hi)
            out = lambda: torch.zeros_like(mask).index_copy_(0, rows, few)  # noqa: E731
        else:
            out = outside_band(r.mask, r.log_ratio, lo, hi)  # (B, T)
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


def log_edges(c: Criterion) -> tuple[float, float]:
    """A rule's band in its statistic's space, a ratio's as log-ratio edges (for a band decided in log space)."""
    lo, hi = edges(c)
    return (log_of(lo), log_of(hi)) if c.statistic == "ratio" else (lo, hi)


def compared(c: Criterion, x: torch.Tensor) -> torch.Tensor:
    """(same shape) bool: x inside the rule's band, x in the statistic's space (a ratio's log): inclusive, or
    open edges (strict) with no rounding tolerance, or in ratio space exp(x) against the edges in x's dtype (the
    definition's own comparison); a nan is inside no band."""
    return within(x, c.statistic, *edges(c), c.strict, c.edge_space)


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
        def make():
            if name in ("exp_abs_log_ratio", "abs_ratio_minus_one"):  # from l alone, finite off the mask (l = 0)
                return plain_statistic(name, r.log_ratio, None, None).mul_(cache.mask_f(r))
            # the binary KLs: off the mask log pi = log mu = 0, and in float32 1 - 1e-8 is 1 (0 * log 0: nan)
            return plain_statistic(name, r.log_ratio, cache.logp(r), cache.logq(r)).masked_fill_(~r.mask, 0.0)
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
        return ~in_band(clamped_to(x, clamp), lo, hi, tol)
    x = (r.geo_log_ratio if c.agg == "mean" else r.seq_log_ratio) if product else aggregate(r, cache, c.statistic,
                                                                                              c.agg)  # (B,)
    if tolerant:
        return ~in_band(x, lo, hi)
    return ~compared(c, clamped_to(x, clamp))  # nan fails


def keep_of(r: Ratios, cache: Cache, c: Criterion, cond: torch.Tensor | None) -> torch.Tensor:
    """(B, T) 0/1 floats: the loss tokens a token rule keeps (a rollout rule under per-token advantages: all
    but the failing rollouts' tokens of the advantage's sign; a Drop: every loss token it does not drop)."""
    if isinstance(c, Drop):
        return cache.mask_f(r) - as_float(c.tokens, r.dtype)  # (B, T) a new tensor: the caller writes to it
    if c.agg == "token":
        x = statistic(r, cache, c.statistic)
        if c.strict or c.edge_space == "ratio":
            keep = as_float(compared(c, x), r.dtype)  # (B, T) 1.0 inside the open band (or the ratio's)
        else:
            keep = band_f(x, *log_edges(c))
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
# what several parts share


def left_out(r: Ratios, rc: Ratios, cache: Cache, rules: tuple[Criterion, ...], drop: Drop | None):
    """() how many loss tokens leave the loss's token count N, each counted once: those a rule with
    leaves_normaliser drops (NeMo-RL's sample_mask: a rollout rule's whole rollouts) and the batch rule's
    (M2PO's). None when no part takes tokens out of N."""
    rows, tokens = None, [] if drop is None else [drop.tokens]
    for c in rules:
        if not c.leaves_normaliser:
            continue
        cond = None if c.advantage is None else SIGN[c.advantage](rc.advantages, 0)  # (B,) or (B, T)
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
        out = union(tokens)  # (B, T) bool
        n = n + (out if rows is None else tokens_of(out, ~rows)).sum()
    return n


def clamped_to(x: torch.Tensor, clamp: float | None) -> torch.Tensor:
    return x if clamp is None else x.clamp(-clamp, clamp)


def union(parts) -> torch.Tensor:
    """(B, T) bool: the union of masks given as tensors or as functions that build them."""
    built = [p if isinstance(p, torch.Tensor) else p() for p in parts]
    out = built[0]
    for m in built[1:]:
        out = out | m
    return out


def shared_parts(r: Ratios, gate, tripped, masks, clipped) -> dict:
    """The metrics every form reports (is_token_masked filled in by the caller) and the "token_masked" mask."""
    n_tok = r.n_tokens.clamp(min=1)
    zero = n_tok.new_zeros(())
    metrics = {"is_clipped": r.valid_mean(as_float(clipped, r.dtype)) if clipped is not None else zero,
               "is_token_masked": zero,
               "is_traj_masked": gated(~gate, r.length).sum() / n_tok if gate is not None else zero}
    if len(tripped) == 1 and isinstance(tripped[0], torch.Tensor):
        masks["token_masked"] = tripped[0]
    elif tripped:
        masks["token_masked"] = partial(union, tripped)
    return metrics
