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

from ..types import Config
from ._common import GEO, TOKEN, Correction, Ratios, as_float, band_f, band_high, band_low, dot, gated, in_band


@dataclass(frozen=True)
class MISPOConfig(Config):
    token_mask_low: float = band_low(0.5, TOKEN)
    token_mask_high: float = band_high(2.0, TOKEN)
    geo_mask_low: float = band_low(0.996, GEO, ui=(0.9, 1.0))
    geo_mask_high: float = band_high(1.001, GEO, ui=(1.0, 1.1))


def mis_po(r: Ratios, cfg: MISPOConfig) -> Correction:
    token_ok = band_f(r.log_ratio, cfg.token_mask_low, cfg.token_mask_high)  # (B, T) 1.0 inside the token band
    token_masked = token_ok.bool().bitwise_not_()  # (B, T) outside it ...
    token_masked &= r.mask  # ... among the loss tokens
    n_token_ok = dot(token_ok, r.mask_f)  # loss tokens inside the token band
    gate = r.valid & in_band(r.geo_log_ratio, cfg.geo_mask_low, cfg.geo_mask_high)  # (B,) trajectory band
    kept = token_ok.mul_(r.mask_f).mul_(as_float(gate, r.dtype)[:, None])  # (B, T) in place: both bands
    n_tok = r.n_tokens.clamp(min=1)
    return Correction(
        kept=kept,
        masks={"token_masked": token_masked, "traj_masked": r.tokens_of(~gate)},
        accepted=gate,
        metrics={
            "is_token_masked": (r.n_tokens - n_token_ok) / n_tok,
            "is_traj_masked": gated(~gate, r.length).sum() / n_tok,  # tokens of the rejected rollouts
        },
    )
