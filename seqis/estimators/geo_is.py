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
from .compose import Composition, Weight


@dataclass(frozen=True)
class GeoISConfig(Config):
    geo_clip: float = knob(math.inf, "C: the geometric weight exp(S/T) is truncated at C (inf: no clip).",
                           gt=0.0, ui=(1.0, 10.0), log=True)


def compose(cfg: GeoISConfig) -> Composition:
    return Composition(Weight("geometric", clip=cfg.geo_clip), adv_tau=cfg.adv_tau)  # min(exp(S_j / T_j), C)
