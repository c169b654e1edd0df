"""AReaL's decoupled-loss rejection sampling (actor.rejection_sampling, with actor.use_decoupled_loss: true).

    weight     behave_imp_weight = exp(l_t) (a non-finite l is replaced by 0); level sequence + metric ratio: the
               geometric mean exp(S_j/T_j) on every token instead
    metric     ratio (aggregated in log space: sum -> exp S, mean -> exp(S/T), max -> max rho), kl_k1 = +l (the
               opposite sign to verl's), kl_k2 = l^2 / 2 (sum / mean / max taken on the metric)
    mask       drop tokens (level token) or rollouts (level sequence) whose metric leaves [lower, upper]
               (lower None = open); clamp: the weight is clamped to [lower or 0, upper] instead

Defaults: level token, action mask, metric ratio, agg mean, upper 5.0, lower None (the old behave_imp_weight_cap
5 with token_mask). Not expressible (compose raises): metric kl_k3, which AReaL computes as exp(-l) - 1 + l (the
reverse k3), and clamp at sequence level with agg sum or max (it clamps only out-of-bounds rollouts).
Source: inclusionAI/AReaL, areal/utils/functional/functional.py (apply_rejection_sampling),
areal/api/cli_args.py (RejectionSamplingConfig).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..compose import Composition, Criterion, Weight
from ..spec import Preset
from ..types import Config, knob
from ._preset import framework_estimator


@dataclass(frozen=True)
class ArealConfig(Config):
    """RejectionSamplingConfig; AReaL's names."""

    level: str = knob("token", "Filter per token or per rollout.", choices=("token", "sequence"))
    action: str = knob("mask", "mask (drop) or clamp (bound the weight).", choices=("mask", "clamp"))
    metric: str = knob("ratio", "ratio, kl_k1 (+l) or kl_k2 (l^2 / 2).", choices=("ratio", "kl_k1", "kl_k2"))
    agg: str = knob("mean", "Rollout aggregation (level sequence).", choices=("sum", "mean", "max"))
    upper: float = knob(5.0, "Upper bound on the metric.", gt=0.0, ui=(1.0, 10.0), log=True)
    lower: float | None = knob(None, "Lower bound on the metric; None = open.", optional=True, ui=(0.0, 1.0))

    def __post_init__(self):
        super().__post_init__()
        if self.level == "sequence" and self.action == "clamp" and not (self.metric == "ratio" and self.agg == "mean"):
            raise ValueError("level=sequence with action=clamp clamps only the rollouts outside the bounds: "
                             "expressible for metric=ratio, agg=mean only")


def _criterion(metric: str, agg: str, lower: float | None, upper: float) -> Criterion:
    """AReaL's bound on its metric, in the composition's statistics (k1 there is -l, so AReaL's +l band flips)."""
    if metric == "ratio":
        return Criterion("ratio", agg, low=lower, high=upper)
    if metric == "kl_k2":
        return Criterion("k2", agg, low=lower, high=upper)
    flipped = {"token": "token", "sum": "sum", "mean": "mean", "max": "min"}[agg]  # max of l = -min of -l
    return Criterion("k1", flipped, low=-upper, high=None if lower is None else -lower)


def compose(cfg: ArealConfig) -> Composition:
    geometric = cfg.level == "sequence" and cfg.metric == "ratio"
    level = "geometric" if geometric else "token"
    if cfg.action == "clamp":
        return Composition(Weight(level, clip=cfg.upper, clip_low=cfg.lower or 0.0), adv_tau=cfg.adv_tau)
    agg = cfg.agg if cfg.level == "sequence" else "token"
    return Composition(Weight(level), (_criterion(cfg.metric, agg, cfg.lower, cfg.upper),), adv_tau=cfg.adv_tau)


ESTIMATOR = framework_estimator("areal", compose, ArealConfig, "AReaL's decoupled-loss rejection sampling.")
SOURCE = "inclusionAI/AReaL: areal/utils/functional/functional.py (apply_rejection_sampling)"

PRESETS = [
    Preset("areal/token_mask", "rho_t, tokens with rho_t > 5 dropped (the rejection_sampling defaults; the old "
           "behave_imp_weight_mode token_mask).", SOURCE, ESTIMATOR, ArealConfig()),
    Preset("areal/token_truncate", "min(rho_t, 5) per token (action clamp).", SOURCE, ESTIMATOR,
           ArealConfig(action="clamp")),
    Preset("areal/sequence_mask", "The geometric mean exp(S/T) as every token's weight, rollouts with it above 5 "
           "dropped (level sequence).", SOURCE, ESTIMATOR, ArealConfig(level="sequence")),
    Preset("areal/sequence_truncate", "min(exp(S/T), 5) on every token (level sequence, action clamp).", SOURCE,
           ESTIMATOR, ArealConfig(level="sequence", action="clamp")),
]
