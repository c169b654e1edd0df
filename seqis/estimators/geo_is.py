"""Geometric-mean importance weight (GeoMean IS, GSPO-style).

    weight on every loss token of rollout j = min(exp(S_j / T_j), C)

Trades: the geometric mean tames the weight's variance (it does not grow with T), but it is not an
importance weight of anything: biased, and on Huang's long-horizon chain it does worst (success 0.332
at H = 1024 vs 0.749 for sequence IS).
Reduces to: pg on-policy; untruncated GeoMean IS with C = inf (the default).
Source: GSPO (Zheng et al.); Huang, "Is Frontier Asynchronous RL Solved?".
"""

import math
from dataclasses import dataclass

from ..types import Config, knob
from ._common import Correction, Ratios, capped_exp, clipped_metric, log_of


@dataclass(frozen=True)
class GeoISConfig(Config):
    geo_clip: float = knob(math.inf, "C: the geometric weight exp(S/T) is truncated at C (inf: no clip).",
                           gt=0.0, ui=(1.0, 10.0), log=True)


def geo_is(r: Ratios, cfg: GeoISConfig) -> Correction:
    w = capped_exp(r.geo_log_ratio, cfg.geo_clip)  # (B,)
    clipped = r.valid & (r.geo_log_ratio > log_of(cfg.geo_clip))
    return Correction(
        seq_weights=w,
        clipped=clipped,
        metrics={"is_clipped": clipped_metric(r, clipped)},
    )
