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
from functools import partial

from ..types import Config, knob
from ._common import Correction, Ratios, above_on, capped_exp, log_of, rows_above


@dataclass(frozen=True)
class PrefixISConfig(Config):
    prefix_clip: float = knob(math.inf, "C: the prefix ratio is truncated at C (inf: no clip).", gt=0.0,
                              ui=(1.0, 100.0), log=True)


def prefix_is(r: Ratios, cfg: PrefixISConfig) -> Correction:
    prefix = r.log_ratio.cumsum(-1)  # (B, T) padding holds 0, so it adds nothing
    c = log_of(cfg.prefix_clip)
    return Correction(
        weights=capped_exp(prefix, cfg.prefix_clip),  # (B, T)
        clipped=rows_above(prefix, r.mask, c),  # (B,) off the mask the prefix repeats an earlier value, or 0
        masks={"clipped": partial(above_on, r.mask, prefix, c)},  # built if read
    )
