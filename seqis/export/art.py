"""A composition as ART's experimental train config (model.train(..., _config=art.dev.TrainConfig(...))).

Every ratio is to the trajectories' own log-probs (the sampler's), its log clamped to +-20. ppo=False (CISPO):
weight clip(ratio, 1 - epsilon, 1 + epsilon_high), ratio per token or the sequence's geometric mean; ppo=True:
PPO-clip of the token ratio, and max_negative_advantage_importance_sampling_weight m drops tokens above m.
"""

from __future__ import annotations

from ..core.compose import SAFETY_BOUND, Composition
from ._format import CannotExpress, Settings, adv_tau_note, clamp_note, python_kwargs
from ._own import own_settings

HEADER = ["ART experimental train config (art.dev.TrainConfig)"]
SUFFIX = "art.py"
CLAMP = SAFETY_BOUND


def _clean(x: float) -> float:
    return float(f"{x:.15g}")  # 1 - 0.8 is 0.2, not 0.19999999999999996


def settings(comp: Composition) -> Settings:
    w, notes = comp.weight, []
    if comp.penalty is not None:
        raise CannotExpress("ART's KL penalty (kl_penalty_coef) is to a reference adapter, not the sampler")
    if w.level == "none":
        raise CannotExpress("ART always weighs by the ratio to the trajectories' log-probs (without them every "
                            "ratio is 1: allow_training_without_logprobs)")
    ppo, rest = comp.ppo_clip() or (None, comp.criteria)
    if ppo is not None:
        if ppo.clip_c is not None:
            raise CannotExpress("ART's PPO has no dual clip")
        keys: dict = dict(ppo=True, epsilon=ppo.eps_low, epsilon_high=ppo.eps_high)
        for c in rest:
            if (c.statistic, c.agg, c.advantage, c.low) != ("ratio", "token", None, None) or len(rest) > 1:
                raise CannotExpress("ART's PPO rejects no more than the tokens above one ratio cap "
                                    "(max_negative_advantage_importance_sampling_weight)")
            keys["max_negative_advantage_importance_sampling_weight"] = c.high
    else:
        if comp.criteria or w.level not in ("token", "geometric") or w.band is not None or w.self_normalize:
            raise CannotExpress("ART's CISPO weight is the token ratio or the geometric mean clipped to "
                                "[1 - epsilon, 1 + epsilon_high]; its PPO is the clip pattern of the token ratio")
        if w.clip_low > 1.0 or w.upper < 1.0:
            raise CannotExpress(f"ART's clip band [1 - epsilon, 1 + epsilon_high] holds 1, not [{w.clip_low}, "
                                f"{w.upper}]")
        keys = dict(ppo=False, epsilon=_clean(1.0 - w.clip_low), epsilon_high=_clean(w.upper - 1.0),
                    importance_sampling_level="sequence" if w.level == "geometric" else "token")
    clamp_note("ART", CLAMP, comp.log_ratio_clamp, notes)
    adv_tau_note(comp.adv_tau, notes)
    return Settings(keys, notes)


def write(s: Settings) -> list[str]:
    return python_kwargs("art.dev.TrainConfig", s.keys)


def own_key(name: str, cfg=None) -> str:
    """An ArtConfig knob is the art.dev.TrainConfig field of the same name (None: ART's default)."""
    return name


def own(cfg) -> Settings:
    return own_settings(cfg, own_key)
