"""Cumulative prefix ratio up to each token.

    weight on token t = min(exp(sum of l_s over loss tokens s <= t), C)

Trades: token t's gradient is corrected by the ratio of the prefix that led to it, the exact
correction for a per-token reward-to-go; variance grows along the rollout like sequence IS's does with
length, and the clip trades it for bias.
Reduces to: seq_is on the last token; token IS on the first.
Source: the cumulative prefix ratio of MinPRO.
"""

import math
from dataclasses import dataclass

import torch

from ..core.compose import Composition, Weight
from ..core.types import Config, knob
from ._shared import CAP, log_edge, log_ratios

LATEX = r"\min\Big(\exp\sum_{s\le t} \ell_s,\ C\Big)"


@dataclass(frozen=True)
class PrefixISConfig(Config):
    prefix_clip: float = knob(math.inf, "C: the prefix ratio is truncated at C (inf: no clip).", gt=0.0,
                              ui=(1.0, 100.0), log=True, inf=True)


CONFIG = PrefixISConfig


def compose(cfg: PrefixISConfig) -> Composition:
    return Composition(Weight("prefix", clip=cfg.prefix_clip), adv_tau=cfg.adv_tau)  # min(exp(sum_{s<=t} l_s), C)


def reference(batch, cfg: PrefixISConfig) -> tuple[torch.Tensor, torch.Tensor]:
    m, l = log_ratios(batch)  # (B, T), l = 0 off the loss mask
    prefix = l.cumsum(-1)  # (B, T) sum of l_s over loss tokens s <= t
    w = torch.exp(prefix.clamp(max=min(log_edge(cfg.prefix_clip), CAP)))  # (B, T)
    return torch.where(m, w, 0.0), m.clone()
