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
from ._common import Correction, Ratios, capped_exp, gated, log_of, seq_weight_metric


@dataclass(frozen=True)
class SeqMISProductConfig(Config):
    seq_clip: float = knob(2.0, "C: a rollout whose product ratio w = exp(S) exceeds C is dropped.", gt=0.0,
                           ui=(1.0, 100.0), log=True)


def seq_mis_product(r: Ratios, cfg: SeqMISProductConfig) -> Correction:
    gate = r.valid & (r.seq_log_ratio <= log_of(cfg.seq_clip))  # (B,)
    w = gated(gate, capped_exp(r.seq_log_ratio))  # (B,)
    return Correction(
        seq_weights=w,
        accepted=gate,
        metrics={"seq_weight": seq_weight_metric(r, w, gate)},
    )
