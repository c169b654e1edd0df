"""MIS-PO: a token band times a trajectory band (Step 3.5 Flash, section 5.2.1, eq. 2).

    weight on token t of rollout j = 1[tlo <= rho_t <= thi] * 1[glo <= exp(S_j / T_j) <= ghi]

The trajectory ratio uses all of the rollout's loss tokens, including those the token band drops.
Trades: a pure filter (0/1 weights, no variance from weights). The default trajectory band
[0.996, 1.001] is [-0.0040, +0.0010] in log space: long rollouts pass iff the per-token KL is below
~0.004 nats, short ones are rejected more often; the token band catches catastrophic tokens that a
geometric mean dilutes.
Reduces to: pg as both bands widen to [0, inf].
Source: StepFun, "Step 3.5 Flash" (arXiv 2602.10604).
"""

from dataclasses import dataclass

from ..types import Config
from ._common import GEO, TOKEN, band_high, band_low
from .compose import Composition, Criterion, Weight


@dataclass(frozen=True)
class MISPOConfig(Config):
    token_mask_low: float = band_low(0.5, TOKEN)
    token_mask_high: float = band_high(2.0, TOKEN)
    geo_mask_low: float = band_low(0.996, GEO, ui=(0.9, 1.0))
    geo_mask_high: float = band_high(1.001, GEO, ui=(1.0, 1.1))


def compose(cfg: MISPOConfig) -> Composition:
    token_band = Criterion("ratio", "token", cfg.token_mask_low, cfg.token_mask_high)  # rho_t in band
    trajectory_band = Criterion("ratio", "mean", cfg.geo_mask_low, cfg.geo_mask_high)  # exp(S_j / T_j), all tokens
    return Composition(Weight(), (token_band, trajectory_band), adv_tau=cfg.adv_tau)  # a pure 0/1 filter
