"""TRL's GRPOTrainer vLLM importance-sampling correction and its off-policy sequence mask (OPSM).

    ratio       token_*: rho_t = exp(l_t);  sequence_*: exp(S_j)  (no clamp: exp(S) may overflow to inf)
    truncate    clamp(ratio, min=clip_min, max=clip_max)
    mask        ratio * 1[clip_min <= ratio <= clip_max] (a missing side is open; completion_mask unchanged),
                decided on exp(l) or exp(S) in the compute dtype against the clip (ratio space: at l = log 3,
                exp(l) is 3.0000000000000004 in float64 and the token is dropped; grpo_trainer.py:2674, :2698)
    OPSM        keep a rollout when A >= 0 or mean_t(mu_t - pi_t) in log space, i.e. mean(-l), is <= delta

Defaults in the code: correction on, mode "sequence_mask", clip_max 3.0, clip_min None (the config docstring calls
token_truncate the default: the code says sequence_mask). Before #4530 (2025-11-30) the default was token TIS at
vllm_importance_sampling_cap 2.0 (trl/tis_2025_09). OPSM has no default threshold; TRL's docs
(paper_index.md) and tests use 0.5. The default loss ("dapo") normalises by every completion token (token-mean),
and pi_theta / pi_old is 1 at the first minibatch, so the IS ratio is the correction.
Source: huggingface/trl, trl/trainer/grpo_trainer.py (_generate_and_score_completions, get_off_policy_mask),
trl/trainer/grpo_config.py. Read in pip trl 1.16.0 (2026-10) and at f2cd577 (2026-07-24): the same arithmetic
(1.16 zeroes a NaN sampler log-prob's difference, which a Batch never holds on a loss token).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..core.compose import Composition, Criterion, Weight
from ..core.spec import Preset
from ..core.types import Config, knob
from ._preset import framework_estimator

MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


@dataclass(frozen=True)
class TRLConfig(Config):
    """GRPOConfig arguments; TRL's names."""

    vllm_importance_sampling_correction: bool = knob(True, "Apply the vLLM IS correction at all.",
                                                     choices=(True, False))
    vllm_importance_sampling_mode: str = knob("sequence_mask", "Granularity (token / sequence) and constraint "
                                              "(truncate / mask) of the IS ratio.", choices=MODES)
    vllm_importance_sampling_clip_max: float | None = knob(3.0, "C_max: truncate at / mask above this.",
                                                           optional=True, gt=0.0, ui=(1.0, 10.0), log=True, inf=True)
    vllm_importance_sampling_clip_min: float | None = knob(None, "C_min: truncate at / mask below this.",
                                                           optional=True, ge=0.0, ui=(0.0, 1.0))
    off_policy_mask_threshold: float | None = knob(None, "OPSM delta: drop a rollout with A < 0 whose mean "
                                                   "log(mu/pi) exceeds it; None = off.", optional=True, gt=0.0,
                                                   ui=(0.01, 2.0), log=True)
    loss_type: str = knob("dapo", "dapo (the default: the IS ratio times -A, token-mean) or vespo (a gamma weight "
                          "of the sequence ratio).", choices=("dapo", "vespo"))
    vespo_k_pos: float = knob(2.0, "VESPO's power for A >= 0.", ge=0.0, ui=(0.0, 6.0))
    vespo_lambda_pos: float = knob(3.0, "VESPO's decay for A >= 0.", ge=0.0, ui=(0.0, 6.0))
    vespo_k_neg: float = knob(3.0, "VESPO's power for A < 0.", ge=0.0, ui=(0.0, 6.0))
    vespo_lambda_neg: float = knob(2.0, "VESPO's decay for A < 0.", ge=0.0, ui=(0.0, 6.0))

    def __post_init__(self):
        super().__post_init__()
        lo, hi = self.vllm_importance_sampling_clip_min, self.vllm_importance_sampling_clip_max
        if lo is not None and hi is not None and lo >= hi:
            raise ValueError(f"vllm_importance_sampling_clip_min ({lo}) must be less than "
                             f"vllm_importance_sampling_clip_max ({hi})")
        if self.vllm_importance_sampling_mode.endswith("truncate") and lo is None and hi is None:
            raise ValueError("set vllm_importance_sampling_clip_min or _clip_max for a *_truncate mode")
        if self.loss_type == "vespo" and (self.vllm_importance_sampling_mode != "token_truncate" or lo is not None
                                          or not self.vllm_importance_sampling_correction):
            raise ValueError("loss_type=vespo is expressible with vllm_importance_sampling_mode token_truncate and no "
                             "clip_min (TRL refuses the sequence modes; token_mask's zeros enter log W as log 1e-8)")


