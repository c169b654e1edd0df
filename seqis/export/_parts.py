"""Reading a composition's parts the way exporters need them: the three token-IS modes, open edges, a refusal of
sign-conditioned rules. What a composition says about itself (its PPO-clip pattern, whether its weight is plain,
its bands) it answers itself: seqis.core.compose."""

from __future__ import annotations

import math

from ..core.compose import Composition, Criterion
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


# the composition's later parts (issue 23): an exporter writes one only if its module's PARTS names it, so a
# framework without the setting refuses the correction instead of dropping the part unnoticed
LATER_STATISTICS = ("exp_abs_log_ratio", "abs_ratio_minus_one", "binary_kl", "binary_kl_mu")


def later_parts(comp: Composition) -> set[str]:
    """The later parts a composition uses: 'strict', 'leaves_normaliser', 'batch_rule', 'clamp_order',
    'weight_clamp_order' (the weight aggregates each clamped l_t, where that differs: a sequence, geometric or
    prefix weight under a clamp), 'gamma', 'token_clip', 'normalize_all', 'centering' (score centering over the
    sampler's head) and each later statistic by its name.
    A band's edge space is the framework's arithmetic, not a setting: see edge_note."""
    used = {c.statistic for c in comp.criteria if c.statistic in LATER_STATISTICS}
    used |= {flag for c in comp.criteria for flag in ("strict", "leaves_normaliser") if getattr(c, flag)}
    if comp.batch_rule is not None:
        used.add("batch_rule")
    if comp.clamp_order != "token" and comp.log_ratio_clamp is not None:
        used.add("clamp_order")
    if each_token_clamped(comp):
        used.add("weight_clamp_order")
    used |= {name for name in ("gamma", "token_clip") if getattr(comp.weight, name) is not None}
    if comp.weight.normalize_all:
        used.add("normalize_all")
    if comp.centering is not None:
        used.add("centering")
    return used


def each_token_clamped(comp: Composition) -> bool:
    """Whether the weight aggregates each token's clamped l_t where clamping the aggregate would differ."""
    return (comp.weight_clamp_order == "token" and comp.log_ratio_clamp is not None
            and comp.weight.level in ("sequence", "geometric", "prefix"))


def edge_spaces(comp: Composition) -> set[str]:
    """The spaces ("log", "ratio") the composition's bands on a ratio decide their edges in. A ratio rule
    conditioned on the advantage's sign is left out: it is a PPO-style clip (PPO, GSPO, DPPO), which a framework
    decides through its loss's gradient (min(r A, clip(r) A); a tie at the edge splits it), not by comparing."""
    spaces = {c.edge_space for c in comp.criteria if c.statistic == "ratio" and c.advantage is None}
    if comp.weight.band is not None:
        spaces.add(comp.weight.edge_space)
    return spaces


def edge_note(comp: Composition, framework: str, space: str | None) -> str | None:
    """A NOTE when the framework decides a ratio band's edge in another space than the composition (space: the
    exporter's EDGE_SPACE, None where seqis has not read it off the framework's code): a ratio within an ulp or so
    of an edge can fall the other way. None when they agree, or the composition has no band on a ratio."""
    theirs = {"ratio": "exp(l) against C", "log": "l against log C"}
    other = edge_spaces(comp) - ({space} if space else set())
    if not other or (space is None and other == {"log"}):
        return None
    how = f"{framework} compares {theirs[space]}" if space else f"{framework}'s arithmetic at a band's edge is unread"
    ours = " and ".join(theirs[s] for s in sorted(other))
    return f"{how}; this correction compares {ours}: a ratio within an ulp or so of an edge can fall the other way"
