"""IcePop: rho_t where it lies in a band, else 0.

    weight on token t = rho_t * 1[lo <= rho_t <= hi]

Trades: tokens whose ratio leaves the band lose their gradient entirely (no clipped gradient that
points the wrong way); inside, the ratio is applied untruncated, so the bias is token IS's.
Reduces to: token IS as the band opens to [0, inf].
Source: IcePop (Ring-1T, inclusionAI), default band [0.5, 5].
"""

from dataclasses import dataclass

import torch

from ..core.compose import Composition, Weight
from ..core.types import Config
from ._shared import CAP, TOKEN, band_high, band_low, log_edge, log_ratios

LATEX = r"\rho_t\cdot\mathbb{1}\big[\mathrm{lo} \le \rho_t \le \mathrm{hi}\big]"


@dataclass(frozen=True)
class IcePopConfig(Config):
    token_mask_low: float = band_low(0.5, TOKEN)
    token_mask_high: float = band_high(5.0, TOKEN)


CONFIG = IcePopConfig


def compose(cfg: IcePopConfig) -> Composition:
    band = (cfg.token_mask_low, cfg.token_mask_high)
    return Composition(Weight("token", band=band), adv_tau=cfg.adv_tau)  # rho_t * 1[lo <= rho_t <= hi]


def reference(batch, cfg: IcePopConfig) -> tuple[torch.Tensor, torch.Tensor]:
    m, l = log_ratios(batch)  # (B, T)
    kept = m & (l >= log_edge(cfg.token_mask_low)) & (l <= log_edge(cfg.token_mask_high))  # (B, T) rho_t in band
    return torch.where(kept, torch.exp(l.clamp(max=CAP)), 0.0), kept  # rho_t on the kept tokens
