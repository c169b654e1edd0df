"""Truncated token-level importance sampling (token TIS).

    weight on token t = min(rho_t, C)

Trades: bounded variance O(T^2 C^2), but it corrects tokens, not the state distribution: bias
O(T^2 Delta_max). On Huang's bit chain its expectation replaces P_pi by P_mu (0.567 of the truth).
Reduces to: token IS as C -> inf.
Source: Yao et al., "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training" (2025).
"""

from dataclasses import dataclass

from ..types import Config, knob
from .compose import Composition, Weight


@dataclass(frozen=True)
class TokenTISConfig(Config):
    token_clip: float = knob(2.0, "C: each token's ratio rho_t is truncated at C.", gt=0.0,
                             ui=(1.0, 10.0), log=True)


def compose(cfg: TokenTISConfig) -> Composition:
    return Composition(Weight("token", clip=cfg.token_clip), adv_tau=cfg.adv_tau)  # min(rho_t, C)
