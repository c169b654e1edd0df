"""A composition as OpenRLHF flags (--algo.advantage.is_correction_*): tis clamps rho_t to [low, high], icepop
zeroes it outside, seq-mask-tis keeps raw rho_t on rollouts whose geometric ratio lies in [low, high]."""

from __future__ import annotations

from ..compose import Composition
from ._format import CannotExpress, Settings, adv_tau_note, flags
from ._parts import token_is_mode

HEADER = ["OpenRLHF train_ppo_ray flags"]
SUFFIX = "openrlhf.sh"
_NO = "OpenRLHF's IS correction is a token ratio clamped (tis), banded (icepop) or gated by the geometric ratio"


def settings(comp: Composition) -> Settings:
    w, crit, notes = comp.weight, comp.criteria, []
    if comp.penalty is not None:
        raise CannotExpress("OpenRLHF's KL term is to a reference model, not the sampler")
    if w.level == "none" and not crit:
        return Settings({"--algo.advantage.is_correction_enable": False})
    kind, lo, hi = token_is_mode(comp, _NO)
    kind = kind or "tis"  # a plain token ratio: tis with open bounds
    if comp.log_ratio_clamp is not None:
        notes.append(f"OpenRLHF clamps no log-ratio of the IS weight (this correction: +-{comp.log_ratio_clamp})")
    adv_tau_note(comp.adv_tau, notes)
    return Settings({"--algo.advantage.is_correction_enable": True, "--algo.advantage.is_correction_type": kind,
                     "--algo.advantage.is_correction_threshold": (lo, hi)}, notes)


def write(s: Settings) -> list[str]:
    return flags(s.keys)
