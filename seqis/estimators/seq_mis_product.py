"""Sequence masked IS with the product criterion (Li's Seq-MIS, one-sided).

    weight on rollout j = 1[w_j <= C] * w_j

Trades: no clipped weight; rollouts whose product ratio exceeds C are dropped entirely. Under valid
IS noise the kept mass is E[w 1(w <= C)] = Phi((log C - T s^2 / 2) / (s sqrt T)) (s = 0.05, T = 256,
C = 2: 0.680): it falls with length, so long rollouts are dropped more and more.
Reduces to: seq_is as C -> inf.
Source: Li & Liu, "RL collapse" part 3.
"""

from dataclasses import dataclass

from ..types import Config, knob
from .compose import Composition, Weight


@dataclass(frozen=True)
class SeqMISProductConfig(Config):
    seq_clip: float = knob(2.0, "C: a rollout whose product ratio w = exp(S) exceeds C is dropped.", gt=0.0,
                           ui=(1.0, 100.0), log=True)


def compose(cfg: SeqMISProductConfig) -> Composition:
    return Composition(Weight("sequence", band=(0.0, cfg.seq_clip)), adv_tau=cfg.adv_tau)  # 1[w_j <= C] * w_j