def compose(cfg: TRLConfig) -> Composition:
    lo, hi = cfg.vllm_importance_sampling_clip_min, cfg.vllm_importance_sampling_clip_max
    level, constraint = cfg.vllm_importance_sampling_mode.split("_")
    if not cfg.vllm_importance_sampling_correction:
        weight = Weight("none")
    elif constraint == "truncate":
        weight = Weight(level, clip=math.inf if hi is None else hi, clip_low=lo or 0.0)
    else:  # invalid_mis_mask = (ratio < min_val) | (ratio > max_val), on the ratio itself: edges in ratio space
        weight = Weight(level, band=(lo or 0.0, math.inf if hi is None else hi), edge_space="ratio")
    if cfg.loss_type == "vespo":  # phi(W), W = prod_t min(rho_t, C), log-ratios clamped to +-20 (TRL's bounds)
        weight = Weight("sequence", token_clip=math.inf if hi is None else hi,
                        gamma=(cfg.vespo_k_pos, cfg.vespo_lambda_pos, cfg.vespo_k_neg, cfg.vespo_lambda_neg))
    criteria = ()
    if cfg.off_policy_mask_threshold is not None:  # kept when A >= 0 or mean(-l) <= delta
        criteria = (Criterion("k1", "mean", high=cfg.off_policy_mask_threshold, advantage="negative"),)
    clamp = 20.0 if cfg.loss_type == "vespo" else None
    return Composition(weight, criteria, log_ratio_clamp=clamp, adv_tau=cfg.adv_tau)


ESTIMATOR = framework_estimator("trl", compose, TRLConfig, "TRL GRPOTrainer's vLLM IS correction and OPSM.")
SOURCE = "huggingface/trl@1.16.0: trl/trainer/grpo_trainer.py"
_NO_CLAMP = "no log-ratio clamp"
_MODES = ("since 2025-11-30 (TRL #4530, release v0.26.0: vllm_importance_sampling_mode); clip_min since "
          "2026-06-11 (#4732, v1.6.0)")
_OPSM = "since 2026-01-06 (TRL #4689, release v0.27.0)"

PRESETS = [
    Preset("trl/token_truncate", f"Token TIS min(rho_t, 3) ({_NO_CLAMP}).", SOURCE,
           ESTIMATOR, TRLConfig(vllm_importance_sampling_mode="token_truncate"), versions=_MODES),
    Preset("trl/token_mask", "Token MIS: rho_t where rho_t <= 3, else 0 (one-sided: clip_min is None), decided "
           "on exp(l_t) against 3 in the compute dtype (grpo_trainer.py:2698: l = log 3 is dropped in float64).",
           SOURCE,
           ESTIMATOR, TRLConfig(vllm_importance_sampling_mode="token_mask"), versions=_MODES),
    Preset("trl/sequence_truncate", f"Sequence TIS min(exp(S), 3) ({_NO_CLAMP}).", SOURCE,
           ESTIMATOR, TRLConfig(vllm_importance_sampling_mode="sequence_truncate"), versions=_MODES),
    Preset("trl/sequence_mask", "TRL's default: exp(S) where exp(S) <= 3, else 0 (one-sided; decided on exp(S) "
           "against 3 in the compute dtype, grpo_trainer.py:2698; the config docstring names token_truncate as the "
           "default, the code uses sequence_mask).", SOURCE,
           ESTIMATOR, TRLConfig(), versions=_MODES),
    Preset("trl/opsm", "OPSM (DeepSeek-V3.2) delta 0.5 (no code default; TRL's docs and tests use 0.5): drop "
           "rollouts with A < 0 and mean(-l) > 0.5, on top of the default sequence_mask IS.",
           f"{SOURCE} (get_off_policy_mask)", ESTIMATOR, TRLConfig(off_policy_mask_threshold=0.5),
           versions=_OPSM),
    Preset("trl/vespo", "VESPO (loss_type vespo, token_truncate at 3): phi(W) = exp(lambda + k log W - lambda W) on "
           "every token, W = prod_t min(rho_t, 3) with log-ratios clamped to +-20 (TRL's lower bound is log 1e-8: "
           "phi there is below 1e-15 either way), (k, lambda) = (2, 3) for A >= 0, (3, 2) below.",
           f"{SOURCE} (get_gamma_weights)", ESTIMATOR,
           TRLConfig(vllm_importance_sampling_mode="token_truncate", loss_type="vespo"),
           versions="since 2026-03-13 (TRL #5199, release v1.0.0)"),
    Preset("trl/tis_2025_09", "TRL's first default (vllm_importance_sampling_cap 2.0): token TIS min(rho_t, 2) "
           f"({_NO_CLAMP}).", "huggingface/trl@12fc85f: trl/trainer/grpo_trainer.py (_generate_and_score_completions)",
           ESTIMATOR, TRLConfig(vllm_importance_sampling_mode="token_truncate", vllm_importance_sampling_clip_max=2.0),
           versions="the default 2025-09-03 .. 2025-11-30 (TRL #3867 .. #4530; releases v0.23.0 - v0.25)"),
]
