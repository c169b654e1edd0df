"""Truncated token IS: min(rho_t, C) per token.

    weight on token t = min(rho_t, C)

Trades: bounded variance O(T^2 C^2), but it corrects tokens, not the state distribution: bias
O(T^2 Delta_max). On Huang's bit chain its expectation replaces P_pi by P_mu (0.567 of the truth).
Reduces to: token IS as C -> inf.
Source: Yao et al., "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training" (2025).
"""

from dataclasses import dataclass

import torch

from ..core.compose import Composition, Weight
from ..core.types import Config, knob
from ._shared import CAP, log_edge, log_ratios

LATEX = r"\min\big(\rho_t,\ C\big)"


@dataclass(frozen=True)
class TokenTISConfig(Config):
    token_clip: float = knob(2.0, "C: each token's ratio rho_t is truncated at C.", gt=0.0,
                             ui=(1.0, 10.0), log=True, inf=True)


CONFIG = TokenTISConfig


def compose(cfg: TokenTISConfig) -> Composition:
    return Composition(Weight("token", clip=cfg.token_clip), adv_tau=cfg.adv_tau)  # min(rho_t, C)


def reference(batch, cfg: TokenTISConfig) -> tuple[torch.Tensor, torch.Tensor]:
    m, l = log_ratios(batch)  # (B, T)
    rho = torch.exp(l.clamp(max=min(log_edge(cfg.token_clip), CAP)))  # (B, T) min(rho_t, C)
    return torch.where(m, rho, 0.0), m.clone()
