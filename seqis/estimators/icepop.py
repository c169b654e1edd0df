"""IcePop: token IS with tokens outside a ratio band masked out.

    weight on token t = rho_t * 1[lo <= rho_t <= hi]

Trades: tokens whose ratio leaves the band lose their gradient entirely (no clipped gradient that
points the wrong way); inside, the ratio is applied untruncated, so the bias is token IS's.
Reduces to: token IS as the band opens to [0, inf].
Source: IcePop (Ring-1T, inclusionAI), default band [0.5, 5].
"""

from dataclasses import dataclass

from ..types import Config
from ._common import TOKEN, band_high, band_low
from .compose import Composition, Weight


@dataclass(frozen=True)
class IcePopConfig(Config):
    token_mask_low: float = band_low(0.5, TOKEN)
    token_mask_high: float = band_high(5.0, TOKEN)


def compose(cfg: IcePopConfig) -> Composition:
    band = (cfg.token_mask_low, cfg.token_mask_high)
    return Composition(Weight("token", band=band), adv_tau=cfg.adv_tau)  # rho_t * 1[lo <= rho_t <= hi]
