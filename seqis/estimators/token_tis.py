"""Truncated token-level importance sampling (token TIS).

    weight on token t = min(rho_t, C)

Trades: bounded variance O(T^2 C^2), but it corrects tokens, not the state distribution: bias
O(T^2 Delta_max). On Huang's bit chain its expectation replaces P_pi by P_mu (0.567 of the truth).
Reduces to: token IS as C -> inf.
Source: Yao et al., "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training" (2025).
"""

from dataclasses import dataclass
from functools import partial

from ..types import Config, knob
from ._common import Correction, Ratios, above_on, capped_exp, log_of, rows_above


@dataclass(frozen=True)
class TokenTISConfig(Config):
    token_clip: float = knob(2.0, "C: each token's ratio rho_t is truncated at C.", gt=0.0,
                             ui=(1.0, 10.0), log=True)


def token_tis(r: Ratios, cfg: TokenTISConfig) -> Correction:
    c = log_of(cfg.token_clip)
    return Correction(
        weights=capped_exp(r.log_ratio, cfg.token_clip),  # (B, T)
        clipped=rows_above(r.log_ratio, r.mask, c),  # (B,)
        masks={"clipped": partial(above_on, r.mask, r.log_ratio, c)},  # built if read
    )
