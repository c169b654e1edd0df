"""Truncated sequence importance sampling (seq TIS).

    weight on every loss token of rollout j = min(w_j, C),  w_j = exp(S_j),  computed as exp(min(S_j, log C))

Trades: clipping at C caps the variance at O(T^2 C^2) for a bias O(T (1 + chi2) / C); Li's best
C* = sqrt(2 (1 + chi2)) is about 1.4-2. The kept mass E[min(w, C)] falls towards 0 as T grows, so
truncation quietly shrinks long rollouts' gradients; an upward outlier keeps weight C.
Reduces to: seq_is as C -> inf.
Source: Li & Liu, "When Speed Kills Stability" (part 2); prime-rl's sequence-level IS ablation.
"""

from dataclasses import dataclass

from ..types import Config, knob
from ._common import Correction, Ratios, capped_exp, clipped_metric, log_of, seq_weight_metric


@dataclass(frozen=True)
class SeqTISConfig(Config):
    seq_clip: float = knob(2.0, "C: the sequence weight w = exp(S) is truncated at C.", gt=0.0,
                           ui=(1.0, 100.0), log=True)


def seq_tis(r: Ratios, cfg: SeqTISConfig) -> Correction:
    S = r.seq_log_ratio  # (B,)
    w = capped_exp(S, cfg.seq_clip)  # (B,) min(w_j, C)
    clipped = r.valid & (S > log_of(cfg.seq_clip))  # (B,)
    return Correction(
        seq_weights=w,
        clipped=clipped,
        metrics={"is_clipped": clipped_metric(r, clipped), "seq_weight": seq_weight_metric(r, w, r.valid)},
    )
