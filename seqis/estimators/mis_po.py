"""MIS-PO: a token band times a trajectory band (Step 3.5 Flash, section 5.2.1, eq. 2).

    weight on token t of rollout j = 1[tlo <= rho_t <= thi] * 1[glo <= exp(S_j / T_j) <= ghi]

The trajectory ratio uses all of the rollout's loss tokens, including those the token band drops.
Trades: a pure filter (0/1 weights, no variance from weights). The default trajectory band
[0.996, 1.001] is [-0.0040, +0.0010] in log space: long rollouts pass iff the per-token KL is below
~0.004 nats, short ones are rejected more often; the token band catches catastrophic tokens that a
geometric mean dilutes.
Reduces to: pg as both bands widen to [0, inf].
Source: StepFun, "Step 3.5 Flash" (arXiv 2602.10604).
"""

from dataclasses import dataclass
from functools import partial

import torch

from ..types import Config
from ._common import (
    GEO,
    TOKEN,
    Correction,
    Ratios,
    as_float,
    band_high,
    band_low,
    gated,
    in_band,
    outside_band,
    outside_f,
    rows_outside,
)


@dataclass(frozen=True)
class MISPOConfig(Config):
    token_mask_low: float = band_low(0.5, TOKEN)
    token_mask_high: float = band_high(2.0, TOKEN)
    geo_mask_low: float = band_low(0.996, GEO, ui=(0.9, 1.0))
    geo_mask_high: float = band_high(1.001, GEO, ui=(1.0, 1.1))


def mis_po(r: Ratios, cfg: MISPOConfig) -> Correction:
    lo, hi = cfg.token_mask_low, cfg.token_mask_high
    gate = r.valid & in_band(r.geo_log_ratio, cfg.geo_mask_low, cfg.geo_mask_high)  # (B,) trajectory band
    rows = rows_outside(r.log_ratio, lo, hi)  # (R,) when only a few rollouts have a token outside the band
    if rows is not None:  # catastrophic tokens are rare: only their rollouts carry a mask
        mask_f = r.mask_f.index_select(0, rows)  # (R, T)
        out = outside_f(r.log_ratio.index_select(0, rows), lo, hi).mul_(mask_f)  # (R, T) 1.0: dropped loss tokens
        dropped = torch.zeros_like(r.length).index_copy_(0, rows, out.sum(-1))  # (B,) loss tokens outside the band
        form = dict(kept_rows=(rows, mask_f.sub_(out)))
    else:
        out = outside_f(r.log_ratio, lo, hi)  # (B, T) 1.0 outside the token band
        if not lo <= 1.0 <= hi:  # padding (l = 0) is outside a band that excludes ratio 1
            out.mul_(r.mask_f)
        dropped = out.sum(-1)
        form = dict(kept=torch.sub(r.mask_f, out, out=out).mul_(as_float(gate, r.dtype)[:, None]))  # in place
    n_tok = r.n_tokens.clamp(min=1)
    return Correction(
        kept_len=gated(gate, r.length - dropped),
        accepted=gate,
        masks={"token_masked": partial(outside_band, r.mask, r.log_ratio, lo, hi)},
        metrics={
            "is_token_masked": dropped.sum() / n_tok,
            "is_traj_masked": gated(~gate, r.length).sum() / n_tok,  # tokens of the rejected rollouts
        },
        **form,
    )
