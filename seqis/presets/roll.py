"""ROLL's train-infer correction (train_infer_correction: an IS weight and filters on response_mask), off by default.

    ratios     l_t = log pi_old - log mu (no clamp): token exp(l_t), geometric exp(mean_t l_t) (the mean divides
               by T + 1e-8), sequence exp(sum_t l_t), segment (each contiguous run of response tokens)
    diffs      pi_old - mu per token; its rollout mean (geometric) or sum (sequence)
    is_weight  ratio[weight_type] clamped to [0, upper_bound] (upper_bound None: unclamped), detached
    filters    each enabled filter keeps ratio[agg_type] in [ratio_low, ratio_high] (ratio_enabled) and
               diff[agg_type] in [diff_low, diff_high] (diff_enabled), edges kept; filters chain

Defaults in the code: is_weight.enabled False (weight_type token, upper_bound 1.2 once enabled), filters [] (a
filter's fields default to agg token, ratio [0.8, 1.2] on, diff [-0.2, 0.2] off): no correction. ROLL clamps no
log-ratio: with upper_bound None a sequence weight exp(S) overflows fp32 to inf past S = 88.7 (seqis caps every
weight at e^40). The weight multiplies the pg loss (any pg_variant: its own ratio pi / pi_old is 1 at the first
minibatch); the filter zeroes response_mask, so with enable_old_logprobs_recompute the pipeline filters before the
token counts (dropped tokens leave the normaliser), without it the worker filters after (they stay); the default
loss_agg_mode is seq-mean-token-mean. The config models one filter; segment level (multi-turn segments) has no
counterpart in the composition and is refused.
Source: alibaba/ROLL, roll/utils/train_infer_corrections.py (compute_train_infer_correction,
_compute_all_granularity), roll/configs/base_config.py (TrainInferCorrectionConfig), roll/utils/functionals.py
(masked_mean). Read at 8eb27cc2 (2026-08-19), release v0.3.0.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.compose import Composition, Criterion, Weight
from ..core.spec import Preset
from ..core.types import Config, knob
from ._preset import framework_estimator

LEVELS = ("token", "geometric", "sequence", "segment")
WEIGHT_LEVEL = {"token": "token", "geometric": "geometric", "sequence": "sequence"}  # ROLL's weight_type -> ours
AGG = {"token": "token", "geometric": "mean", "sequence": "sum"}  # ROLL's agg_type -> a criterion's aggregate


@dataclass(frozen=True)
class RollConfig(Config):
    """TrainInferCorrectionConfig: is_weight.* and one filter (filters[0].*); ROLL's names."""

    is_weight_enabled: bool = knob(False, "is_weight.enabled: weigh by the train/infer ratio.", choices=(True, False))
    is_weight_weight_type: str = knob("token", "is_weight.weight_type: token, geometric or sequence ratio.",
                                      choices=LEVELS)
    is_weight_upper_bound: float | None = knob(1.2, "is_weight.upper_bound: clamp the weight to [0, this]; None = "
                                               "unclamped.", optional=True, gt=0.0, ui=(1.0, 10.0), log=True)
    filter_enabled: bool = knob(False, "filters[0].enabled: apply the filter.", choices=(True, False))
    filter_agg_type: str = knob("token", "filters[0].agg_type: the level it filters at.", choices=LEVELS)
    filter_ratio_enabled: bool = knob(True, "filters[0].ratio_enabled: keep the ratio in its band.",
                                      choices=(True, False))
    filter_ratio_low: float = knob(0.8, "filters[0].ratio_low.", ge=0.0, ui=(0.0, 1.0))
    filter_ratio_high: float = knob(1.2, "filters[0].ratio_high.", gt=0.0, ui=(1.0, 10.0), log=True)
    filter_diff_enabled: bool = knob(False, "filters[0].diff_enabled: keep pi_old - mu in its band.",
                                     choices=(True, False))
    filter_diff_low: float = knob(-0.2, "filters[0].diff_low.", ui=(-1.0, 0.0))
    filter_diff_high: float = knob(0.2, "filters[0].diff_high.", ui=(0.0, 1.0))

    def __post_init__(self):
        super().__post_init__()
        if self.is_weight_enabled and self.is_weight_weight_type == "segment":
            raise ValueError("is_weight_weight_type 'segment' (each multi-turn segment's mean) has no counterpart "
                             "in the composition")
        if self.filter_enabled and self.filter_agg_type == "segment":
            raise ValueError("filter_agg_type 'segment' (each multi-turn segment's mean) has no counterpart in the "
                             "composition")


