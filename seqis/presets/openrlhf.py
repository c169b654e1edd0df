"""OpenRLHF's vLLM IS correction in PolicyLoss (--algo.advantage.is_correction_*) and GSPO against the sampler.

    statistic     rho_t = exp(old - rollout) per token (level token) or the rollout's geometric mean
                  exp(mean_t l_t) (level seq); no log-ratio clamp (the +-20 clamp is on PPO's pi_theta / pi_old,
                  1 at the first minibatch)
    clip          (level token, gating ratio) clamp(rho_t, low, high): two-sided, small ratios raised to low (tis)
    mask          keep a token (level token: icepop) or a rollout (level seq: seq-mask-tis) whose statistic lies in
                  [low, high]; the kept tokens weigh their own raw rho_t (not clamped, whatever the old comment said);
                  the band compares the statistic itself with its bounds (loss.py:238: ratio space, edge_space
                  "ratio")
    gspo          policy_loss_type gspo with the correction on: PPO-clip on the geometric ratio pi/mu, r_j =
                  exp(mean_t l_t) (no clamp), A > 0 keeps r_j <= 1 + eps_high, A < 0 keeps r_j >= 1 - eps_low;
                  the weight is r_j on every token; the loss is a per-rollout mean (agg="seq-mean-token-mean")

Defaults: threshold 0.5 5.0, level off (the presets turn it on), eps_clip 0.2, token-mean loss. Since #1339
(2026-09-14, openrlhf 0.11) the three former types are --is_correction_level / _mode / _gating (tis = token clip,
icepop = token mask, seq-mask-tis = seq mask). Before it, with --is_correction_enable / _type: icepop multiplied
exp(l) by its 0/1 mask, so a rejected token whose exp(l) overflowed float32 (l > 88.7) made the loss NaN (fixed by
#1314, 2026-08); seq-mask-tis did the same per rollout until #1339. seqis gives such a token the fixed code's 0.
GSPO's exp(mean l) has no clamp: a rollout with mean l > 88.7 in float32 gives inf, and a NaN gradient.
Not kept here (a part the composition lacks): gating binary_kl / tv.
Source: OpenRLHF/OpenRLHF, openrlhf/models/loss.py (PolicyLoss.forward), openrlhf/cli/train_ppo_ray.py. Read in
pip openrlhf 0.11.2 (2026-09) and at 3c3be62 (2026-08-13, the former flags).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.compose import Composition, Criterion, Weight
from ..core.spec import Preset
from ..core.types import Config, knob
from ._preset import framework_estimator


@dataclass(frozen=True)
class OpenRLHFConfig(Config):
    """--algo.advantage.is_correction_* (threshold split into its two values) and --actor.* flags."""

    is_correction_level: str = knob("off", "off, token (each token) or seq (the rollout's geometric mean).",
                                    choices=("off", "token", "seq"))
    is_correction_mode: str = knob("mask", "mask (drop outside the band; kept tokens weigh rho_t) or clip (clamp "
                                   "rho_t into it; level token).", choices=("mask", "clip"))
    is_correction_threshold_low: float = knob(0.5, "Low threshold.", ge=0.0, ui=(0.0, 1.0))
    is_correction_threshold_high: float = knob(5.0, "High threshold.", gt=0.0, ui=(1.0, 10.0), log=True)
    policy_loss_type: str = knob("ppo", "ppo, or gspo (PPO-clip on the geometric ratio pi/mu when the correction "
                                 "is on).", choices=("ppo", "gspo"))
    eps_clip_low: float = knob(0.2, "--actor.eps_clip_low_high[0] (gspo).", gt=0.0, ui=(1e-4, 1.0), log=True,
                               band=False, inf=True)
    eps_clip_high: float = knob(0.2, "--actor.eps_clip_low_high[1] (gspo).", gt=0.0, ui=(1e-4, 1.0), log=True, inf=True)
    dual_clip: float | None = knob(None, "--actor.dual_clip for A < 0 (gspo); None = off.", optional=True, gt=1.0,
                                   ui=(1.5, 10.0), inf=True)

    def __post_init__(self):
        super().__post_init__()
        if self.is_correction_mode == "clip" and self.is_correction_level == "seq":
            raise ValueError("is_correction_mode=clip requires is_correction_level=token (OpenRLHF raises)")


def _gspo(cfg: OpenRLHFConfig) -> Composition:
    criteria = (Criterion("ratio", "mean", high=1.0 + cfg.eps_clip_high, advantage="positive"),
                Criterion("ratio", "mean", low=1.0 - cfg.eps_clip_low, high=cfg.dual_clip, advantage="negative"))
    return Composition(Weight("geometric"), criteria, adv_tau=cfg.adv_tau)


def compose(cfg: OpenRLHFConfig) -> Composition:
    lo, hi = cfg.is_correction_threshold_low, cfg.is_correction_threshold_high
    level = cfg.is_correction_level
    if cfg.policy_loss_type == "gspo":  # the correction block is skipped: GSPO's ratio is against the rollout
        return _gspo(cfg) if level != "off" else Composition(Weight("none"), adv_tau=cfg.adv_tau)
    criteria = ()
    if level == "off":
        weight = Weight("none")
    elif cfg.is_correction_mode == "clip":
        weight = Weight("token", clip=hi, clip_low=lo)
    elif level == "token":  # keep = (stat >= low) & (stat <= high) on stat = exp(l) (loss.py:238): ratio space
        weight = Weight("token", band=(lo, hi), edge_space="ratio")
    else:  # stat = exp(masked_mean(l)) (loss.py:223)
        weight, criteria = Weight("token"), (Criterion("ratio", "mean", low=lo, high=hi, edge_space="ratio"),)
    return Composition(weight, criteria, adv_tau=cfg.adv_tau)


ESTIMATOR = framework_estimator("openrlhf", compose, OpenRLHFConfig, "OpenRLHF PolicyLoss's vLLM IS correction.")
SOURCE = "OpenRLHF/OpenRLHF@0.11.2: openrlhf/models/loss.py (PolicyLoss)"
_SINCE_1339 = "as --is_correction_level / _mode since 2026-09-14 (OpenRLHF #1339)"

PRESETS = [
    Preset("openrlhf/tis", "clamp(rho_t, 0.5, 5): two-sided, small ratios are raised to 0.5 (level token, mode "
           "clip).", SOURCE, ESTIMATOR, OpenRLHFConfig(is_correction_level="token", is_correction_mode="clip"),
           versions=f"since 2025-08-06 (OpenRLHF #1098, is_correction_type tis); {_SINCE_1339}"),
    Preset("openrlhf/icepop", "rho_t * 1[0.5 <= rho_t <= 5] (level token, mode mask); before #1314 (2026-08) a "
           "rejected token with l > 88.7 (exp overflowing float32) made the loss NaN, seqis gives it 0.", SOURCE,
           ESTIMATOR, OpenRLHFConfig(is_correction_level="token"),
           versions=f"since 2025-12-11 (OpenRLHF, icepop for MoE RL); NaN-safe since #1314; {_SINCE_1339}"),
    Preset("openrlhf/seq-mask-tis", "rho_t (raw: the old comment said clamped, the code never clamped) on rollouts "
           "with 0.5 <= exp(S/T) <= 5 (level seq, mode mask); before #1339 a token with l > 88.7 in float32 made "
           "the loss NaN (inf * 0), seqis gives the fixed code's answer.", SOURCE, ESTIMATOR,
           OpenRLHFConfig(is_correction_level="seq"),
           versions=f"since 2026-02-05 (OpenRLHF, as mis; seq-mask-tis since 2026-02-06); {_SINCE_1339}"),
    Preset("openrlhf/gspo-is", "GSPO with the IS correction on: PPO-clip on the geometric ratio exp(S/T) of pi/mu "
           "(eps 0.2: A > 0 keeps it <= 1.2, A < 0 >= 0.8), weight exp(S/T) on every token, a per-rollout mean "
           "loss (agg seq-mean-token-mean); no clamp: mean l > 88.7 in float32 gives a NaN gradient there.",
           SOURCE, ESTIMATOR, OpenRLHFConfig(is_correction_level="token", policy_loss_type="gspo"),
           versions="since 2025-08-08 (OpenRLHF, GSPO with enable_vllm_is_correction); any level but off since "
           "#1339"),
]
