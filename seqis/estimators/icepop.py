"""IcePop: token IS with tokens outside a ratio band masked out.

    weight on token t = rho_t * 1[lo <= rho_t <= hi]

Trades: tokens whose ratio leaves the band lose their gradient entirely (no clipped gradient that
points the wrong way); inside, the ratio is applied untruncated, so the bias is token IS's.
Reduces to: token IS as the band opens to [0, inf].
Source: IcePop (Ring-1T, inclusionAI), default band [0.5, 5].
"""

from dataclasses import dataclass
from functools import partial

from ..types import Config
from ._common import TOKEN, Correction, Ratios, band_f, band_high, band_low, capped_exp, outside_band


@dataclass(frozen=True)
class IcePopConfig(Config):
    token_mask_low: float = band_low(0.5, TOKEN)
    token_mask_high: float = band_high(5.0, TOKEN)


def icepop(r: Ratios, cfg: IcePopConfig) -> Correction:
    ok = band_f(r.log_ratio, cfg.token_mask_low, cfg.token_mask_high).mul_(r.mask_f)  # (B, T) 0/1
    token_masked = partial(outside_band, r.mask, r.log_ratio, cfg.token_mask_low, cfg.token_mask_high)
    return Correction(weights=capped_exp(r.log_ratio), kept=ok, masks={"token_masked": token_masked})
