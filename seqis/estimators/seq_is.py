"""Untruncated sequence importance sampling.

    weight on every loss token of rollout j = min(w_j, e^40),  w_j = exp(S_j)

Trades: unbiased (the e^40 cap is a numerical guard, not a knob), but Var(w) = (1 + chi2)^T - 1
grows exponentially with length: under l ~ N(-s^2/2, s^2), Var(w) = e^(T s^2) - 1 and the normalised
ESS is e^(-T s^2) (s = 0.05, T = 100: 0.284 and 0.779).
Reduces to: seq_tis with C -> inf; seq_mis with an infinite band.
Source: Li & Liu, part 2; Huang, "Is Frontier Asynchronous RL Solved?".
"""

from dataclasses import dataclass

from ..types import Config
from ._common import Correction, Ratios, capped_exp, seq_weight_metric


@dataclass(frozen=True)
class SeqISConfig(Config):
    pass


def seq_is(r: Ratios, cfg: SeqISConfig) -> Correction:
    w = capped_exp(r.seq_log_ratio)  # (B,)
    return Correction(seq_weights=w, metrics={"seq_weight": seq_weight_metric(r, w, r.valid)})
