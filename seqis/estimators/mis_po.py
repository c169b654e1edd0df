"""Token band times trajectory band (Step 3.5 Flash).

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

import torch

from ..core.compose import Composition, Criterion, Weight
from ..core.types import Config
from ._shared import GEO, TOKEN, band_high, band_low, log_edge, log_ratios

LATEX = (r"\mathbb{1}\big[t_{lo} \le \rho_t \le t_{hi}\big]\cdot\mathbb{1}\big[g_{lo} \le e^{S_j/T_j}"
         r" \le g_{hi}\big]")


@dataclass(frozen=True)
class MISPOConfig(Config):
    token_mask_low: float = band_low(0.5, TOKEN)
    token_mask_high: float = band_high(2.0, TOKEN)
    geo_mask_low: float = band_low(0.996, GEO, ui=(0.9, 1.0))
    geo_mask_high: float = band_high(1.001, GEO, ui=(1.0, 1.1))


CONFIG = MISPOConfig


def compose(cfg: MISPOConfig) -> Composition:
    token_band = Criterion("ratio", "token", cfg.token_mask_low, cfg.token_mask_high)  # rho_t in band
    trajectory_band = Criterion("ratio", "mean", cfg.geo_mask_low, cfg.geo_mask_high)  # exp(S_j / T_j), all tokens
    return Composition(Weight(), (token_band, trajectory_band), adv_tau=cfg.adv_tau)  # a pure 0/1 filter


def reference(batch, cfg: MISPOConfig) -> tuple[torch.Tensor, torch.Tensor]:
    m, l = log_ratios(batch)  # (B, T)
    T = m.sum(-1)  # (B,)
    g = l.sum(-1) / T.clamp(min=1)  # (B,) over all loss tokens, also those the token band drops
    token_ok = (l >= log_edge(cfg.token_mask_low)) & (l <= log_edge(cfg.token_mask_high))  # (B, T)
    traj_ok = (T > 0) & (g >= log_edge(cfg.geo_mask_low)) & (g <= log_edge(cfg.geo_mask_high))  # (B,)
    kept = m & token_ok & traj_ok[:, None]  # (B, T)
    return kept.double(), kept
