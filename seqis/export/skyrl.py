"""A composition as SkyRL's `trainer.algorithm.off_policy_correction`.

TIS weight (token or sequence, truncated from above); rejections: any token below / above the outlier thresholds,
tokens outside [token_mask_is_threshold_low, _high], rollouts whose geometric or product ratio leaves its band.
"""

from __future__ import annotations

import math

from ..compose import Composition
from ._format import CannotExpress, Settings, adv_tau_note, yaml

HEADER = ["SkyRL off-policy correction"]
SUFFIX = "skyrl.yaml"
BLOCK = "trainer.algorithm.off_policy_correction"
_SEQ_MASK = {"mean": ("geometric", "geo_mask"), "sum": ("product", "product_mask")}  # agg -> metric, key prefix


def settings(comp: Composition) -> Settings:
    w, notes = comp.weight, []
    if comp.penalty is not None:
        raise CannotExpress("SkyRL's KL loss is to a reference model, not the sampler")
    if w.band is not None or w.clip_low > 0 or w.self_normalize or w.level not in ("none", "token", "sequence"):
        raise CannotExpress("SkyRL's TIS weight is token or sequence level, truncated from above only")
    keys: dict = dict(tis_ratio_type=None if w.level == "none" else w.level)
    if w.level != "none":
        keys[f"{w.level}_tis_ratio_clip_high"] = w.upper
    for c in comp.criteria:
        if c.statistic != "ratio" or c.advantage is not None:
            raise CannotExpress(f"SkyRL rejects by importance ratios only, not {c.statistic}"
                                f"{' conditioned on the advantage' if c.advantage else ''}")
        lo, hi = c.low or 0.0, math.inf if c.high is None else c.high
        if c.agg == "min" and c.high is None:
            keys["outlier_token_is_threshold_low"] = lo
        elif c.agg == "max" and c.low is None:
            keys["outlier_token_is_threshold_high"] = hi
        elif c.agg == "token":
            keys.update(token_mask_is_threshold_low=lo, token_mask_is_threshold_high=hi)
        elif c.agg in ("mean", "sum") and "sequence_mask_metric" not in keys:
            metric, prefix = _SEQ_MASK[c.agg]
            keys.update(sequence_mask_metric=metric, **{f"{prefix}_low": lo, f"{prefix}_high": hi})
        else:
            raise CannotExpress(f"SkyRL has no ratio criterion '{c.agg}' with these sides, or needs it twice")
    if comp.log_ratio_clamp != 20.0:
        notes.append(f"SkyRL clamps log-ratios at +-20 (this correction: {comp.log_ratio_clamp})")
    adv_tau_note(comp.adv_tau, notes)
    return Settings({f"{BLOCK}.{k}": v for k, v in keys.items()}, notes)


def write(s: Settings) -> list[str]:
    return yaml(s.keys)
