"""From an estimator's Correction to its output: the surrogate loss, the common metrics and the
per-rollout values; and `run` / `run_many`, the only dispatchers over the registry.

Metric definitions (valid rollout = T_j > 0; an empty selection gives 0.0):
  mismatch_kl            mean over loss tokens of k3 = rho - 1 - l (estimates KL(mu || pi) per token)
  masked_mismatch_kl     the same over dropped loss tokens;  unmasked_mismatch_kl: over kept ones
  is_masked              fraction of loss tokens dropped
  is_token_masked        fraction of loss tokens outside the token band (token-band estimators)
  is_traj_masked         fraction of loss tokens in rollouts outside the trajectory band
  is_clipped             fraction of valid rollouts whose weight was truncated (S_j > log C)
  seq_log_ratio          mean of S_j;  geo_log_ratio: mean of S_j / T_j (over valid rollouts)
  seq_weight             mean applied sequence weight over valid rollouts that keep their gradient
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from .estimators import ESTIMATORS, Ratios
from .estimators._common import (
    AGGREGATIONS,
    Correction,
    any_per_row,
    dot,
    gated,
    masked_mean,
    surrogate_loss,
    token_scale,
)
from .types import Batch, Config, EstimatorOutput


def resolve_config(name: str, cfg: Config | None) -> Config:
    """The config to use: the defaults for None; a config of the wrong class is refused."""
    if name not in ESTIMATORS:
        raise ValueError(f"unknown estimator {name!r}; known: {', '.join(ESTIMATORS)}")
    spec = ESTIMATORS[name]
    if cfg is None:
        return spec.config()
    if not isinstance(cfg, spec.config):
        raise ValueError(f"{name} takes a {spec.config.__name__}, got {type(cfg).__name__}")
    return cfg


def _output(r: Ratios, batch: Batch, c: Correction, cfg: Config, agg: str) -> EstimatorOutput:
    """Loss, weights, masks, metrics and per-rollout values from a correction.

    Sequence-level corrections (seq_weights, a rollout gate) never touch a (B, T) float tensor beyond
    the weights they must return: their loss and metrics are per-rollout sums. Every (B, T) tensor
    derived from log-ratios is finite, so masking them by multiplying with the 0/1 mask is safe;
    trainer_logprobs may hold -inf / NaN on padding and is zeroed by surrogate_loss. On the CPU a fresh
    (B, T) tensor costs about as much as the arithmetic on it, so products are reduced with row dots.
    """
    zero = torch.zeros((), dtype=r.dtype, device=r.mask.device)

    # which tokens keep a gradient, per token and per rollout
    if c.kept is not None:
        kept_f = c.kept  # (B, T) 0/1 floats, 0 off the loss mask
        kept = kept_f.bool()
        kept_len = kept_f.sum(-1)  # (B,)
    elif c.accepted is not None:
        kept = r.tokens_of(c.accepted)
        kept_f = None
        kept_len = gated(c.accepted, r.length)
    else:
        kept, kept_f, kept_len = r.mask, r.mask_f, r.length
    accepted = c.accepted if c.accepted is not None else kept_len > 0  # (B,)

    # gradient coefficient per token: (B, T) weights, 0 where dropped
    if c.seq_weights is not None or (c.weights is None and c.kept is None):
        seq_w = c.seq_weights if c.seq_weights is not None else torch.ones_like(r.length)
        seq_w = gated(accepted, seq_w) if c.accepted is not None else seq_w  # (B,)
        weights = r.per_token(seq_w) if c.kept is None else seq_w[:, None] * kept_f
    else:
        keep = kept_f if kept_f is not None else r.mask_f
        weights = keep if c.weights is None else c.weights.mul_(keep)  # a fresh tensor (Correction's contract)
        seq_w = None
    weights = weights.detach()

    # surrogate loss = -sum(scale * weight * adv_tau * A * log pi) over loss tokens
    logp = batch.trainer_logprobs.to(r.dtype)  # (B, T) differentiable; padding may hold -inf / NaN
    scale = token_scale(r, kept_len.sum(), agg)  # () or (B, 1)
    row = scale.expand(r.length.shape) if scale.dim() == 0 else scale[:, 0]  # (B,)
    adv = batch.advantages.to(r.dtype) * cfg.adv_tau
    if adv.dim() == 2:  # per-token advantages: fold them into the token coefficient
        loss = surrogate_loss(logp, r, row, weights * torch.where(r.mask, adv, zero))
    elif seq_w is not None and c.kept is None:  # one weight per rollout: no (B, T) coefficient at all
        loss = surrogate_loss(logp, r, row * adv * seq_w)
    else:
        loss = surrogate_loss(logp, r, row * adv, weights)

    # common metrics: mismatch KL split into dropped / kept tokens
    k3_total = r.k3_rollout.sum()
    k3_kept = dot(r.k3, kept_f) if c.kept is not None else gated(accepted, r.k3_rollout).sum()
    n_tok, n_kept = r.n_tokens, kept_len.sum()
    metrics = {
        "mismatch_kl": k3_total / n_tok.clamp(min=1),
        "masked_mismatch_kl": (k3_total - k3_kept) / (n_tok - n_kept).clamp(min=1),
        "unmasked_mismatch_kl": k3_kept / n_kept.clamp(min=1),
        "is_masked": (n_tok - n_kept) / n_tok.clamp(min=1),
        "seq_log_ratio": masked_mean(r.seq_log_ratio, r.valid),
        "geo_log_ratio": masked_mean(r.geo_log_ratio, r.valid),
    }
    metrics.update(c.metrics)

    if c.clipped is not None:
        clipped = c.clipped & r.valid
    elif "clipped" in c.masks:
        clipped = any_per_row(c.masks["clipped"])
    else:
        clipped = torch.zeros_like(r.valid)
    length = r.length.clamp(min=1)
    rollouts = {
        "length": r.length,
        "seq_log_ratio": r.seq_log_ratio,
        "geo_log_ratio": r.geo_log_ratio,
        "weight": seq_w if seq_w is not None and c.kept is None else weights.sum(-1) / length,
        "accepted": accepted & r.valid,
        "clipped": clipped,
        "kept_fraction": kept_len / length,
    }
    masks = {"kept": kept, **c.masks}
    if c.clipped is not None and "clipped" not in masks:
        masks["clipped"] = r.tokens_of(clipped)
    return EstimatorOutput(loss=loss, weights=weights, masks=masks, metrics=metrics, rollouts=rollouts)


def run(name: str, batch: Batch, cfg: Config | None = None, *, agg: str = "token-mean") -> EstimatorOutput:
    """Evaluate one estimator on a batch. cfg=None uses the estimator's defaults."""
    return run_many([(name, cfg)], batch, agg=agg)[name]


def run_many(
    estimators: Iterable[str | tuple[str, Config | None]] | dict[str, Config | None],
    batch: Batch,
    *,
    agg: str = "token-mean",
    ratios: Ratios | None = None,
) -> dict[str, EstimatorOutput]:
    """Evaluate several estimators on one batch, computing the shared pieces (log-ratios, sums, counts,
    geometric ratios, k3) once. `estimators` is names, (name, cfg) pairs or a {name: cfg} dict; keys of
    the result are the names (a name given twice with two configs: the later wins; use `run` per config).
    """
    items = estimators.items() if isinstance(estimators, dict) else estimators
    pairs = [(e, None) if isinstance(e, str) else tuple(e) for e in items]
    configs = [(name, resolve_config(name, cfg)) for name, cfg in pairs]
    if agg not in AGGREGATIONS:
        raise ValueError(f"agg must be one of {', '.join(AGGREGATIONS)}; got {agg!r}")
    r = ratios if ratios is not None else Ratios.of(batch)
    return {name: _output(r, batch, ESTIMATORS[name].fn(r, cfg), cfg, agg) for name, cfg in configs}
