"""ART's policy loss (art/loss.py, loss_fn), whose old policy is the sampler: the trajectories' own log-probs.

    l_t        log pi_t - log mu_t (a missing or non-finite mu_t counts as pi_t: ratio 1), clamped to +-20 (+-10 in
               fp16) since 0.5.21
    ratio      token exp(l_t); importance_sampling_level "sequence": exp(clamp(mean_t l_t)) of the group's tokens
               (the mean divides by T + 1e-8: group_aggregate's eps)
    cap        max_negative_advantage_importance_sampling_weight m: ratio = min(ratio, m) on EVERY token (the name
               says negative advantages; the code does not look at A)
    CISPO      ppo False (the default): loss -sg(clip(ratio, 1 - epsilon, 1 + epsilon_high)) A log pi, epsilon 1.0 and
               epsilon_high 4.0 by default: weight clip(rho_t, 0, 5)
    PPO        ppo True: loss -min(ratio A, clip(ratio, 1 - epsilon, 1 + epsilon_high) A), epsilon 0.2, epsilon_high
               = epsilon; a token with |l| > 20, or above m, gets no gradient (the clamps')

The loss is divided by the assistant tokens (token-mean). Refused (compose raises): mask_prob_ratio (a strict band
1 - epsilon < ratio < 1 + epsilon_high, which needs open band edges), the average and geometric_average levels
(no composition weight mixes the token and sequence ratios), PPO at sequence level (its gradient spreads the
sequence ratio over the tokens as 1/T, not a per-token weight), and truncated_importance_sampling (it reads the
trainer's precalculated log-probs beside the sampler's).
Source: OpenPipe/ART, src/art/loss.py (loss_fn) in release 0.5.23 (openpipe-art on PyPI; the stored repository copy
stops at 2025-06-14), src/art/dev/train.py (TrainConfig).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.compose import SAFETY_BOUND, Composition, Criterion, Weight, ppo_clip_criteria
from ..core.spec import Preset
from ..core.types import Config, knob
from ._preset import framework_estimator

LEVELS = ("token", "sequence", "average", "geometric_average")


@dataclass(frozen=True)
class ArtConfig(Config):
    """dev.TrainConfig's loss fields (model.train(..., _config=...)); ART's names. None = the loss's default."""

    ppo: bool = knob(False, "PPO-clip (True) or CISPO (False, the default since 0.5.5).", choices=(True, False))
    epsilon: float | None = knob(None, "Lower clip 1 - epsilon; None = 1.0 (CISPO) / 0.2 (PPO).", optional=True,
                                 ge=0.0, ui=(0.0, 1.0))
    epsilon_high: float | None = knob(None, "Upper clip 1 + epsilon_high; None = 4.0 (CISPO) / epsilon (PPO).",
                                      optional=True, ge=0.0, ui=(0.0, 10.0))
    importance_sampling_level: str = knob("token", "The ratio: per token, or the sequence's geometric mean.",
                                          choices=LEVELS)
    max_negative_advantage_importance_sampling_weight: float | None = knob(
        None, "Cap every token's ratio at this (despite the name); None = off.", optional=True, gt=0.0,
        ui=(1.0, 10.0), log=True)
    mask_prob_ratio: bool = knob(False, "Zero ratios outside the open clip band (needs strict edges: refused).",
                                 choices=(True, False))

    def clip_band(self) -> tuple[float, float]:
        """(1 - epsilon, 1 + epsilon_high) with the loss's defaults."""
        eps = self.epsilon if self.epsilon is not None else (0.2 if self.ppo else 1.0)
        high = self.epsilon_high if self.epsilon_high is not None else (eps if self.ppo else 4.0)
        return 1.0 - eps, 1.0 + high

    def __post_init__(self):
        super().__post_init__()
        if self.mask_prob_ratio:
            raise ValueError("mask_prob_ratio keeps 1 - epsilon < ratio < 1 + epsilon_high, a band with open edges "
                             "the composition does not have yet (issue 23)")
        if self.importance_sampling_level in ("average", "geometric_average"):
            raise ValueError(f"importance_sampling_level {self.importance_sampling_level!r} mixes the token and "
                             "sequence ratios: no composition weight does")
        if self.ppo and self.importance_sampling_level == "sequence":
            raise ValueError("ppo with importance_sampling_level 'sequence' spreads the sequence ratio's gradient "
                             "over the tokens (1/T each): not a per-token weight")
        lo, hi = self.clip_band()
        m = self.max_negative_advantage_importance_sampling_weight
        if not self.ppo and m is not None and m <= max(lo, 0.0):
            raise ValueError(f"max_negative_advantage_importance_sampling_weight ({m}) must be above 1 - epsilon "
                             f"({lo}) for CISPO")


def compose(cfg: ArtConfig) -> Composition:
    lo, hi = cfg.clip_band()
    m = cfg.max_negative_advantage_importance_sampling_weight
    if cfg.ppo:  # PPO's gradient: r A where the clip leaves one; min(r, m) has none above m
        criteria = ppo_clip_criteria(1.0 - lo, hi - 1.0)
        if m is not None:
            criteria = (*criteria, Criterion("ratio", "token", high=m))
        return Composition(Weight("token"), criteria, log_ratio_clamp=SAFETY_BOUND, adv_tau=cfg.adv_tau)
    level = "geometric" if cfg.importance_sampling_level == "sequence" else "token"
    weight = Weight(level, clip=hi if m is None else min(hi, m), clip_low=max(lo, 0.0))
    return Composition(weight, log_ratio_clamp=SAFETY_BOUND, adv_tau=cfg.adv_tau)


ESTIMATOR = framework_estimator("art", compose, ArtConfig, "ART's policy loss against the sampler.")
SOURCE = "OpenPipe/ART@0.5.23: src/art/loss.py (loss_fn)"

SHIPPED_CISPO = (  # when the framework shipped it (Preset.versions)
    'CISPO the default since 0.5.5 (ART #498); the +-20 log-ratio clamp since 0.5.21'
)
SHIPPED_PPO = (  # when the framework shipped it (Preset.versions)
    "ART's default through 0.5.4 (then without the +-20 clamp); ppo=True since"
)

PRESETS = [
    Preset("art/default", "ART's default (CISPO): weight clip(rho_t, 0, 5) against the sampler (epsilon 1, "
           "epsilon_high 4), l clamped to +-20 first.", SOURCE, ESTIMATOR, ArtConfig(), versions=SHIPPED_CISPO),
    Preset("art/ppo", "PPO-clip 0.2 / 0.2 against the sampler (ppo=True; ART's default through 0.5.4); a token with "
           "|l| > 20 gets no gradient in ART (the clamp's), seqis weighs it e^+-20.", SOURCE, ESTIMATOR,
           ArtConfig(ppo=True), versions=SHIPPED_PPO),
]
