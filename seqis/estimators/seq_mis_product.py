"""Li's Seq-MIS: drop rollouts with w_j > C, keep w_j otherwise.

    weight on rollout j = 1[w_j <= C] * w_j

Trades: no clipped weight; rollouts whose product ratio exceeds C are dropped entirely. Under valid
IS noise the kept mass is E[w 1(w <= C)] = Phi((log C - T s^2 / 2) / (s sqrt T)) (s = 0.05, T = 256,
C = 2: 0.680): it falls with length, so long rollouts are dropped more and more.
Reduces to: seq_is as C -> inf.
Source: Li & Liu, "RL collapse" part 3.
"""

from dataclasses import dataclass

import torch

from ..core.compose import Composition, Weight
from ..core.types import Config, knob
from ._shared import CAP, log_edge, log_ratios

LATEX = r"\mathbb{1}\big[w_j \le C\big]\cdot w_j"


@dataclass(frozen=True)
class SeqMISProductConfig(Config):
    seq_clip: float = knob(2.0, "C: a rollout whose product ratio w = exp(S) exceeds C is dropped.", gt=0.0,
                           ui=(1.0, 100.0), log=True, inf=True)


CONFIG = SeqMISProductConfig


def compose(cfg: SeqMISProductConfig) -> Composition:
    return Composition(Weight("sequence", band=(0.0, cfg.seq_clip)), adv_tau=cfg.adv_tau)  # 1[w_j <= C] * w_j


def reference(batch, cfg: SeqMISProductConfig) -> tuple[torch.Tensor, torch.Tensor]:
    m, l = log_ratios(batch)  # (B, T)
    S = l.sum(-1)  # (B,)
    kept = m & (S <= log_edge(cfg.seq_clip))[:, None]  # (B, T) the rollouts with w_j <= C
    return torch.where(kept, torch.exp(S.clamp(max=CAP))[:, None], 0.0), kept
