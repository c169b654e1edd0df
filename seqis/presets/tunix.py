"""Tunix's sampler importance sampling (GRPOConfig / agentic GRPOConfig sampler_is), off by default.

    sampler_is "token"  the trainer recomputes the old log-probs (used as pi_old), and the per-token loss is
                        multiplied by sg(min(exp(clip(log pi_old - log mu, -20, 20)), sampler_is_threshold)) on the
                        completion tokens, after the PPO-clip (and dual-clip) loss and before aggregation

Defaults: sampler_is None (no correction), sampler_is_threshold 2.0; GRPO's loss_agg_mode is
sequence-mean-token-mean. Tunix is JAX (jnp.clip, jnp.minimum, jnp.exp in float32); pi_theta / pi_old is 1 at the
first minibatch, so the weight is the correction. A sequence level does not exist (sampler_is accepts None or
"token").
Source: google/tunix, tunix/rl/grpo/grpo_learner.py (GRPOConfig, the sampler_is block of the rollout step),
tunix/rl/agentic/agentic_grpo_learner.py (_sampler_trainer_agreement), tunix/rl/algo_core.py (the policy loss that
applies sampler_is_weights). Read at c7d8950f (2026-08-21).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.compose import SAFETY_BOUND, Composition, Weight
from ..core.spec import Preset
from ..core.types import Config, knob
from ._preset import framework_estimator


@dataclass(frozen=True)
class TunixConfig(Config):
    """GRPOConfig's sampler_is fields; Tunix's names."""

    sampler_is: str | None = knob(None, "Truncated IS against the sampler: 'token' or None (off).", optional=True,
                                  choices=(None, "token"))
    sampler_is_threshold: float = knob(2.0, "The weight's cap.", gt=0.0, ui=(1.0, 10.0), log=True)


def compose(cfg: TunixConfig) -> Composition:
    if cfg.sampler_is is None:
        return Composition(Weight("none"), adv_tau=cfg.adv_tau)
    return Composition(Weight("token", clip=cfg.sampler_is_threshold), log_ratio_clamp=SAFETY_BOUND,
                       adv_tau=cfg.adv_tau)


ESTIMATOR = framework_estimator("tunix", compose, TunixConfig, "Tunix GRPO's sampler importance sampling.")
SOURCE = "google/tunix@c7d8950f: tunix/rl/grpo/grpo_learner.py (GRPOConfig.sampler_is)"

SHIPPED_SAMPLER_IS = (  # when the framework shipped it (Preset.versions)
    'agentic GRPO since 2026-05-17 (49b63f71, released in google-tunix 0.1.7), GRPO since 2026-07-27 '
    '(d14317fe)'
)

PRESETS = [
    Preset("tunix/sampler_is", "sampler_is='token': weight min(rho_t, 2), l clamped to +-20 (the option is off by "
           "default).", SOURCE, ESTIMATOR, TunixConfig(sampler_is="token"), versions=SHIPPED_SAMPLER_IS),
]
