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

from ..types import Config
from ._common import GEO, TOKEN, Correction, Ratios, as_float, band_f, band_high, band_low, gated, in_band, outside_band


@dataclass(frozen=True)
class MISPOConfig(Config):
    token_mask_low: float = band_low(0.5, TOKEN)
    token_mask_high: float = band_high(2.0, TOKEN)
    geo_mask_low: float = band_low(0.996, GEO, ui=(0.9, 1.0))
    geo_mask_high: float = band_high(1.001, GEO, ui=(1.0, 1.1))


def mis_po(r: Ratios, cfg: MISPOConfig) -> Correction:
    lo, hi = cfg.token_mask_low, cfg.token_mask_high
    kept = band_f(r.log_ratio, lo, hi).mul_(r.mask_f)  # (B, T) 1.0 on the loss tokens inside the token band
    token_ok = kept.sum(-1)  # (B,) how many of each rollout's loss tokens that is
    gate = r.valid & in_band(r.geo_log_ratio, cfg.geo_mask_low, cfg.geo_mask_high)  # (B,) trajectory band
    kept.mul_(as_float(gate, r.dtype)[:, None])  # (B, T) in place: inside both bands
    n_tok = r.n_tokens.clamp(min=1)
    return Correction(
        kept=kept,
        kept_len=gated(gate, token_ok),
        masks={"token_masked": partial(outside_band, r.mask, r.log_ratio, lo, hi)},
        accepted=gate,
        metrics={
            "is_token_masked": (r.n_tokens - token_ok.sum()) / n_tok,
            "is_traj_masked": gated(~gate, r.length).sum() / n_tok,  # tokens of the rejected rollouts
        },
    )
