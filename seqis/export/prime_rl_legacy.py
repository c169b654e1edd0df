"""A composition as the `[loss]` table of prime-rl releases before March 2026 (the seed's ablations ran there).

That loss weighs every kept token by rho_t (ratio_type "token") or by min(exp(min(S_j, 10)), sequence_clip_high)
("sequence"), and drops tokens outside [token_mask_low, token_mask_high], rollouts whose geometric ratio leaves
[geo_mask_low, geo_mask_high], and rollouts with a token ratio below sequence_mask_low or above
sequence_mask_high; 0 / inf switch a band off. Its kl_tau term (-kl_tau * rho * l in the coefficient) is not the
composition's penalty: it is written as 0.
"""

from __future__ import annotations

import math

from ..core.compose import Composition
from ._format import CannotExpress, Settings, toml
from ._own import own_settings

HEADER = ["prime-rl before March 2026: the trainer's [loss] table ([trainer.loss] in a combined rl.toml);",
          "0 / inf switch a band off"]
SUFFIX = "prime-rl.toml"  # the same file as the current release's, older keys
_OFF = dict(token_mask_low=0.0, token_mask_high=math.inf, sequence_mask_low=0.0, sequence_mask_high=math.inf,
            geo_mask_low=0.0, geo_mask_high=math.inf)
_SLOT = {"token": ("token_mask_low", "token_mask_high"), "mean": ("geo_mask_low", "geo_mask_high"),
         "min": ("sequence_mask_low", None), "max": (None, "sequence_mask_high")}  # a ratio criterion's agg


def settings(comp: Composition) -> Settings:
    w, notes = comp.weight, []
    if comp.penalty is not None:
        raise CannotExpress("legacy prime-rl's kl_tau enters the coefficient as -kl_tau * rho * l on kept tokens, "
                            "not as a penalty on every loss token")
    if w.band is not None or w.clip_low > 0 or w.self_normalize or w.level not in ("none", "token", "sequence"):
        raise CannotExpress("legacy prime-rl weighs by rho_t or by the truncated product ratio only")
    keys: dict = dict(ratio_type="sequence" if w.level == "sequence" else "token", **_OFF,
                      sequence_clip_high=w.upper if w.level == "sequence" else math.inf)
    if w.level == "token" and not math.isinf(w.upper):
        raise CannotExpress("legacy prime-rl does not truncate token ratios")
    if w.level == "none":
        notes.append("prime-rl weighs each kept token by rho_t (ratio_type token); this correction weighs it 1")
    if w.level == "sequence" and w.upper > math.exp(10):
        notes.append("legacy prime-rl caps log w at 10 before truncating (seqis at 40)")
    for c in comp.criteria:
        slot = _SLOT.get(c.agg) if c.statistic == "ratio" and c.advantage is None else None
        if slot is None or (slot[0] is None and c.low is not None) or (slot[1] is None and c.high is not None):
            raise CannotExpress(f"legacy prime-rl has no {c.statistic} {c.agg} criterion"
                                f"{' conditioned on the advantage' if c.advantage else ''}")
        for key, v in zip(slot, (c.low, c.high)):
            if key is not None and v is not None:
                keys[key] = v
    if comp.log_ratio_clamp is not None:
        notes.append(f"legacy prime-rl clamps no token log-ratio (this correction: +-{comp.log_ratio_clamp})")
    keys.update(adv_tau=comp.adv_tau, kl_tau=0.0)
    return Settings(keys, notes)


def write(s: Settings) -> list[str]:
    return toml("loss", s.keys)


def own_key(name: str, cfg=None) -> str:
    """A legacy knob is the [loss] key of the same name (adv_tau too)."""
    return f"loss.{name}"


def own(cfg) -> Settings:
    """v0.2 - v0.4's masked IS: the preset's bands, ratio_type token, the bands it leaves at their defaults (no
    sequence_mask_low, no sequence clip) and its kl_tau at its default 0."""
    extra = dict(ratio_type="token", sequence_mask_low=0.0, sequence_clip_high=math.inf, kl_tau=0.0)
    return own_settings(cfg, lambda name: name, adv_tau_key=True, extra=extra)
