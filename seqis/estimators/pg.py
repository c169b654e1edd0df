"""No correction: plain REINFORCE on the sampler's tokens.

    weight on every loss token = 1

Trades: zero variance from weights, full bias from the mismatch: it optimises as if mu were pi.
On Huang's bit chain (H = 64, k = 40, p = 0.6, q = 0.55) its expectation is 0.289 of the true gradient.
Reduces to: what every band-filter estimator becomes when its bands open to [0, inf].
Source: the baseline every IS correction is measured against.
"""

from dataclasses import dataclass

import torch

from ..core.compose import Composition
from ..core.types import Config
from ._shared import log_ratios

LATEX = r"1"


@dataclass(frozen=True)
class PGConfig(Config):
    pass


CONFIG = PGConfig


def compose(cfg: PGConfig) -> Composition:
    return Composition(adv_tau=cfg.adv_tau)  # weight 1 on every loss token


def reference(batch, cfg: PGConfig) -> tuple[torch.Tensor, torch.Tensor]:
    m, _ = log_ratios(batch)  # (B, T)
    return m.double(), m.clone()  # 1 on every loss token
