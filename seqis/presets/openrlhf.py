"""OpenRLHF's vLLM IS correction in PolicyLoss (--algo.advantage.is_correction_*).

    tis           clamp(rho_t, low, high)   (two-sided: the low clamp raises small ratios to 0.5)
    icepop        rho_t * 1[low <= rho_t <= high]
    seq-mask-tis  rho_t * 1[low <= exp(S_j/T_j) <= high]  (the code comment says "TIS (token-level clamp)"; the
                  code multiplies by the raw rho_t)

Defaults: is_correction_threshold 0.5 5.0, type tis. The ratio is exp(old - rollout) with no clamp (the +-20
clamp is on the PPO ratio pi_theta / pi_old, which is 1 at the first minibatch).
Source: OpenRLHF/OpenRLHF, openrlhf/models/loss.py (PolicyLoss.forward), openrlhf/cli/train_ppo_ray.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..compose import Composition, Criterion, Weight
from ..spec import Preset
from ..types import Config, knob
from ._preset import framework_estimator


@dataclass(frozen=True)
class OpenRLHFConfig(Config):
    """--algo.advantage.is_correction_* flags (threshold split into its two values)."""

    is_correction_enable: bool = knob(True, "Apply the vLLM IS correction.", choices=(True, False))
    is_correction_type: str = knob("tis", "tis (clamp), icepop (token band), seq-mask-tis (geometric band).",
                                   choices=("tis", "icepop", "seq-mask-tis"))
    is_correction_threshold_low: float = knob(0.5, "Low threshold.", ge=0.0, ui=(0.0, 1.0))
    is_correction_threshold_high: float = knob(5.0, "High threshold.", gt=0.0, ui=(1.0, 10.0), log=True)


def compose(cfg: OpenRLHFConfig) -> Composition:
    lo, hi = cfg.is_correction_threshold_low, cfg.is_correction_threshold_high
    criteria = ()
    if not cfg.is_correction_enable:
        weight = Weight("none")
    elif cfg.is_correction_type == "tis":
        weight = Weight("token", clip=hi, clip_low=lo)
    elif cfg.is_correction_type == "icepop":
        weight = Weight("token", band=(lo, hi))
    else:
        weight, criteria = Weight("token"), (Criterion("ratio", "mean", low=lo, high=hi),)
    return Composition(weight, criteria, adv_tau=cfg.adv_tau)


ESTIMATOR = framework_estimator("openrlhf", compose, OpenRLHFConfig, "OpenRLHF PolicyLoss's vLLM IS correction.")
SOURCE = "OpenRLHF/OpenRLHF: openrlhf/models/loss.py (PolicyLoss)"

PRESETS = [
    Preset("openrlhf/tis", "clamp(rho_t, 0.5, 5): two-sided, small ratios are raised to 0.5.", SOURCE, ESTIMATOR,
           OpenRLHFConfig()),
    Preset("openrlhf/icepop", "rho_t * 1[0.5 <= rho_t <= 5].", SOURCE, ESTIMATOR,
           OpenRLHFConfig(is_correction_type="icepop")),
    Preset("openrlhf/seq-mask-tis", "rho_t (raw: the comment says clamped, the code does not clamp) on rollouts "
           "with 0.5 <= exp(S/T) <= 5.", SOURCE, ESTIMATOR, OpenRLHFConfig(is_correction_type="seq-mask-tis")),
]
