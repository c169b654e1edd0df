"""A composition as Tunix GRPOConfig arguments: sampler_is="token" weighs every completion token by
min(exp(clip(l, -20, 20)), sampler_is_threshold), detached; None applies no sampler weight."""

from __future__ import annotations

from ..core.compose import SAFETY_BOUND, Composition
from ._format import CannotExpress, Settings, adv_tau_note, clamp_note, python_kwargs
from ._own import own_settings

HEADER = ["Tunix GRPOConfig arguments (tunix.rl.grpo.grpo_learner; the agentic GRPOConfig has the same two)"]
SUFFIX = "tunix.py"
CLAMP = SAFETY_BOUND


def settings(comp: Composition) -> Settings:
    w, notes = comp.weight, []
    if comp.penalty is not None:
        raise CannotExpress("Tunix's KL term (beta) is to a reference model, not the sampler")
    if comp.criteria:
        raise CannotExpress("Tunix rejects no token or rollout by its ratio to the sampler")
    if w.level == "none":
        return Settings({"sampler_is": None}, notes)
    if w.level != "token" or w.band is not None or w.clip_low > 0 or w.self_normalize:
        raise CannotExpress("Tunix's sampler_is is a token ratio truncated from above only")
    clamp_note("Tunix", CLAMP, comp.log_ratio_clamp, notes)
    adv_tau_note(comp.adv_tau, notes)
    return Settings({"sampler_is": "token", "sampler_is_threshold": w.upper}, notes)


def write(s: Settings) -> list[str]:
    return python_kwargs("GRPOConfig", s.keys)


def own_key(name: str, cfg=None) -> str:
    """A TunixConfig knob is the GRPOConfig argument of the same name."""
    return name


def own(cfg) -> Settings:
    return own_settings(cfg, own_key)
