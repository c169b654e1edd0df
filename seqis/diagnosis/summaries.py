"""Small summaries of a batch and of an estimator's output, sized for a browser: what the explorer draws.

A 256 x 4096 batch has a million log-ratios; a chart gets a few thousand numbers. Everything here is
vectorised torch on the batch's device, returns small tensors (or floats), and is what the app's
Explore page calls so that no page does tensor math.

    token_map(r)            log-ratios pooled over blocks of positions: (rows, cols), signed max |l_t|
    dropped_map(kept, ...)  the fraction of each block's loss tokens whose gradient is dropped
    weight_histogram(out)   counts of log10 of the applied token weights, on fixed shared bins
    effectively_kept(out)   the tokens that keep a gradient: kept by the rules and weighing at least NEGLIGIBLE
                            times the median weight of the kept tokens ("dropped" means no gradient)
    effective_batch(out)    tokens and rollouts kept (effectively), ESS of the applied rollout weights
    theory_rollouts(...)    the closed-form acceptance / clipping to set beside them (Gaussian noise)
    rollout_row(x, mask, j) one rollout's loss tokens: positions and values (l_t, coefficients)
    ratio_quantiles(r), band_shares(r)   the raw ratios before any correction
    correction_fractions(outputs, r)     per correction: truncated and masked, token and rollout level
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from ..core.ratios import Ratios
from ..core.types import EstimatorOutput
from ..theory.closed_forms import closed_form

# a kept token whose weight is below this fraction of the median weight of the batch's kept tokens has no gradient
# to speak of (seq_tis on a catastrophic rollout: 1e-13): every summary counts it as dropped, beside the rules' own
NEGLIGIBLE = 1e-6


@torch.no_grad()
def effectively_kept(out: EstimatorOutput) -> torch.Tensor:
    """(B, T) bool: the kept tokens whose weight is at least NEGLIGIBLE x the median weight of the kept tokens."""
    kept, w = out.masks["kept"], out.weights  # (B, T); weights are never negative
    # the median is at most the largest weight: when no kept token weighs less than NEGLIGIBLE x that, none weighs
    # less than NEGLIGIBLE x the median, and the rules' mask is the answer without a select over every kept weight
    # (the advice reads a hundred corrections); an empty mask, the same
    floor = NEGLIGIBLE * float(w.max()) if w.numel() else 0.0
    if math.isfinite(floor) and not bool(torch.lt(w, floor).logical_and_(kept).any()):
        return kept
    # the median is one of the weights (torch's lower middle), so float32 gives it exactly: no float64 copy
    return kept & (w >= NEGLIGIBLE * float(w[kept].median()))  # one compare, no (B, T) copies


# log10 weight bins shared by every estimator so histograms overlay: 1e-3 .. 1e3, plus two overflow bins
HIST_LOG10_RANGE = (-3.0, 3.0)
HIST_BINS = 48


@dataclass(frozen=True)
class TokenMap:
    """Log-ratios of up to `max_rows` rollouts, longest first, pooled over blocks of `block` positions.

    values  (R, C) the log-ratio of largest magnitude in each block (sign kept); NaN where the block
            holds no loss token
    index   (R,) the rollout shown in each row: rollouts sorted by length (longest first, ties in batch
            order); when there are more than max_rows, every k-th of that order
    block   positions per column: column c covers positions [c * block, (c + 1) * block)
    """

    values: torch.Tensor
    index: torch.Tensor
    block: int

    @property
    def rows(self) -> int:
        return self.values.shape[0]


def _blocks(T: int, max_cols: int) -> tuple[int, int]:
    block = max(1, math.ceil(T / max_cols))
    return block, math.ceil(T / block)


def _pad_blocks(x: torch.Tensor, block: int, cols: int, fill) -> torch.Tensor:
    """(R, T) -> (R, cols, block), padding the end with `fill`."""
    R, T = x.shape
    pad = cols * block - T
    if pad:
        x = torch.cat([x, torch.full((R, pad), fill, dtype=x.dtype, device=x.device)], dim=1)
    return x.view(R, cols, block)


@torch.no_grad()
def token_map(r: Ratios, *, max_rows: int = 256, max_cols: int = 128) -> TokenMap:
    """Signed max-|l_t| pooling over blocks of positions, rollouts sorted by length (longest first)."""
    B, T = r.mask.shape
    order = torch.sort(r.length, descending=True, stable=True).indices  # (B,)
    if B > max_rows:
        order = order[torch.linspace(0, B - 1, max_rows, device=order.device).round().long()]
    block, cols = _blocks(T, max_cols)
    l = _pad_blocks(r.log_ratio[order], block, cols, 0.0)  # (R, C, block)
    m = _pad_blocks(r.mask[order], block, cols, False)  # (R, C, block)
    mag = torch.where(m, l.abs(), torch.full_like(l, -1.0))  # padding never wins the max
    idx = mag.argmax(-1, keepdim=True)  # (R, C, 1)
    pooled = l.gather(-1, idx).squeeze(-1)  # (R, C)
    pooled = torch.where(m.any(-1), pooled, torch.full_like(pooled, math.nan))
    return TokenMap(pooled, order, block)


@torch.no_grad()
def dropped_map(kept: torch.Tensor, mask: torch.Tensor, tm: TokenMap) -> torch.Tensor:
    """(R, C) fraction of each block's loss tokens whose gradient is dropped, in the token map's rows;
    NaN where a block has no loss token."""
    cols = tm.values.shape[1]
    m = _pad_blocks(mask[tm.index], tm.block, cols, False)  # (R, C, block)
    k = _pad_blocks(kept[tm.index], tm.block, cols, False)
    n = m.sum(-1).float()  # (R, C)
    dropped = (m & ~k).sum(-1).float()
    return torch.where(n > 0, dropped / n.clamp(min=1), torch.full_like(n, math.nan))


@torch.no_grad()
def weight_histogram(out: EstimatorOutput, kept_weights: torch.Tensor | None = None) -> dict[str, torch.Tensor | int]:
    """Counts of log10 of the applied weight of every kept loss token with a positive weight.

    counts (HIST_BINS + 2,): [below 1e-3, the HIST_BINS inner bins, above 1e3]; dropped: loss tokens
    whose gradient is dropped (weight 0, not in the counts); underflow: kept tokens whose weight is 0.
    kept_weights: out.weights[kept] (n_kept,), when the caller has it already (no second search of the mask).
    """
    w = out.weights[out.masks["kept"]] if kept_weights is None else kept_weights  # (n_kept,)
    positive = w > 0
    x = torch.log10(w[positive])
    lo, hi = HIST_LOG10_RANGE
    inner = torch.histc(x.clamp(lo, hi), bins=HIST_BINS, min=lo, max=hi) if x.numel() else torch.zeros(HIST_BINS)
    below, above = int((x < lo).sum()), int((x > hi).sum())
    inner = inner.cpu().to(torch.int64)
    inner[0] -= below  # histc counted the clamped values in the edge bins
    inner[-1] -= above
    counts = torch.cat([torch.tensor([below]), inner, torch.tensor([above])])
    n_loss = int(out.rollouts["length"].sum())
    return {"counts": counts, "dropped": n_loss - w.numel(), "underflow": int((~positive).sum())}


@torch.no_grad()
def effective_batch(out: EstimatorOutput, kept: torch.Tensor | None = None,
                    kept_len: torch.Tensor | None = None) -> dict[str, float]:
    """What survives of the batch under one estimator.

    rollouts                            valid rollouts (T_j > 0)
    tokens_kept / tokens_kept_frac      loss tokens whose gradient survives (effectively_kept: the rules keep
                                        them and their weight is not negligible)
    tokens_rejected                     loss tokens the rules drop; tokens_negligible: kept by the rules with a
                                        negligible weight (dropped too: no gradient)
    rollouts_kept / rollouts_kept_frac  valid rollouts that keep some gradient; rollouts_negligible: accepted by
                                        the rules, every kept token negligible
    ess / ess_frac                      (sum w)^2 / sum w^2 of the applied rollout weights (a dropped
                                        rollout weighs 0), and that over the number of valid rollouts
    clipped_frac                        valid rollouts whose weight was truncated
    kept: effectively_kept(out), when the caller has it already (Explore's column does: not made twice);
    kept_len: kept.sum(-1), likewise (the advice reads it for its outlier shares too).
    """
    ro = out.rollouts
    valid = ro["length"] > 0  # (B,)
    n_valid = int(valid.sum())
    n_tok = float(ro["length"].sum())
    kept = effectively_kept(out) if kept is None else kept  # (B, T); a caller holding it passes it
    kept_len = kept.sum(-1) if kept_len is None else kept_len  # (B,) tokens kept per rollout
    tokens_kept = float(kept_len.sum())
    rules_kept = tokens_kept if kept is out.masks["kept"] else float(out.masks["kept"].sum())  # none negligible
    accepted = ro["accepted"] & valid  # (B,) by the rules
    rollouts_kept = int((accepted & (kept_len > 0)).sum())
    w = torch.where(valid, ro["weight"].double(), torch.zeros((), dtype=torch.float64, device=valid.device))
    top = w.max() if n_valid else torch.zeros((), dtype=torch.float64)
    if n_valid == 0 or float(top) <= 0:
        ess = 0.0
    else:
        w = w / top  # scale first so the squares never overflow
        ess = float(w.sum() ** 2 / (w**2).sum())
    clipped = int((ro["clipped"] & valid).sum())
    return {
        "rollouts": float(n_valid),
        "tokens_kept": tokens_kept,
        "tokens_kept_frac": tokens_kept / n_tok if n_tok else 0.0,
        "tokens_rejected": n_tok - rules_kept,
        "tokens_negligible": rules_kept - tokens_kept,
        "rollouts_kept": float(rollouts_kept),
        "rollouts_negligible": float(int(accepted.sum()) - rollouts_kept),
        "rollouts_kept_frac": rollouts_kept / n_valid if n_valid else 0.0,
        "ess": ess,
        "ess_frac": ess / n_valid if n_valid else 0.0,
        "clipped_frac": clipped / n_valid if n_valid else 0.0,
    }


@torch.no_grad()
def rollout_advantages(advantages: torch.Tensor, r: Ratios) -> torch.Tensor:
    """(B,) one advantage per rollout: as given, or the mean over its loss tokens of per-token ones."""
    adv = advantages.float()
    if adv.dim() == 2:
        zero = torch.zeros((), dtype=adv.dtype, device=adv.device)
        adv = torch.where(r.mask, adv, zero).sum(-1) / r.length.clamp(min=1).to(adv.dtype)
    return adv


@torch.no_grad()
def rollout_row(x: torch.Tensor, mask: torch.Tensor, j: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(positions, values) of rollout j's loss tokens in a (B, T) tensor, in position order."""
    pos = torch.nonzero(mask[j]).squeeze(-1)  # (T_j,)
    return pos, x[j, pos]


def theory_rollouts(x, cfg, s: float, lengths) -> dict[str, float]:
    """Closed-form expectations under valid-IS Gaussian noise of scale s (seqis.theory.closed_forms), averaged over the
    batch's rollout lengths, read from the correction's composition (x: a name, a preset key or a Composition;
    cfg its config or None): "rollouts_kept_frac" when one rollout-level band on the ratio (geometric, product,
    or every token's) decides which rollouts go, "clipped_frac" when a sequence weight is truncated. Empty when
    the closed forms do not cover the composition (several rollout rules, other statistics, sign conditions)."""
    T = np.asarray(lengths, dtype=np.float64)
    T = T[T > 0]
    form = closed_form(x, cfg, T, s) if T.size else None
    if form is None:
        return {}
    if form.accepted is not None:
        return {"rollouts_kept_frac": float(np.mean(form.accepted))}
    if form.clipped is not None:
        return {"clipped_frac": float(np.mean(form.clipped))}
    return {}

__all__ = ["HIST_BINS", "HIST_LOG10_RANGE", "TokenMap", "dropped_map", "effective_batch",
           "rollout_advantages", "rollout_row", "theory_rollouts", "token_map", "weight_histogram"]


# ---------------------------------------------------------------------------------------------------------
# the raw ratios before any correction, and what each correction truncates and masks (the Diagnose page)

RATIO_QUANTILES = (0.001, 0.01, 0.1, 0.5, 0.9, 0.99, 0.999)
TOKEN_BANDS = {"[0.8, 1.25]": (0.8, 1.25), "[0.5, 2]": (0.5, 2.0), "[0.5, 5] (IcePop)": (0.5, 5.0),
               "[1e-4, 1e4] (verl veto)": (1e-4, 1e4)}


def ratio_quantiles(r: Ratios) -> pd.DataFrame:
    """Quantiles of the per-token log-ratio l and of rho = e^l over loss tokens, before any correction."""
    from .statistics import percentiles

    qs = percentiles(r.log_ratio[r.mask].float(), RATIO_QUANTILES)
    return pd.DataFrame({"log_ratio": qs, "ratio": [math.exp(v) for v in qs]},
                        index=pd.Index([f"p{100 * q:g}" for q in RATIO_QUANTILES], name="quantile"))


def band_shares(r: Ratios) -> pd.DataFrame:
    """The share of loss tokens whose ratio lies outside each common token band (bounds inclusive)."""
    l = r.log_ratio[r.mask]  # (N,)
    n = max(l.numel(), 1)
    shares = [int(((l < math.log(lo)) | (l > math.log(hi))).sum()) / n for lo, hi in TOKEN_BANDS.values()]
    return pd.DataFrame({"share_outside": shares}, index=pd.Index(list(TOKEN_BANDS), name="token band"))


def correction_fractions(outputs: dict[str, EstimatorOutput], r: Ratios) -> pd.DataFrame:
    """For each correction (estimator or preset output, by name): the fraction truncated and masked, at token
    level (share of loss tokens) and rollout level (share of valid rollouts), side by side.

    tokens_masked       loss tokens whose gradient is dropped: by the rules (the metric is_masked) or by a
                        negligible weight (effectively_kept); tokens_negligible: the latter alone
    tokens_truncated    loss tokens whose weight is cut at a clip (the "clipped" mask)
    rollouts_masked     rollouts with every loss token dropped; rollouts_partly_masked: with at least one
    rollouts_truncated  rollouts with a truncated weight (or a truncated token)
    """
    n_tok = max(int(r.mask.sum()), 1)
    valid = r.valid  # (B,)
    n_roll = max(int(valid.sum()), 1)
    rows = []
    for name, out in outputs.items():
        dropped = r.mask & ~effectively_kept(out)  # (B, T)
        dropped_rows = dropped.sum(-1)  # (B,)
        clipped = out.masks["clipped"] & r.mask if "clipped" in out.masks else torch.zeros_like(r.mask)
        rows.append({
            "correction": str(name),
            "tokens_masked": int(dropped.sum()) / n_tok,
            "tokens_negligible": int((out.masks["kept"] & dropped).sum()) / n_tok,
            "tokens_truncated": int(clipped.sum()) / n_tok,
            "rollouts_masked": int((valid & (dropped_rows == r.mask.sum(-1))).sum()) / n_roll,
            "rollouts_partly_masked": int((valid & (dropped_rows > 0)).sum()) / n_roll,
            "rollouts_truncated": int((valid & (out.rollouts["clipped"].bool() | clipped.any(-1))).sum()) / n_roll,
        })
    return pd.DataFrame(rows).set_index("correction")
