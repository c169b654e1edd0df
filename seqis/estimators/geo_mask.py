"""Geometric trust region: a pure 0/1 filter on exp(S/T), optional token clip.

    weight on token t of rollout j = 1[lo <= exp(S_j / T_j) <= hi] * (1, or min(rho_t, token_clip))

A pure filter: the geometric ratio is a per-token KL threshold that sharpens with length (a long
rollout passes iff its mean log-ratio lies in (log lo, log hi)). With token_clip set, kept tokens also
carry their own truncated ratio.
Trades: no weight variance at all (weights are 0/1); the bias is the distribution shift it does not
correct inside the band. A single catastrophic token with l = -L passes lo iff L / T < -log lo:
long rollouts dilute catastrophes.
Reduces to: pg as the band widens to [0, inf] (token_clip None).
Source: prime-rl's geometric sequence mask; Li & Liu, "RL collapse" part 3.
"""

from dataclasses import dataclass

import torch

from ..core.compose import Composition, Criterion, Weight
from ..core.types import Config, knob
from ._shared import CAP, GEO, band_high, band_low, log_edge, log_ratios

LATEX = (r"\mathbb{1}\big[\mathrm{lo} \le e^{S_j/T_j} \le \mathrm{hi}\big]"
         r"\cdot \big(1\ \text{or}\ \min(\rho_t, C)\big)")


@dataclass(frozen=True)
class GeoMaskConfig(Config):
    geo_mask_low: float = band_low(0.5, GEO)
    geo_mask_high: float = band_high(2.0, GEO)
    token_clip: float | None = knob(None, "None: pure filter. A number C: kept tokens weigh min(rho_t, C).",
                                    gt=0.0, ui=(1.0, 10.0), log=True, optional=True, inf=True)


CONFIG = GeoMaskConfig


def compose(cfg: GeoMaskConfig) -> Composition:
    geometric_gate = Criterion("ratio", "mean", cfg.geo_mask_low, cfg.geo_mask_high)  # exp(S_j / T_j) in band
    weight = Weight() if cfg.token_clip is None else Weight("token", clip=cfg.token_clip)  # 1 or min(rho_t, C)
    return Composition(weight, (geometric_gate,), adv_tau=cfg.adv_tau)


def reference(batch, cfg: GeoMaskConfig) -> tuple[torch.Tensor, torch.Tensor]:
    m, l = log_ratios(batch)  # (B, T)
    T = m.sum(-1)  # (B,)
    g = l.sum(-1) / T.clamp(min=1)  # (B,) log of the geometric ratio
    gate = (T > 0) & (g >= log_edge(cfg.geo_mask_low)) & (g <= log_edge(cfg.geo_mask_high))  # (B,)
    kept = m & gate[:, None]  # (B, T)
    if cfg.token_clip is None:
        return kept.double(), kept
    rho = torch.exp(l.clamp(max=min(log_edge(cfg.token_clip), CAP)))  # (B, T) min(rho_t, C)
    return torch.where(kept, rho, 0.0), kept
