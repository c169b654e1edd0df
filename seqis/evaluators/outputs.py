"""The fast evaluator's outputs (seqis/evaluators/fast.py): a `Correction` in either form becomes the surrogate
loss (one autograd node whose backward writes d loss / d log pi directly: kernels.known_losses), any penalty, the
metrics and the per-rollout values, for as many keys as name the composition.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache as once
from functools import partial

import torch

from ..core.compose import Composition, Penalty
from ..core.ratios import Ratios, as_dtype, as_float, dot
from ..core.types import Batch, EstimatorOutput, Masks
from .kernels import SharedGradient, dot_rows, gated, known_losses, masked_mean, scaled, tokens_of
from .plain import add_centering
from .rows import Correction, row_sums, spread
from .rules import Cache


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
    """A token-level correction's (B, T) weights before adv_tau * A, built in place on its own tensors."""
    if c.token_weights is None:
        w = c.keep
    else:
        w = c.token_weights.mul_(c.keep if c.keep is not None else mask_f)
    if c.keep is None and c.gate is not None:  # a rollout gate on token weights (geo_mask's hybrid)
        w.mul_(as_float(c.gate, r.dtype)[:, None])
    return w if c.row_weight is None else w.mul_(c.row_weight[:, None])


def outputs_of(r: Ratios, pieces: Cache, batch: Batch, c: Correction, comp: Composition, agg: str,
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
    if c.keep is not None:  # kept_len (B,): set with keep, and by the sparse form
        kept_len, kept = c.kept_len, lambda: rebuilt()[1]
    elif kept_rows is not None:  # the sparse form: all loss tokens but in a few rows, times the gate
        gate, kept_len, dtype = c.gate if c.gate is not None else r.valid, c.kept_len, r.dtype
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
        seq_w = c.row_weight if c.row_weight is not None else torch.ones_like(r.length)
        token_w = gated(accepted, seq_w) if c.gate is not None else seq_w  # (B,) on each kept token
        weight = token_w if kept_rows is None else token_w * kept_len / length
        weights = once(lambda: spread(token_w, mask, kept_rows))
        if adv_tok is None:  # one coefficient per rollout: no (B, T) tensor in the forward
            row_coef = row_adv * token_w  # (B,) d loss / d log pi on each kept token
            value = (row_coef * row_sums(r.logp_rowsum, kept_rows, "logp")).sum()
            grad_of = lambda first, g: spread(row_coef * g, mask, kept_rows)
        else:
            rebuild = lambda: gradient(spread(token_w, mask, kept_rows))
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

    own = dict(c.masks)  # a truncated token weight's "clipped" tokens come with its clipped rows
    if c.gate is not None:  # a rollout gate: the loss tokens of the rollouts it rejects
        own.setdefault("traj_masked", partial(tokens_of, r.mask, ~c.gate))
    clipped = c.clipped & r.valid if c.clipped is not None else torch.zeros_like(r.valid)
    if c.clipped is not None:
        own.setdefault("clipped", partial(tokens_of, r.mask, clipped))
    masks = Masks({"kept": kept, **own})
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
    outs = [EstimatorOutput(loss=loss, weights=weights, masks=masks, metrics=dict(metrics), rollouts=dict(rollouts))
            for loss in known_losses(logp, value, grad_of, n)]
    if comp.centering is not None:  # score centering's term over the sampler's head: the plain evaluator's own
        add_centering(comp.centering, batch, r.mask, scale, adv, outs)
    return outs


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
