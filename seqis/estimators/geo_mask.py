"""Geometric trust-region mask (Geo-Mask), optionally with a token clip (Geo-Mask-Token-TIS).

    weight on token t of rollout j = 1[lo <= exp(S_j / T_j) <= hi] * (1, or min(rho_t, token_clip))

A pure filter: the geometric ratio is a per-token KL threshold that sharpens with length (a long
rollout passes iff its mean log-ratio lies in (log lo, log hi)). With token_clip set, kept tokens also
carry their own truncated ratio.
Trades: no weight variance at all (weights are 0/1); the bias is the distribution shift it does not
correct inside the band. A single catastrophic token with l = -L passes lo iff L / T < -log lo:
long rollouts dilute catastrophes.
Reduces to: pg as the band widens to [0, inf] (token_clip None).
Source: prime-rl's geometric sequence mask; Li & Liu, "RL collapse" part 3.
"""

from dataclasses import dataclass

from ..types import Config, knob
from ._common import GEO, band_high, band_low
from .compose import Composition, Criterion, Weight


@dataclass(frozen=True)
class GeoMaskConfig(Config):
    geo_mask_low: float = band_low(0.5, GEO)
    geo_mask_high: float = band_high(2.0, GEO)
    token_clip: float | None = knob(None, "None: pure filter. A number C: kept tokens weigh min(rho_t, C).",
                                    gt=0.0, ui=(1.0, 10.0), log=True, optional=True)


def compose(cfg: GeoMaskConfig) -> Composition:
    geometric_gate = Criterion("ratio", "mean", cfg.geo_mask_low, cfg.geo_mask_high)  # exp(S_j / T_j) in band
    weight = Weight() if cfg.token_clip is None else Weight("token", clip=cfg.token_clip)  # 1 or min(rho_t, C)
    return Composition(weight, (geometric_gate,), adv_tau=cfg.adv_tau)
