"""Tinker's built-in RL losses (forward_backward's loss_fn), each against the sampler's own log-probs.

    ratio               r_t = exp(target_logprobs - sampling_logprobs) = pi_t / mu_t (no clamp: exp overflows fp32
                        to inf past l = 88.7; seqis caps every weight at e^40)
    importance_sampling loss = -sum_t r_t A_t: gradient weight r_t, unbounded
    ppo                 loss = -sum_t min(r_t A_t, clip(r_t, clip_low, clip_high) A_t): weight r_t where the clip
                        leaves a gradient (A > 0: r_t <= clip_high; A < 0: r_t >= clip_low), edges kept
    cispo               loss = -sum_t sg(clip(r_t, clip_low, clip_high)) A_t log pi_t: weight clip(r_t, ...)

Defaults (loss_fn_config): ppo clip_low_threshold 0.8, clip_high_threshold 1.2; cispo 0.0 and 4.0 (one-sided: a
lower threshold of 0 changes nothing). Every loss is a plain sum over tokens (no normaliser: fold one into the
advantages), and the sampler is the only old policy, so these weights are the correction at every step. The losses
run on Tinker's servers: what they compute is the code shown in Tinker's loss docs (tinker-docs losses pages) and
the cookbook's tutorial, which also give the defaults; the SDK (tinker 0.38.0) only sends loss_fn and
loss_fn_config. Not covered: dro (a soft advantage computed client-side), gspo and stable_reinforce (no documented
defaults in the copies read).
Source: thinking-machines-lab/tinker-cookbook, tutorials/202_loss_functions.py (the defaults), docs/losses.mdx
(removed 2026-03-29; now the tinker-docs losses pages). Read at 9dfcc3a2 (2026-08-19).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.compose import Composition, Weight, ppo_clip_criteria
from ..core.spec import Preset
from ..core.types import Config, knob
from ._preset import framework_estimator

DEFAULT_THRESHOLDS = {"ppo": (0.8, 1.2), "cispo": (0.0, 4.0)}  # the server's when loss_fn_config leaves them out


@dataclass(frozen=True)
class TinkerConfig(Config):
    """forward_backward's loss_fn and loss_fn_config; Tinker's names."""

    loss_fn: str = knob("importance_sampling", "The built-in RL loss.", choices=("importance_sampling", "ppo",
                                                                                 "cispo"))
    clip_low_threshold: float | None = knob(None, "ppo / cispo: the ratio's lower clip; None = the loss's default "
                                            "(0.8 / 0.0).", optional=True, ge=0.0, ui=(0.0, 1.0))
    clip_high_threshold: float | None = knob(None, "ppo / cispo: the ratio's upper clip; None = the loss's default "
                                             "(1.2 / 4.0).", optional=True, gt=0.0, ui=(1.0, 10.0), log=True, inf=True)

    def thresholds(self) -> tuple[float, float]:
        lo, hi = DEFAULT_THRESHOLDS.get(self.loss_fn, (0.0, 0.0))
        return (lo if self.clip_low_threshold is None else self.clip_low_threshold,
                hi if self.clip_high_threshold is None else self.clip_high_threshold)

    def __post_init__(self):
        super().__post_init__()
        if self.loss_fn != "importance_sampling":
            lo, hi = self.thresholds()
            if not lo < hi:
                raise ValueError(f"clip_low_threshold must be below clip_high_threshold, got {lo} >= {hi}")


def compose(cfg: TinkerConfig) -> Composition:
    if cfg.loss_fn == "importance_sampling":
        return Composition(Weight("token"), adv_tau=cfg.adv_tau)
    lo, hi = cfg.thresholds()
    if cfg.loss_fn == "ppo":
        return Composition(Weight("token"), ppo_clip_criteria(1.0 - lo, hi - 1.0), adv_tau=cfg.adv_tau)
    return Composition(Weight("token", clip=hi, clip_low=lo), adv_tau=cfg.adv_tau)


ESTIMATOR = framework_estimator("tinker", compose, TinkerConfig, "Tinker's built-in RL losses.")
SOURCE = "thinking-machines-lab/tinker-cookbook@9dfcc3a2: tutorials/202_loss_functions.py (Tinker's loss docs)"
_SUM = "summed over tokens, no normaliser; no log-ratio clamp"

SHIPPED_IS = (  # when the framework shipped it (Preset.versions)
    "since 2025-10-01 (Tinker's launch; documented in tinker-cookbook docs/losses.mdx from 2025-12-14, "
    '#173)'
)
SHIPPED_PPO = (  # when the framework shipped it (Preset.versions)
    'since 2025-10-01; thresholds 0.8 / 1.2 documented as the default since 2026-04-01 (#562)'
)
SHIPPED_CISPO = (  # when the framework shipped it (Preset.versions)
    'the one-sided default documented since 2026-06-05 (tinker-cookbook #763)'
)
SHIPPED_CISPO_TWO_SIDED = (  # when the framework shipped it (Preset.versions)
    "2026-04-01 .. 2026-06-05, when the tutorial named 0.8 / 1.2 as CISPO's default too (#562 .. #763)"
)

PRESETS = [
    Preset("tinker/importance_sampling", f"Tinker's RL default: weight rho_t = pi/mu, unbounded ({_SUM}).", SOURCE,
           ESTIMATOR, TinkerConfig(), versions=SHIPPED_IS),
    Preset("tinker/ppo", f"PPO-clip against the sampler: rho_t where A > 0 and rho_t <= 1.2 or A < 0 and "
           f"rho_t >= 0.8, else no gradient ({_SUM}).", SOURCE, ESTIMATOR, TinkerConfig(loss_fn="ppo"),
           versions=SHIPPED_PPO),
    Preset("tinker/cispo", f"CISPO: weight min(rho_t, 4) (clip_low_threshold 0: one-sided; {_SUM}).", SOURCE,
           ESTIMATOR, TinkerConfig(loss_fn="cispo"), versions=SHIPPED_CISPO),
    Preset("tinker/cispo_two_sided", f"CISPO as the tutorial described its default before 2026-06-05: "
           f"clip(rho_t, 0.8, 1.2) ({_SUM}).", SOURCE, ESTIMATOR,
           TinkerConfig(loss_fn="cispo", clip_low_threshold=0.8, clip_high_threshold=1.2),
           versions=SHIPPED_CISPO_TWO_SIDED),
]
