"""A composition as ms-swift GRPO arguments (swift rlhf --rlhf_type grpo ...).

rollout_importance_sampling_mode: token_truncate min(rho_t, C), token_mask rho_t * 1[rho_t <= C], sequence_truncate
min(g, C) with g the geometric mean exp(mean_t l_t), sequence_mask rho_t on rollouts with g <= C; every token's l
clamped to +-20 first. off_policy_sequence_mask_delta: drop rollouts with A < 0 and mean(-l) above it (raw l).
"""

from __future__ import annotations

import math

from ..core.compose import SAFETY_BOUND, Composition, Criterion
from ._format import CannotExpress, Settings, adv_tau_note, clamp_note, flags
from ._own import own_settings
from ._parts import each_token_clamped, open_low

HEADER = ["ms-swift GRPO arguments (swift rlhf --rlhf_type grpo)"]
SUFFIX = "ms-swift.sh"
CLAMP = SAFETY_BOUND
PARTS = frozenset({"weight_clamp_order"})  # the later parts it writes (_parts.later_parts)
EDGE_SPACE = "ratio"  # grpo_trainer.py:2374, :2386: is_ratio <= threshold, seq_ratios <= threshold
_NO = ("ms-swift's rollout IS is a token ratio or the geometric mean, truncated at or masked above one threshold "
       "C (sequence_mask gates the token ratio by the geometric mean)")


def _is_opsm(c: Criterion) -> bool:
    return (c.statistic, c.agg, c.advantage) == ("k1", "mean", "negative") and open_low(c.low) and c.high is not None


def _mode(comp: Composition, rest: tuple[Criterion, ...]) -> tuple[str | None, float | None]:
    """(rollout_importance_sampling_mode, threshold) of the weight and the criteria other than OPSM."""
    w = comp.weight
    if w.self_normalize:
        raise CannotExpress("ms-swift does not normalise the IS weight by its batch mean")
    if w.level == "none" and not rest:
        return None, None
    if not rest and w.level in ("token", "geometric") and w.band is None and w.clip_low == 0.0:
        return ("token_truncate" if w.level == "token" else "sequence_truncate"), w.upper
    if not rest and w.level == "token" and w.band is not None and w.band[0] == 0.0 and not w.truncated:
        return "token_mask", w.band[1]
    if len(rest) == 1 and w.plain("token"):
        c = rest[0]
        if (c.statistic, c.agg, c.advantage) == ("ratio", "mean", None) and open_low(c.low) and c.high is not None:
            return "sequence_mask", c.high
    raise CannotExpress(_NO)


def settings(comp: Composition) -> Settings:
    notes: list[str] = []
    if comp.penalty is not None:
        raise CannotExpress("ms-swift's KL term (beta) is to a reference model, not the sampler")
    opsm = [c for c in comp.criteria if _is_opsm(c)]
    if len(opsm) > 1:
        raise CannotExpress("ms-swift has one off-policy sequence mask")
    mode, threshold = _mode(comp, tuple(c for c in comp.criteria if not _is_opsm(c)))
    keys: dict = {"--rlhf_type": "grpo", "--rollout_importance_sampling_mode": mode,
                  "--rollout_importance_sampling_threshold": threshold,
                  "--off_policy_sequence_mask_delta": opsm[0].high if opsm else None}
    if mode is not None:
        clamp_note("ms-swift", CLAMP, comp.log_ratio_clamp, notes)
    if mode == "sequence_truncate" and comp.log_ratio_clamp is not None and not each_token_clamped(comp):
        notes.append("ms-swift clamps each l_t before the geometric mean (this correction clamps the mean of the "
                     "raw l: they differ where a token has |l| > the clamp)")
    if mode is None and opsm and comp.log_ratio_clamp is not None:
        notes.append(f"ms-swift's OPSM reads the raw log-ratio (this correction clamps it at +-{comp.log_ratio_clamp})")
    if threshold is not None and math.isinf(threshold):
        notes.append("an open threshold: pass inf (ms-swift's default is 2.0)")
    adv_tau_note(comp.adv_tau, notes)
    return Settings(keys, notes)


def write(s: Settings) -> list[str]:
    return flags({"swift rlhf": True, **s.keys})


def own_key(name: str, cfg=None) -> str:
    """An MsSwiftConfig knob is the swift rlhf argument of the same name (None: left out, ms-swift's default off)."""
    return f"--{name}"


def own(cfg) -> Settings:
    s = own_settings(cfg, own_key)
    return Settings({"--rlhf_type": "grpo", **s.keys}, s.notes, comments=s.comments)
