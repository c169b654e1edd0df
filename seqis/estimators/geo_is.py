"""GeoMean IS: the geometric ratio exp(S/T) as the weight.

    weight on every loss token of rollout j = min(exp(S_j / T_j), C)

Trades: the geometric mean tames the weight's variance (it does not grow with T), but it is not an
importance weight of anything: biased, and on Huang's long-horizon chain it does worst (success 0.332
at H = 1024 vs 0.749 for sequence IS).
Reduces to: pg on-policy; untruncated GeoMean IS with C = inf (the default).
Source: GSPO (Zheng et al.); Huang, "Is Frontier Asynchronous RL Solved?".
"""

import math
from dataclasses import dataclass

import torch

from ..core.compose import Composition, Weight
from ..core.types import Config, knob
from ._shared import CAP, log_edge, log_ratios

LATEX = r"\min\big(e^{S_j/T_j},\ C\big)"


@dataclass(frozen=True)
class GeoISConfig(Config):
    geo_clip: float = knob(math.inf, "C: the geometric weight exp(S/T) is truncated at C (inf: no clip).",
                           gt=0.0, ui=(1.0, 10.0), log=True, inf=True)


CONFIG = GeoISConfig


def compose(cfg: GeoISConfig) -> Composition:
    return Composition(Weight("geometric", clip=cfg.geo_clip), adv_tau=cfg.adv_tau)  # min(exp(S_j / T_j), C)


def reference(batch, cfg: GeoISConfig) -> tuple[torch.Tensor, torch.Tensor]:
    m, l = log_ratios(batch)  # (B, T)
    g = l.sum(-1) / m.sum(-1).clamp(min=1)  # (B,) S_j / T_j
    w = torch.exp(g.clamp(max=min(log_edge(cfg.geo_clip), CAP)))  # (B,) min(exp(S_j / T_j), C)
    return torch.where(m, w[:, None], 0.0), m.clone()
