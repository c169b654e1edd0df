"""Truncated sequence IS: min(w_j, C) on every token.

    weight on every loss token of rollout j = min(w_j, C),  w_j = exp(S_j),  computed as exp(min(S_j, log C))

Trades: clipping at C caps the variance at O(T^2 C^2) for a bias O(T (1 + chi2) / C), chi2 = E_mu[w^2] - 1 the
whole rollout's chi-square (not one token's); Li's best C* = sqrt(2 (1 + chi2)) is 1.4 as chi2 -> 0 and 2 at
chi2 = 1, and grows with length (s = 0.05, T = 256: 1.95). The kept mass E[min(w, C)] falls towards 0 as T grows, so
truncation quietly shrinks long rollouts' gradients; an upward outlier keeps weight C.
Reduces to: seq_is as C -> inf.
Source: Li & Liu, "When Speed Kills Stability" (part 2); prime-rl's sequence-level IS ablation.
"""

from dataclasses import dataclass

import torch

from ..core.compose import Composition, Weight
from ..core.types import Config, knob
from ._shared import CAP, log_edge, log_ratios

LATEX = r"\min\big(w_j,\ C\big),\quad w_j = \exp S_j"


@dataclass(frozen=True)
class SeqTISConfig(Config):
    seq_clip: float = knob(2.0, "C: the sequence weight w = exp(S) is truncated at C.", gt=0.0,
                           ui=(1.0, 100.0), log=True, inf=True)


CONFIG = SeqTISConfig


def compose(cfg: SeqTISConfig) -> Composition:
    return Composition(Weight("sequence", clip=cfg.seq_clip), adv_tau=cfg.adv_tau)  # min(exp S_j, C)


def reference(batch, cfg: SeqTISConfig) -> tuple[torch.Tensor, torch.Tensor]:
    m, l = log_ratios(batch)  # (B, T)
    S = l.sum(-1)  # (B,) S_j
    w = torch.exp(S.clamp(max=min(log_edge(cfg.seq_clip), CAP)))  # (B,) min(w_j, C) = exp(min(S_j, log C))
    return torch.where(m, w[:, None], 0.0), m.clone()
