"""Sequence masked importance sampling with a geometric gate (seq MIS, as in prime-rl).

    weight on rollout j = 1[lo <= exp(S_j / T_j) <= hi] * min(w_j, e^40)

The gate reads the geometric (per-token) ratio; the weight is the untempered product ratio.
Trades: no truncation bias inside the gate, but the product weight keeps sequence IS's variance
(1 + chi2)^T on the rollouts it keeps; the gate drops rollouts whose mean log-ratio is far off, which
biases towards rollouts where the policies agree.
Reduces to: seq_is as the band widens to [0, inf].
Source: prime-rl's sequence-level IS ablations; Li & Liu, "RL collapse" part 3 (Seq-MIS).
"""

from dataclasses import dataclass

from ..types import Config
from ._common import GEO, band_high, band_low
from .compose import Composition, Criterion, Weight


@dataclass(frozen=True)
class SeqMISConfig(Config):
    geo_mask_low: float = band_low(0.5, GEO)
    geo_mask_high: float = band_high(2.0, GEO)


def compose(cfg: SeqMISConfig) -> Composition:
    geometric_gate = Criterion("ratio", "mean", cfg.geo_mask_low, cfg.geo_mask_high)  # exp(S_j / T_j) in band
    return Composition(Weight("sequence"), (geometric_gate,), adv_tau=cfg.adv_tau)  # times exp S_j
