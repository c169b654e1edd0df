"""Trust-region masking with the max criterion (verl's veto / seq_max rejection).

    weight on rollout j = 1[every loss token of j has lo <= rho_t <= hi]

Trades: a pure filter that a single catastrophic token trips, whatever the rollout's length (a
geometric gate dilutes it); the acceptance of a long rollout falls like the product of per-token
acceptances, so a band too tight rejects nearly everything at long T.
Reduces to: pg as the band opens to [0, inf].
Source: verl's rollout-correction helper (veto threshold, seq_max rejection).
"""

from dataclasses import dataclass

from ..types import Config
from ._common import TOKEN, band_high, band_low
from .compose import Composition, Criterion, Weight


@dataclass(frozen=True)
class MaxMaskConfig(Config):
    token_mask_low: float = band_low(0.5, TOKEN + " (one token outside drops its rollout)")
    token_mask_high: float = band_high(2.0, TOKEN + " (one token outside drops its rollout)")


def compose(cfg: MaxMaskConfig) -> Composition:
    every_token_below = Criterion("ratio", "max", high=cfg.token_mask_high)  # max_t rho_t <= hi
    every_token_above = Criterion("ratio", "min", low=cfg.token_mask_low)  # min_t rho_t >= lo
    return Composition(Weight(), (every_token_below, every_token_above), adv_tau=cfg.adv_tau)
