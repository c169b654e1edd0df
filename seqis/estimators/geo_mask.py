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
from ._common import (
    GEO,
    Correction,
    Ratios,
    above_on,
    band_high,
    band_low,
    capped_exp,
    in_band,
    log_of,
    rows_above,
    tokens_of,
)


@dataclass(frozen=True)
class GeoMaskConfig(Config):
    geo_mask_low: float = band_low(0.5, GEO)
    geo_mask_high: float = band_high(2.0, GEO)
    token_clip: float | None = knob(None, "None: pure filter. A number C: kept tokens weigh min(rho_t, C).",
                                    gt=0.0, ui=(1.0, 10.0), log=True, optional=True)


def geo_mask(r: Ratios, cfg: GeoMaskConfig) -> Correction:
    gate = r.valid & in_band(r.geo_log_ratio, cfg.geo_mask_low, cfg.geo_mask_high)  # (B,)
    if cfg.token_clip is None:  # pure filter: weight 1 on the kept rollouts' tokens
        return Correction(accepted=gate)
    weights = capped_exp(r.log_ratio, cfg.token_clip)  # (B, T) min(rho_t, C); run() zeroes it off the gate
    c = log_of(cfg.token_clip)
    return Correction(
        weights=weights,
        accepted=gate,
        clipped=gate & rows_above(r.log_ratio, r.mask, c),  # (B,)
        masks={"clipped": lambda: above_on(tokens_of(r.mask, gate), r.log_ratio, c)},  # built if read
    )
