"""Drop a rollout if any token's ratio leaves the band.

    weight on rollout j = 1[every loss token of j has lo <= rho_t <= hi]

Trades: a pure filter that a single catastrophic token trips, whatever the rollout's length (a
geometric gate dilutes it); the acceptance of a long rollout falls like the product of per-token
acceptances, so a band too tight rejects nearly everything at long T.
Reduces to: pg as the band opens to [0, inf].
Source: verl's rollout-correction helper (veto threshold, seq_max rejection).
"""

from dataclasses import dataclass

import torch

from ..core.compose import Composition, Criterion, Weight
from ..core.types import Config
from ._shared import TOKEN, band_high, band_low, log_edge, log_ratios

LATEX = r"\mathbb{1}\big[\forall t:\ \mathrm{lo} \le \rho_t \le \mathrm{hi}\big]"


@dataclass(frozen=True)
class MaxMaskConfig(Config):
    token_mask_low: float = band_low(0.5, TOKEN + " (one token outside drops its rollout)")
    token_mask_high: float = band_high(2.0, TOKEN + " (one token outside drops its rollout)")


CONFIG = MaxMaskConfig


def compose(cfg: MaxMaskConfig) -> Composition:
    every_token_below = Criterion("ratio", "max", high=cfg.token_mask_high)  # max_t rho_t <= hi
    every_token_above = Criterion("ratio", "min", low=cfg.token_mask_low)  # min_t rho_t >= lo
    return Composition(Weight(), (every_token_below, every_token_above), adv_tau=cfg.adv_tau)


def reference(batch, cfg: MaxMaskConfig) -> tuple[torch.Tensor, torch.Tensor]:
    m, l = log_ratios(batch)  # (B, T)
    inside = (l >= log_edge(cfg.token_mask_low)) & (l <= log_edge(cfg.token_mask_high))  # (B, T)
    kept = m & (inside | ~m).all(-1, keepdim=True)  # (B, T) rollouts whose every loss token is inside
    return kept.double(), kept
