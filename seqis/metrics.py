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
from .estimators._common import AGGREGATIONS, Correction, masked_mean, token_scale
from .types import Batch, Config, EstimatorOutput


def _config(name: str, cfg: Config | None) -> Config:
    if name not in ESTIMATORS:
        raise ValueError(f"unknown estimator {name!r}; known: {', '.join(ESTIMATORS)}")
    spec = ESTIMATORS[name]
    if cfg is None:
        return spec.config()
    if not isinstance(cfg, spec.config):
        raise ValueError(f"{name} takes a {spec.config.__name__}, got {type(cfg).__name__}")
    return cfg


def _output(r: Ratios, batch: Batch, c: Correction, cfg: Config, agg: str) -> EstimatorOutput:
    zero = torch.zeros((), dtype=r.dtype, device=r.mask.device)
    kept = r.mask if c.kept is None else r.mask & c.kept  # (B, T)
    weights = torch.where(kept, c.weights, zero).detach()  # (B, T) gradient coefficient

    # surrogate: loss = -sum(scale * weight * adv_tau * A * log pi) over loss tokens
    adv = batch.advantages.to(r.dtype)
    adv = adv[:, None] if adv.dim() == 1 else adv  # (B, 1) or (B, T)
    coef = weights * (cfg.adv_tau * token_scale(r, kept, agg))  # (B, T)
    logp = batch.trainer_logprobs.to(r.dtype)
    loss = -torch.where(r.mask, coef * adv * logp, zero).sum()

    # common metrics: k3 summed per rollout once (Ratios caches it), kept part per estimator
    k3_kept = torch.where(kept, r.k3, zero).sum()
    n_kept = kept.sum().to(r.dtype)
    n_tok = r.n_tokens
    metrics = {
        "mismatch_kl": r.k3_rollout.sum() / n_tok.clamp(min=1),
        "masked_mismatch_kl": (r.k3_rollout.sum() - k3_kept) / (n_tok - n_kept).clamp(min=1),
        "unmasked_mismatch_kl": k3_kept / n_kept.clamp(min=1),
        "is_masked": (n_tok - n_kept) / n_tok.clamp(min=1),
        "seq_log_ratio": masked_mean(r.seq_log_ratio, r.valid),
        "geo_log_ratio": masked_mean(r.geo_log_ratio, r.valid),
    }
    metrics.update(c.metrics)

    kept_per_rollout = kept.sum(-1).to(r.dtype)  # (B,)
    accepted = c.accepted if c.accepted is not None else kept_per_rollout > 0
    clipped = c.masks.get("clipped")
    rollouts = {
        "length": r.length,
        "seq_log_ratio": r.seq_log_ratio,
        "geo_log_ratio": r.geo_log_ratio,
        "weight": weights.sum(-1) / r.length.clamp(min=1),
        "accepted": accepted & r.valid,
        "clipped": clipped.any(-1) if clipped is not None else torch.zeros_like(accepted),
        "kept_fraction": kept_per_rollout / r.length.clamp(min=1),
    }
    masks = {"kept": kept, **c.masks}
    out_dtype = torch.float64 if r.dtype == torch.float64 else torch.float32
    return EstimatorOutput(loss=loss, weights=weights.to(out_dtype), masks=masks, metrics=metrics,
                           rollouts=rollouts)


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
    configs = [(name, _config(name, cfg)) for name, cfg in pairs]
    if agg not in AGGREGATIONS:
        raise ValueError(f"agg must be one of {', '.join(AGGREGATIONS)}; got {agg!r}")
    r = ratios if ratios is not None else Ratios.of(batch)
    return {name: _output(r, batch, ESTIMATORS[name].fn(r, cfg), cfg, agg) for name, cfg in configs}
