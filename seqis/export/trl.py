"""A composition as TRL `GRPOConfig` arguments (vLLM importance-sampling correction and OPSM).

vllm_importance_sampling_mode: token_ / sequence_ x truncate (clamp to [clip_min, clip_max]) / mask (zero
outside); off_policy_mask_threshold: drop rollouts with A < 0 and mean(-l) above it. TRL clamps no log-ratio.
"""

from __future__ import annotations

import math

from ..core.compose import SAFETY_BOUND, Composition
from ._format import CannotExpress, Settings, adv_tau_note, python_kwargs
from ._own import own_settings

HEADER = ["TRL GRPOConfig arguments (use_vllm=True)"]
SUFFIX = "trl.py"
PARTS = frozenset({"gamma", "token_clip"})  # the later parts it writes (_parts.later_parts)
EDGE_SPACE = "ratio"  # grpo_trainer.py:2698: (ratio < min_val) | (ratio > max_val), the ratio itself


def settings(comp: Composition) -> Settings:
    w, notes = comp.weight, []
    if comp.penalty is not None:
        raise CannotExpress("TRL's KL term (beta) is to a reference model, not the sampler")
    if w.level not in ("none", "token", "sequence"):
        raise CannotExpress(f"TRL's vLLM IS ratio is token or sequence level, not {w.level}")
    if w.self_normalize:
        raise CannotExpress("TRL does not normalise the IS ratio by its batch mean")
    keys: dict = dict(vllm_importance_sampling_correction=w.level != "none")
    vespo = w.gamma is not None
    if vespo:  # VESPO: phi of prod_t min(rho_t, C), TRL's log-ratios clamped at 20
        if comp.log_ratio_clamp != SAFETY_BOUND:
            notes.append(f"TRL's VESPO clamps its log-ratios at 20 (this correction: {comp.log_ratio_clamp})")
        C = math.inf if w.token_clip is None else w.token_clip
        keys.update(loss_type="vespo", vllm_importance_sampling_mode="token_truncate",
                    vllm_importance_sampling_clip_max=None if math.isinf(C) else C,
                    **dict(zip(("vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg"), w.gamma)))
    elif w.token_clip is not None:
        raise CannotExpress("TRL truncates token ratios inside a sequence weight only in VESPO")
    elif w.level != "none":
        if w.band is not None and (not math.isinf(w.upper) or w.clip_low > 0):
            raise CannotExpress("TRL's IS ratio is truncated or masked, not both")
        lo, hi = w.band if w.band is not None else (w.clip_low, w.upper)
        keys.update(vllm_importance_sampling_mode=f"{w.level}_{'mask' if w.band is not None else 'truncate'}",
                    vllm_importance_sampling_clip_max=None if math.isinf(hi) else hi,
                    vllm_importance_sampling_clip_min=lo or None)
    for c in comp.criteria:
        if (c.statistic, c.agg, c.advantage, c.low) != ("k1", "mean", "negative", None) or c.high is None:
            raise CannotExpress("TRL's only rejection is OPSM (A < 0 and mean(-l) above a threshold)")
        keys["off_policy_mask_threshold"] = c.high
    if comp.log_ratio_clamp is not None and not vespo:
        notes.append(f"TRL clamps no log-ratio (this correction: +-{comp.log_ratio_clamp})")
    adv_tau_note(comp.adv_tau, notes)
    return Settings(keys, notes)


def write(s: Settings) -> list[str]:
    return python_kwargs("GRPOConfig", s.keys)


def own_key(name: str, cfg=None) -> str:
    """A TRLConfig knob is the GRPOConfig argument of the same name."""
    return name


def own(cfg) -> Settings:
    """TRL's own preset: every GRPOConfig argument the preset sets (the VESPO knobs too: inert under dapo)."""
    return own_settings(cfg, own_key)
