"""Reading a composition's parts the way exporters need them: the three token-IS modes, open edges, a refusal of
sign-conditioned rules. What a composition says about itself (its PPO-clip pattern, whether its weight is plain,
its bands) it answers itself: seqis.compose."""

from __future__ import annotations

import math

from ..compose import Composition, Criterion
from ._format import CannotExpress


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
        if len(crit) > 1 or not w.plain("token") or (c.statistic, c.agg, c.advantage) != ("ratio", "mean", None):
            raise CannotExpress(f"{no} (seq-mask-tis is its only rejection)")
        return "seq-mask-tis", c.low or 0.0, math.inf if c.high is None else c.high
    if w.band is not None:
        if not math.isinf(w.upper) or w.clip_low > 0:
            raise CannotExpress(f"{no} (not both)")
        return "icepop", *w.band
    if not math.isinf(w.upper) or w.clip_low > 0:
        return "tis", w.clip_low, w.upper
    return None, w.clip_low, w.upper
