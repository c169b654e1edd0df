"""A composition as open-instruct grpo_fast flags (the rho correction: use_rho_correction, rho_clamp_*, rho_mask_*).

rho = exp(clamp(l, -10, 10)) per token (rho_mask_sequence_level: the geometric mean, for the mask and the weight);
tokens outside [rho_mask_lower_bound, rho_mask_upper_bound] dropped, the weight clamped to [rho_clamp_lower_bound,
rho_clamp_upper_bound]; 0 switches a bound off, a lower bound must lie in (0, 1), an upper one above 1.
"""

from __future__ import annotations

from ..core.compose import Composition
from ._format import CannotExpress, Settings, adv_tau_note, clamp_note, flags
from ._own import own_settings
from ._parts import each_token_clamped, open_high, open_low

HEADER = ["open-instruct grpo_fast.py flags"]
SUFFIX = "open-instruct.sh"
CLAMP = 10.0
PARTS = frozenset({"weight_clamp_order"})  # the later parts it writes (_parts.later_parts)
EDGE_SPACE = "ratio"  # grpo_utils.py:375-376: rho < lower, rho > upper, on rho itself
_AGG = {"token": "token", "geometric": "mean"}  # the weight's level -> the aggregate its mask uses


def _bounds(lo: float | None, hi: float | None, what: str) -> tuple[float, float]:
    """(lower, upper) as open-instruct's bounds (0 = off), or CannotExpress naming the side it cannot take."""
    lo = 0.0 if open_low(lo) or lo == 0.0 else lo
    hi = 0.0 if open_high(hi) else hi
    if lo and not 0.0 < lo < 1.0:
        raise CannotExpress(f"open-instruct's lower {what} must lie in (0, 1), got {lo}")
    if hi and hi <= 1.0:
        raise CannotExpress(f"open-instruct's upper {what} must be above 1, got {hi}")
    return lo, hi


def settings(comp: Composition) -> Settings:
    w, notes = comp.weight, []
    if comp.penalty is not None:
        raise CannotExpress("open-instruct's KL term (beta) is to a reference policy, not the sampler")
    if w.level == "none" and not comp.criteria:
        return Settings({"--use_rho_correction": "False"}, notes)
    if w.level not in _AGG or w.band is not None or w.self_normalize:
        raise CannotExpress("open-instruct's rho weight is the token ratio or the geometric mean, clamped (never "
                            "banded or normalised)")
    clamp_lo, clamp_hi = _bounds(w.clip_low, w.upper, "clamp bound")
    mask_lo, mask_hi = 0.0, 0.0
    if len(comp.criteria) > 1:
        raise CannotExpress("open-instruct has one rho mask")
    for c in comp.criteria:
        if (c.statistic, c.advantage) != ("ratio", None) or c.agg != _AGG[w.level]:
            raise CannotExpress(f"open-instruct masks the rho it weighs by ({_AGG[w.level]} ratio), not "
                                f"{c.statistic} by {c.agg}{' conditioned on the advantage' if c.advantage else ''}")
        mask_lo, mask_hi = _bounds(c.low, c.high, "mask bound")
    clamp_note("open-instruct", CLAMP, comp.log_ratio_clamp, notes)
    if w.level == "geometric" and comp.log_ratio_clamp is not None and not each_token_clamped(comp):
        notes.append("open-instruct clamps each l_t before the geometric mean (this correction clamps the mean of "
                     "the raw l: they differ where a token has |l| > the clamp)")
    adv_tau_note(comp.adv_tau, notes)
    return Settings({"--use_rho_correction": "True", "--rho_clamp_lower_bound": clamp_lo,
                     "--rho_clamp_upper_bound": clamp_hi, "--rho_mask_lower_bound": mask_lo,
                     "--rho_mask_upper_bound": mask_hi,
                     "--rho_mask_sequence_level": str(w.level == "geometric")}, notes)


def write(s: Settings) -> list[str]:
    return flags({"python open_instruct/grpo_fast.py": True, **s.keys})


def own_key(name: str, cfg=None) -> str:
    """An OpenInstructConfig knob is the grpo_fast.py flag of the same name."""
    return f"--{name}"


def own(cfg) -> Settings:
    """grpo_fast.py's flags, booleans spelled True / False (its argument parser takes them as words)."""
    return own_settings(cfg, own_key, value=lambda _, v: str(v) if isinstance(v, bool) else v)
