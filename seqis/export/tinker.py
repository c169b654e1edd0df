"""A composition as Tinker's forward_backward loss_fn and loss_fn_config, every ratio against the sampler:
importance_sampling (rho_t, unbounded), ppo (rho_t where the clip [low, high] leaves a gradient for A's sign),
cispo (rho_t clamped to [low, high]). Tinker clamps no log-ratio; every loss sums over tokens."""

from __future__ import annotations

import math

from ..core.compose import Composition
from ._format import CannotExpress, Settings, adv_tau_note, clamp_note, literal
from ._own import own_settings

HEADER = ["Tinker forward_backward loss (the server computes it)"]
SUFFIX = "tinker.py"
_NO = ("Tinker's built-in losses weigh by the token ratio plain (importance_sampling), PPO-clipped (ppo) or "
       "clamped (cispo): forward_backward_custom for anything else")


def settings(comp: Composition) -> Settings:
    w, notes = comp.weight, []
    if comp.penalty is not None:
        raise CannotExpress("Tinker's built-in losses add no penalty against the sampler (dro's quadratic term "
                            "needs its client-side soft advantage): forward_backward_custom")
    ppo, rest = comp.ppo_clip() or (None, comp.criteria)
    if ppo is not None and not rest and ppo.clip_c is None:
        keys = dict(loss_fn="ppo", clip_low_threshold=1.0 - ppo.eps_low, clip_high_threshold=1.0 + ppo.eps_high)
    elif comp.criteria or w.level != "token" or w.band is not None or w.self_normalize:
        raise CannotExpress(_NO)
    elif w.plain("token"):
        keys = dict(loss_fn="importance_sampling")
    else:
        keys = dict(loss_fn="cispo", clip_low_threshold=w.clip_low, clip_high_threshold=w.upper)
    clamp_note("Tinker", None, comp.log_ratio_clamp, notes)
    adv_tau_note(comp.adv_tau, notes)
    return Settings(keys, notes)


def write(s: Settings) -> list[str]:
    keys = dict(s.keys)
    call = f'training_client.forward_backward_async(data, loss_fn="{keys.pop("loss_fn")}"'
    if keys:
        inf = 'float("inf")'
        config = ", ".join(f'"{k}": {literal(v, inf=inf, null="None", quote=True)}' for k, v in keys.items())
        call += f", loss_fn_config={{{config}}}"
    if any(isinstance(v, float) and math.isinf(v) for v in keys.values()):
        return [call + ")", "# an open threshold is passed as inf"]
    return [call + ")"]


def own_key(name: str, cfg=None) -> str:
    """loss_fn is forward_backward's argument; the thresholds are loss_fn_config's keys."""
    return name if name == "loss_fn" else f"loss_fn_config.{name}"


def own(cfg) -> Settings:
    """Tinker's own preset: its loss and, where the loss takes them, the clip thresholds (importance_sampling has
    none: a threshold the preset leaves unset is named, not passed)."""
    why = ("importance_sampling takes no clip threshold" if cfg.loss_fn == "importance_sampling"
           else f"unset in the preset: Tinker's own default for {cfg.loss_fn} applies")
    unset = {n: why for n in ("clip_low_threshold", "clip_high_threshold") if getattr(cfg, n) is None}
    return own_settings(cfg, lambda n: n, skip=unset)  # write() puts every key but loss_fn in loss_fn_config
