"""A composition as NeMo-RL's `loss_fn` keys (ClippedPGLossFn's truncated importance sampling).

tis: clamp(rho_t, ratio_min or 0, ratio); icepop: rho_t inside [ratio_min, ratio], else 0; seq-mask-tis: raw rho_t
on rollouts whose geometric ratio exp(S/T) lies in [ratio_min, ratio].
"""

from __future__ import annotations

import math

from ..estimators.compose import Composition
from ._format import CannotExpress, Settings, adv_tau_note, yaml
from ._parts import is_plain

HEADER = ["NeMo-RL GRPO loss_fn (ClippedPGLossFn)"]
SUFFIX = "nemo-rl.yaml"
_NO = "NeMo-RL's truncated IS is a token weight clamped (tis), banded (icepop) or gated by the geometric ratio"


def settings(comp: Composition) -> Settings:
    w, crit, notes = comp.weight, comp.criteria, []
    if comp.penalty is not None:
        raise CannotExpress("NeMo-RL's KL penalty is to a reference policy, not the sampler")
    kind, lo, hi = None, None, None
    if w.level == "none" and not crit:
        keys = dict(use_importance_sampling_correction=False)
    elif w.level != "token" or w.self_normalize:
        raise CannotExpress(f"{_NO} (this weight: {w.level}{', normalised' if w.self_normalize else ''})")
    elif crit:
        c = crit[0]
        if len(crit) > 1 or not is_plain(w, "token") or (c.statistic, c.agg, c.advantage) != ("ratio", "mean", None):
            raise CannotExpress(f"{_NO} (seq-mask-tis is its only rejection)")
        kind, lo, hi = "seq-mask-tis", c.low or 0.0, math.inf if c.high is None else c.high
    elif w.band is not None:
        if not math.isinf(w.upper) or w.clip_low > 0:
            raise CannotExpress(f"{_NO} (not both)")
        kind, (lo, hi) = "icepop", w.band
    elif not math.isinf(w.upper) or w.clip_low > 0:
        kind, lo, hi = "tis", w.clip_low or None, w.upper
    if w.level == "token":
        keys = dict(use_importance_sampling_correction=True, truncated_importance_sampling_type=kind,
                    truncated_importance_sampling_ratio=hi, truncated_importance_sampling_ratio_min=lo)
    if comp.log_ratio_clamp is not None:
        notes.append(f"NeMo-RL clamps no log-ratio (this correction: +-{comp.log_ratio_clamp})")
    adv_tau_note(comp.adv_tau, notes)
    return Settings({f"loss_fn.{k}": v for k, v in keys.items()}, notes)


def write(s: Settings) -> list[str]:
    return yaml(s.keys)
