"""A composition as NeMo-RL's `loss_fn` keys (ClippedPGLossFn's truncated importance sampling).

tis: clamp(rho_t, ratio_min or 0, ratio); icepop: rho_t inside [ratio_min, ratio], else 0; seq-mask-tis: raw rho_t
on rollouts whose geometric ratio exp(S/T) lies in [ratio_min, ratio]. A sequence weight exp(S_j), plain, clamped
or banded, is sequence_level_importance_ratios: true (with token_level_loss: false, which NeMo-RL requires).
"""

from __future__ import annotations

import math
from dataclasses import replace

from ..core.compose import Composition
from ._format import CannotExpress, Settings, adv_tau_note, yaml
from ._own import own_settings, prefixed
from ._parts import token_is_mode

HEADER = ["NeMo-RL GRPO loss_fn (ClippedPGLossFn)"]
SUFFIX = "nemo-rl.yaml"
PARTS = frozenset({"exp_abs_log_ratio", "leaves_normaliser"})  # the later parts it writes (_parts.later_parts)
_NO = "NeMo-RL's truncated IS is a token weight clamped (tis), banded (icepop) or gated by the geometric ratio"


def _seq_logprob_error(comp: Composition) -> tuple[Composition, float | None]:
    """grpo.seq_logprob_error_threshold: the rule dropping rollouts whose mean e^|l| exceeds it (out of N too)."""
    rule = [c for c in comp.criteria if (c.statistic, c.agg, c.low, c.advantage, c.strict, c.leaves_normaliser)
            == ("exp_abs_log_ratio", "mean", None, None, False, True) and c.high is not None]
    if not rule:
        return comp, None
    return replace(comp, criteria=tuple(c for c in comp.criteria if c is not rule[0])), rule[0].high


def settings(comp: Composition) -> Settings:
    comp, seq_error = _seq_logprob_error(comp)
    extra = {} if seq_error is None else {"grpo.seq_logprob_error_threshold": seq_error}
    s = _settings(comp)
    return Settings({**extra, **s.keys}, s.notes)


def _settings(comp: Composition) -> Settings:
    w, crit, notes = comp.weight, comp.criteria, []
    if comp.penalty is not None:
        raise CannotExpress("NeMo-RL's KL penalty is to a reference policy, not the sampler")
    if w.level == "none" and not crit:
        keys = dict(use_importance_sampling_correction=False)
    elif w.level == "sequence" and not crit and not w.self_normalize:
        banded = w.band is not None  # NeMo-RL's icepop on exp(S); a truncation is its tis
        if banded and (w.truncated or w.band[0] == 0.0):
            raise CannotExpress(f"{_NO} (a sequence band with a clip, or open below)")
        if w.truncated and math.isinf(w.upper):
            raise CannotExpress(f"{_NO} (tis needs a finite upper bound)")
        kind = "icepop" if banded else "tis" if w.truncated else None
        lo, hi = w.band if banded else (w.clip_low or None, w.upper) if w.truncated else (None, None)
        keys = dict(use_importance_sampling_correction=True, sequence_level_importance_ratios=True,
                    token_level_loss=False, truncated_importance_sampling_type=kind,
                    truncated_importance_sampling_ratio=hi, truncated_importance_sampling_ratio_min=lo)
    else:
        kind, lo, hi = token_is_mode(comp, _NO)
        if kind is None:  # a plain token ratio: importance sampling on, nothing truncated
            lo, hi = None, None
        elif kind == "tis":
            lo = lo or None  # NeMo-RL's ratio_min unset: no lower clamp
        keys = dict(use_importance_sampling_correction=True, truncated_importance_sampling_type=kind,
                    truncated_importance_sampling_ratio=hi, truncated_importance_sampling_ratio_min=lo)
    if comp.log_ratio_clamp is not None:
        notes.append(f"NeMo-RL clamps no log-ratio (this correction: +-{comp.log_ratio_clamp})")
    adv_tau_note(comp.adv_tau, notes)
    return Settings({f"loss_fn.{k}": v for k, v in keys.items()}, notes)


def write(s: Settings) -> list[str]:
    return yaml(s.keys)


own_key = prefixed("loss_fn.", {"seq_logprob_error_threshold": "grpo.seq_logprob_error_threshold"})
# loss_fn.score_centering: NeMo-RL's nightly (nemo_rl/algorithms/loss/score_centering.py, compute_score_centering_term,
# as its API page and docs/guides/score-centering.md name it; the code itself and its head-size key are not in the
# search index: seqis/presets/nemo_rl.py SC_SOURCE). Written only when on: NeMo-RL's releases have no such key.
SC_COMMENTS = ["loss_fn.score_centering is NeMo-RL's nightly key (docs/guides/score-centering.md; in no release yet);",
               "not written: the head size (the sampler's top-k it reads): its key is in NeMo-RL's nightly code",
               "(nemo_rl/algorithms/loss/score_centering.py), which seqis has not read; set it as that guide says"]


def own(cfg) -> Settings:
    """NeMo-RL's own preset: every loss_fn key the preset sets, grpo.seq_logprob_error_threshold, and
    token_level_loss: false where the ratio is a rollout's (NeMo-RL requires it with sequence-level ratios)."""
    sc = cfg.score_centering
    skip = {} if sc else {"score_centering": "off, NeMo-RL's default; its releases have no such key (nightly only)"}
    extra = {"loss_fn.token_level_loss": False} if cfg.sequence_level_importance_ratios else {}
    return own_settings(cfg, own_key, skip=skip, extra=extra, comments=tuple(SC_COMMENTS) if sc else ())