def compose(cfg: RollConfig) -> Composition:
    weight = Weight("none")
    if cfg.is_weight_enabled:
        weight = Weight(WEIGHT_LEVEL[cfg.is_weight_weight_type], clip=cfg.is_weight_upper_bound)
    criteria = []
    if cfg.filter_enabled:
        agg = AGG[cfg.filter_agg_type]
        if cfg.filter_ratio_enabled:
            criteria.append(Criterion("ratio", agg, low=cfg.filter_ratio_low, high=cfg.filter_ratio_high))
        if cfg.filter_diff_enabled:
            criteria.append(Criterion("prob_diff", agg, low=cfg.filter_diff_low, high=cfg.filter_diff_high))
    return Composition(weight, tuple(criteria), adv_tau=cfg.adv_tau)


ESTIMATOR = framework_estimator("roll", compose, RollConfig, "ROLL's train-infer correction.")
SOURCE = "alibaba/ROLL@8eb27cc2 (v0.3.0): roll/utils/train_infer_corrections.py (compute_train_infer_correction)"
_ON = dict(is_weight_enabled=True)
_FILTER = dict(filter_enabled=True)

SHIPPED_OPTIONS = (  # when the framework shipped it (Preset.versions)
    'every option since 2026-02-03 (ROLL v0.2.0); unchanged in v0.3.0 (2026-06-18)'
)

PRESETS = [
    Preset("roll/default", "ROLL's default: no train-infer correction (is_weight.enabled False, no filters).",
           SOURCE, ESTIMATOR, RollConfig(), versions=SHIPPED_OPTIONS),
    Preset("roll/is_weight", "Token weight min(rho_t, 1.2): is_weight enabled at its field defaults (an upper "
           "bound of 1.2, tighter than most frameworks' 2).", SOURCE, ESTIMATOR, RollConfig(**_ON),
           versions=SHIPPED_OPTIONS),
    Preset("roll/is_weight_geometric", "min(exp(mean_t l_t), 1.2) on every token (weight_type geometric).", SOURCE,
           ESTIMATOR, RollConfig(**_ON, is_weight_weight_type="geometric"), versions=SHIPPED_OPTIONS),
    Preset("roll/is_weight_sequence", "min(exp(S), 1.2) on every token (weight_type sequence; no log-ratio clamp).",
           SOURCE, ESTIMATOR, RollConfig(**_ON, is_weight_weight_type="sequence"), versions=SHIPPED_OPTIONS),
    Preset("roll/filter_token", "Drop tokens whose rho_t leaves [0.8, 1.2] (a filter at its field defaults); "
           "weight 1.", SOURCE, ESTIMATOR, RollConfig(**_FILTER), versions=SHIPPED_OPTIONS),
    Preset("roll/filter_geometric", "Drop rollouts whose geometric ratio exp(mean_t l_t) leaves [0.8, 1.2]; weight "
           "1.", SOURCE, ESTIMATOR, RollConfig(**_FILTER, filter_agg_type="geometric"), versions=SHIPPED_OPTIONS),
    Preset("roll/filter_sequence", "Drop rollouts whose product ratio exp(S) leaves [0.8, 1.2]; weight 1.", SOURCE,
           ESTIMATOR, RollConfig(**_FILTER, filter_agg_type="sequence"), versions=SHIPPED_OPTIONS),
    Preset("roll/filter_token_diff", "Drop tokens whose rho_t leaves [0.8, 1.2] or whose pi_old - mu leaves "
           "[-0.2, 0.2] (diff_enabled; the ratio test stays on, and at these bands the diff test never binds alone: "
           "|pi - mu| = mu |rho - 1| <= 0.2); weight 1.", SOURCE, ESTIMATOR,
           RollConfig(**_FILTER, filter_diff_enabled=True), versions=SHIPPED_OPTIONS),
]
