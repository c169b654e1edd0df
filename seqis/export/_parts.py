"""Reading a composition's parts the way exporters need them: the PPO-clip pattern, the three token-IS modes,
plain weights, open edges."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..estimators.compose import Composition, Criterion, Weight
from ._format import CannotExpress


@dataclass(frozen=True)
class PPOClip:
    eps_low: float  # A < 0 keeps r >= 1 - eps_low
    eps_high: float  # A > 0 keeps r <= 1 + eps_high
    clip_c: float | None  # A < 0 keeps r <= clip_c (dual clip); None = off


def split_ppo_clip(comp: Composition) -> tuple[PPOClip | None, tuple[Criterion, ...]]:
    """The PPO-clip criteria pair (see presets._preset.ppo_clip_criteria) if the composition has it, and the
    other criteria. The weight must then be the plain token ratio (PPO's gradient is r * A)."""
    up = [c for c in comp.criteria if c.statistic == "ratio" and c.agg == "token" and c.advantage == "positive"
          and c.low is None and c.high is not None]
    down = [c for c in comp.criteria if c.statistic == "ratio" and c.agg == "token" and c.advantage == "negative"
            and c.low is not None]
    if len(up) != 1 or len(down) != 1 or not is_plain(comp.weight, "token"):
        return None, comp.criteria
    rest = tuple(c for c in comp.criteria if c is not up[0] and c is not down[0])
    return PPOClip(_clean(1.0 - down[0].low), _clean(up[0].high - 1.0), down[0].high), rest


def _clean(x: float) -> float:
    return float(f"{x:.15g}")  # 1 - 0.8 is 0.2, not 0.19999999999999996


def is_plain(w: Weight, level: str) -> bool:
    """The weight is `level`'s ratio untouched: no clip, no lower clamp, no band, no normalisation."""
    return (w.level == level and math.isinf(w.upper) and w.clip_low == 0.0 and w.band is None
            and not w.self_normalize)


def refuse_conditioned(criteria: tuple[Criterion, ...], framework: str) -> None:
    for c in criteria:
        if c.advantage is not None:
            raise CannotExpress(f"{framework} has no rejection conditioned on the advantage's sign "
                                f"({c.statistic}, {c.agg}, {c.advantage})")


def open_low(x: float | None) -> bool:
    return x is None or x == -math.inf


def open_high(x: float | None) -> bool:
    return x is None or x == math.inf


def token_is_mode(comp: Composition, no: str) -> tuple[str | None, float, float]:
    """The token IS corrections NeMo-RL and OpenRLHF both ship, as (mode, low, high): "tis" (rho_t clamped to
    [low, high]), "icepop" (rho_t inside [low, high], else 0), "seq-mask-tis" (raw rho_t on rollouts whose
    geometric ratio exp(S/T) lies in [low, high]), or None for a plain token ratio. Anything else raises
    CannotExpress starting with `no` (the framework's sentence)."""
    w, crit = comp.weight, comp.criteria
    if w.level != "token" or w.self_normalize:
        raise CannotExpress(f"{no} (this weight: {w.level}{', normalised' if w.self_normalize else ''})")
    if crit:
        c = crit[0]
        if len(crit) > 1 or not is_plain(w, "token") or (c.statistic, c.agg, c.advantage) != ("ratio", "mean", None):
            raise CannotExpress(f"{no} (seq-mask-tis is its only rejection)")
        return "seq-mask-tis", c.low or 0.0, math.inf if c.high is None else c.high
    if w.band is not None:
        if not math.isinf(w.upper) or w.clip_low > 0:
            raise CannotExpress(f"{no} (not both)")
        return "icepop", *w.band
    if not math.isinf(w.upper) or w.clip_low > 0:
        return "tis", w.clip_low, w.upper
    return None, w.clip_low, w.upper
