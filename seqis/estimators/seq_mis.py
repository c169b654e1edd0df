"""Geometric gate on exp(S/T), untempered product weight w_j inside it.

    weight on rollout j = 1[lo <= exp(S_j / T_j) <= hi] * min(w_j, e^40)

The gate reads the geometric (per-token) ratio; the weight is the untempered product ratio.
Trades: no truncation bias inside the gate, but the product weight keeps sequence IS's variance
(1 + chi2)^T on the rollouts it keeps; the gate drops rollouts whose mean log-ratio is far off, which
biases towards rollouts where the policies agree.
Reduces to: seq_is as the band widens to [0, inf].
Source: prime-rl's sequence-level IS ablations; Li & Liu, "RL collapse" part 3 (Seq-MIS).
"""

from dataclasses import dataclass

import torch

from ..core.compose import Composition, Criterion, Weight
from ..core.types import Config
from ._shared import CAP, GEO, band_high, band_low, log_edge, log_ratios

LATEX = (r"\mathbb{1}\big[\mathrm{lo} \le e^{S_j/T_j} \le \mathrm{hi}\big]"
         r"\cdot \min\big(w_j,\ e^{40}\big)")


@dataclass(frozen=True)
class SeqMISConfig(Config):
    geo_mask_low: float = band_low(0.5, GEO)
    geo_mask_high: float = band_high(2.0, GEO)


CONFIG = SeqMISConfig


def compose(cfg: SeqMISConfig) -> Composition:
    geometric_gate = Criterion("ratio", "mean", cfg.geo_mask_low, cfg.geo_mask_high)  # exp(S_j / T_j) in band
    return Composition(Weight("sequence"), (geometric_gate,), adv_tau=cfg.adv_tau)  # times exp S_j


def reference(batch, cfg: SeqMISConfig) -> tuple[torch.Tensor, torch.Tensor]:
    m, l = log_ratios(batch)  # (B, T)
    T, S = m.sum(-1), l.sum(-1)  # (B,)
    g = S / T.clamp(min=1)  # (B,) log of the geometric ratio
    gate = (T > 0) & (g >= log_edge(cfg.geo_mask_low)) & (g <= log_edge(cfg.geo_mask_high))  # (B,)
    kept = m & gate[:, None]  # (B, T)
    return torch.where(kept, torch.exp(S.clamp(max=CAP))[:, None], 0.0), kept
