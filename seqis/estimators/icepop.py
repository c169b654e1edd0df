"""IcePop: token IS with tokens outside a ratio band masked out.

    weight on token t = rho_t * 1[lo <= rho_t <= hi]

Trades: tokens whose ratio leaves the band lose their gradient entirely (no clipped gradient that
points the wrong way); inside, the ratio is applied untruncated, so the bias is token IS's.
Reduces to: token IS as the band opens to [0, inf].
Source: IcePop (Ring-1T, inclusionAI), default band [0.5, 5].
"""

from dataclasses import dataclass

from ..types import Config, knob
from ._common import Correction, Ratios, capped_exp, in_band


@dataclass(frozen=True)
class IcePopConfig(Config):
    token_mask_low: float = knob(0.5, "Tokens with rho_t below this are dropped.", ge=0.0, ui=(0.01, 1.0),
                                 log=True)
    token_mask_high: float = knob(5.0, "Tokens with rho_t above this are dropped.", gt=0.0, ui=(1.0, 100.0),
                                  log=True)


def icepop(r: Ratios, cfg: IcePopConfig) -> Correction:
    ok = r.mask & in_band(r.log_ratio, cfg.token_mask_low, cfg.token_mask_high)  # (B, T)
    return Correction(weights=capped_exp(r.log_ratio), kept=ok, masks={"token_masked": r.mask & ~ok})
