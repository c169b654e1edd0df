"""SkyRL's off-policy correction (trainer.algorithm.off_policy_correction), every option off by default.

    ratios     exp(clamp(x, -20, 20)) of the token l_t, the rollout sum S_j or the geometric mean S_j / T_j
    outlier    drop a rollout with any token ratio below outlier_token_is_threshold_low or above _high
    token mask drop tokens whose ratio leaves [token_mask_is_threshold_low, _high] (both must be set)
    TIS        weight min(rho_t, token_tis_ratio_clip_high) or min(exp S_j, sequence_tis_ratio_clip_high)
    seq mask   drop rollouts whose geometric (exp(S/T)) or product (exp S) ratio leaves its band

The masks multiply loss_mask but the token-mean normaliser was fixed from the original mask: token-mean.
SkyRL clamps the geometric MEAN at +-20, seqis each l_t before it: they differ only when a token has |l| > 20.
Presets: one per option at its config default; the outlier thresholds are the config docstrings' suggestions
(1e-4, 100). token_mask_is_threshold_* has no default or suggestion, so it is a knob, not a preset.
Source: NovaSky-AI/SkyRL, skyrl/backends/skyrl_train/utils/off_policy_correction_utils.py,
skyrl/train/config/config.py (OffPolicyCorrectionConfig).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..compose import Composition, Criterion, Weight
from ..spec import Preset
from ..types import Config, knob
from ._preset import SAFETY_BOUND, framework_estimator


@dataclass(frozen=True)
class SkyRLConfig(Config):
    """OffPolicyCorrectionConfig; SkyRL's names."""

    tis_ratio_type: str | None = knob(None, "TIS weight: token, sequence, or None.", optional=True,
                                      choices=(None, "token", "sequence"))
    token_tis_ratio_clip_high: float = knob(2.0, "Token TIS cap.", gt=0.0, ui=(1.0, 10.0), log=True)
    sequence_tis_ratio_clip_high: float = knob(5.0, "Sequence TIS cap.", gt=0.0, ui=(1.0, 20.0), log=True)
    sequence_mask_metric: str | None = knob(None, "Drop rollouts by their geometric or product ratio.",
                                            optional=True, choices=(None, "geometric", "product"))
    geo_mask_low: float = knob(0.99, "Geometric band, low.", gt=0.0, ui=(0.9, 1.0))
    geo_mask_high: float = knob(1.01, "Geometric band, high.", gt=0.0, ui=(1.0, 1.1))
    product_mask_low: float = knob(0.5, "Product band, low.", gt=0.0, ui=(0.1, 1.0))
    product_mask_high: float = knob(2.0, "Product band, high.", gt=0.0, ui=(1.0, 10.0), log=True)
    outlier_token_is_threshold_low: float | None = knob(None, "Drop a rollout with any token ratio below this.",
                                                        optional=True, gt=0.0, ui=(1e-8, 0.5), log=True)
    outlier_token_is_threshold_high: float | None = knob(None, "Drop a rollout with any token ratio above this.",
                                                         optional=True, gt=0.0, ui=(2.0, 1e4), log=True)
    token_mask_is_threshold_low: float | None = knob(None, "Drop tokens whose ratio is below this (needs _high).",
                                                     optional=True, gt=0.0, ui=(0.01, 1.0))
    token_mask_is_threshold_high: float | None = knob(None, "Drop tokens whose ratio is above this (needs _low).",
                                                      optional=True, gt=0.0, ui=(1.0, 100.0), log=True)


def compose(cfg: SkyRLConfig) -> Composition:
    criteria: list[Criterion] = []
    if cfg.outlier_token_is_threshold_low is not None:
        criteria.append(Criterion("ratio", "min", low=cfg.outlier_token_is_threshold_low))
    if cfg.outlier_token_is_threshold_high is not None:
        criteria.append(Criterion("ratio", "max", high=cfg.outlier_token_is_threshold_high))
    if cfg.token_mask_is_threshold_low is not None and cfg.token_mask_is_threshold_high is not None:
        criteria.append(Criterion("ratio", "token", low=cfg.token_mask_is_threshold_low,
                                  high=cfg.token_mask_is_threshold_high))
    if cfg.tis_ratio_type is None:
        weight = Weight("none")
    elif cfg.tis_ratio_type == "token":
        weight = Weight("token", clip=cfg.token_tis_ratio_clip_high)
    else:
        weight = Weight("sequence", clip=cfg.sequence_tis_ratio_clip_high)
    if cfg.sequence_mask_metric == "geometric":
        criteria.append(Criterion("ratio", "mean", low=cfg.geo_mask_low, high=cfg.geo_mask_high))
    elif cfg.sequence_mask_metric == "product":
        criteria.append(Criterion("ratio", "sum", low=cfg.product_mask_low, high=cfg.product_mask_high))
    return Composition(weight, tuple(criteria), log_ratio_clamp=SAFETY_BOUND, adv_tau=cfg.adv_tau)


ESTIMATOR = framework_estimator("skyrl", compose, SkyRLConfig, "SkyRL's off_policy_correction.")
SOURCE = "NovaSky-AI/SkyRL: skyrl/backends/skyrl_train/utils/off_policy_correction_utils.py"

PRESETS = [
    Preset("skyrl/token_tis", "Token TIS min(rho_t, 2) (log-ratio clamped at +-20).", f"{SOURCE} (compute_tis_ratio)",
           ESTIMATOR, SkyRLConfig(tis_ratio_type="token")),
    Preset("skyrl/sequence_tis", "Sequence TIS min(exp(clamp(S, +-20)), 5).", f"{SOURCE} (compute_tis_ratio)",
           ESTIMATOR, SkyRLConfig(tis_ratio_type="sequence")),
    Preset("skyrl/geo_mask", "Drop rollouts with exp(S/T) outside [0.99, 1.01]; weight 1.",
           f"{SOURCE} (compute_sequence_mask)", ESTIMATOR, SkyRLConfig(sequence_mask_metric="geometric")),
    Preset("skyrl/product_mask", "Drop rollouts with exp(S) outside [0.5, 2]; weight 1.",
           f"{SOURCE} (compute_sequence_mask)", ESTIMATOR, SkyRLConfig(sequence_mask_metric="product")),
    Preset("skyrl/outlier_token_mask", "Drop rollouts with any token ratio below 1e-4 or above 100 (the config "
           "docstrings' suggested thresholds; no code default); weight 1.", f"{SOURCE} (compute_outlier_token_mask)",
           ESTIMATOR, SkyRLConfig(outlier_token_is_threshold_low=1e-4, outlier_token_is_threshold_high=100.0)),
]
