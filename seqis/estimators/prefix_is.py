"""Cumulative prefix importance ratio (MinPRO-style).

    weight on token t = min(exp(sum of l_s over loss tokens s <= t), C)

Trades: token t's gradient is corrected by the ratio of the prefix that led to it, the exact
correction for a per-token reward-to-go; variance grows along the rollout like sequence IS's does with
length, and the clip trades it for bias.
Reduces to: seq_is on the last token; token IS on the first.
Source: the cumulative prefix ratio of MinPRO.
"""

import math
from dataclasses import dataclass

from ..types import Config, knob
from .compose import Composition, Weight


@dataclass(frozen=True)
class PrefixISConfig(Config):
    prefix_clip: float = knob(math.inf, "C: the prefix ratio is truncated at C (inf: no clip).", gt=0.0,
                              ui=(1.0, 100.0), log=True)


def compose(cfg: PrefixISConfig) -> Composition:
    return Composition(Weight("prefix", clip=cfg.prefix_clip), adv_tau=cfg.adv_tau)  # min(exp(sum_{s<=t} l_s), C)
