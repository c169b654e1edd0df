"""A composition as OpenRLHF flags (--algo.advantage.is_correction_*): tis clamps rho_t to [low, high], icepop
zeroes it outside, seq-mask-tis keeps raw rho_t on rollouts whose geometric ratio lies in [low, high]."""

from __future__ import annotations

import math

from ..estimators.compose import Composition
from ._format import CannotExpress, Settings, adv_tau_note, flags
from ._parts import is_plain

HEADER = ["OpenRLHF train_ppo_ray flags"]
SUFFIX = "openrlhf.sh"
_NO = "OpenRLHF's IS correction is a token ratio clamped (tis), banded (icepop) or gated by the geometric ratio"


def settings(comp: Composition) -> Settings:
    w, crit, notes = comp.weight, comp.criteria, []
    if comp.penalty is not None:
        raise CannotExpress("OpenRLHF's KL term is to a reference model, not the sampler")
    if w.level == "none" and not crit:
        return Settings({"--algo.advantage.is_correction_enable": False})
    if w.level != "token" or w.self_normalize or len(crit) > 1:
        raise CannotExpress(_NO)
    if crit:
        c = crit[0]
        if not is_plain(w, "token") or (c.statistic, c.agg, c.advantage) != ("ratio", "mean", None):
            raise CannotExpress(f"{_NO} (seq-mask-tis is its only rejection)")
        kind, lo, hi = "seq-mask-tis", c.low or 0.0, math.inf if c.high is None else c.high
    elif w.band is not None and math.isinf(w.upper) and w.clip_low == 0:
        kind, (lo, hi) = "icepop", w.band
    elif w.band is None:
        kind, lo, hi = "tis", w.clip_low, w.upper
    else:
        raise CannotExpress(f"{_NO} (not both)")
    if comp.log_ratio_clamp is not None:
        notes.append(f"OpenRLHF clamps no log-ratio of the IS weight (this correction: +-{comp.log_ratio_clamp})")
    adv_tau_note(comp.adv_tau, notes)
    return Settings({"--algo.advantage.is_correction_enable": True, "--algo.advantage.is_correction_type": kind,
                     "--algo.advantage.is_correction_threshold": (lo, hi)}, notes)


def write(s: Settings) -> list[str]:
    return flags(s.keys)
