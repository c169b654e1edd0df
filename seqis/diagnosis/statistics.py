"""Estimator-free statistics of a batch's mismatch.

  kl_k1          mean over loss tokens of -l          (k1 estimate of KL(mu || pi), unbiased, noisy)
  kl_k3          mean over loss tokens of rho - 1 - l (k3 estimate: unbiased and >= 0)
  chi2_token     mean over loss tokens of rho^2 - 1   (chi^2(pi || mu) per token, if E_mu[rho] = 1)
  chi2_seq       mean over valid rollouts of w^2 - 1  (w capped at e^40)
  ess_seq        (sum w)^2 / (n sum w^2), normalised effective sample size of the sequence weights, in (0, 1]
  ppl_ratio      mean over valid rollouts of exp(-S/T) (perplexity under pi over perplexity under mu)
  abs_ratio_mean mean over loss tokens of exp|l| (|l| capped at 40): >= 1, and unlike kl_k1 it cannot cancel
                 (Tunix's statistic; NeMo-RL's multiplicative probability error)
  tokens_in_<lo>_<hi>    share of loss tokens with lo <= rho_t <= hi, for each band of RATIO_BANDS (MaxText's)
  rollouts_in_<lo>_<hi>  share of valid rollouts with lo <= exp(S_j/T_j) <= hi; a geometric ratio within the
                 rounding of its log-probs of an edge is on it, as in every geometric band of seqis
  abs_log_ratio_p50 / _p99 / _max   percentiles of |l| over loss tokens (nearest rank, exact up to 2^24 positions,
                 from a seeded sample of 2^24 beyond; with percentile_sample=N, of the loss tokens among about N
                 positions at a fixed odd stride, as seqis.runs.monitor logs them each step); the max is always exact
  n_rollouts     valid rollouts (T_j > 0);  n_tokens: loss tokens
"""

from __future__ import annotations

import math

import torch

from ..core.ratios import MAX_LOG_WEIGHT, Ratios, expm1, rho2_row_sums, row_blocks
from ..core.types import Batch
from ..evaluators.kernels import in_band, in_log_band, masked_mean
from ..evaluators.plain import log_of

# exact up to this many tokens; beyond, a seeded sample of this size (rank error ~1e-4)
_PERCENTILE_SAMPLE = 1 << 24
_BRACKET_SAMPLE = 1 << 14  # the strided sample that brackets each rank before the exact selection
_DIRECT_SELECTION = 1 << 16  # up to this many elements, a kthvalue per rank
# the bands around ratio 1 whose shares of tokens and rollouts diagnostics reports (MaxText's), inclusive, in log space
RATIO_BANDS = ((0.999, 1.002), (0.99, 1.01), (0.95, 1.05))


def band_key(low: float, high: float) -> str:
    """A band's part of a statistic's name: 0.999_1.002."""
    return f"{low:g}_{high:g}"


def percentiles(x: torch.Tensor, qs: tuple[float, ...], *, below: int = 0) -> list[float]:
    """Nearest-rank percentiles (q in [0, 1]) of a 1-D tensor; works on 1e8 elements (torch.quantile
    refuses more than 2^24). Empty input gives 0.0. below: that many leading elements of the order are not part
    of the data (the padding zeros of a (B, T) tensor of values >= 0, so its loss tokens need no gather)."""
    n = x.numel() - below
    if n <= 0:
        return [0.0 for _ in qs]
    if x.numel() > _PERCENTILE_SAMPLE:
        if below:
            raise ValueError("percentiles: below= is for inputs of at most 2^24 elements")
        g = torch.Generator(device=x.device).manual_seed(0)
        x = x[torch.randint(n, (_PERCENTILE_SAMPLE,), generator=g, device=x.device)]
        n = x.numel()
    ranks = [below + min(n - 1, max(0, round(q * (n - 1)))) for q in qs]
    if x.is_cuda:  # a radix sort is fast on the GPU, where a selection is not
        xs = x.sort().values
        return torch.stack([xs[k] for k in ranks]).tolist()
    if x.numel() <= _DIRECT_SELECTION:  # the bracketing's dozen passes cost more than a selection per rank
        return [float(x.kthvalue(k + 1).values) for k in ranks]
    return order_statistics(x, ranks)


def order_statistics(x: torch.Tensor, ranks: list[int]) -> list[float]:
    """The elements of the given ranks (0-based) in x's ascending order, exactly (1-D, CPU). A strided sample of x
    brackets each rank, 4 standard deviations of a sample rank either side; per rank one pass counts the
    elements under its bracket and marks those in it, and one gather of every bracket's elements (a few sample
    gaps' worth each) leaves a small selection per rank. When a bracket misses (rare: the answer is then a
    selection over all of x) the value is the same. About 3 passes over x per rank (2 for a rank near an end,
    p99's) and one for all, against kthvalue's copy and selection of all of it."""
    n = x.numel()
    sample = x[strided_sample(n, _BRACKET_SAMPLE)].contiguous()  # (m,) in x's order
    m = sample.numel()
    at_rank = lambda j: sample.kthvalue(j + 1).values.item()  # the sample's j-th smallest (a sort of m is slower)
    # a comparison written into floats is vectorised, into bools it is not (4x slower): each is made in floats
    # (counted there, exactly: float32 holds every count up to 2^24) and copied into a bool mask
    flags = torch.empty(n, dtype=torch.float32 if n <= 1 << 24 else torch.float64)  # (n,) 0/1
    ge, le, inside = (torch.empty(n, dtype=torch.bool) for _ in range(3))  # (n,) reused per rank
    inside.zero_()  # every rank's bracket
    brackets = []  # (rank, lo or None, hi or None, the elements under lo)
    for k in ranks:
        at = k * (m - 1) / max(n - 1, 1)  # where rank k falls in the sample
        q = k / max(n - 1, 1)
        spread = 4 * math.sqrt(m * q * (1 - q)) + 2
        lo, hi = math.floor(at - spread), math.ceil(at + spread)
        # a bracket within one more of its widths from an end runs to that end: a pass saved for a few elements
        lo = at_rank(lo) if lo >= 2 * spread else None
        hi = at_rank(hi) if hi < m - 2 * spread else None
        if lo is not None:
            under = n - int(torch.ge(x, lo, out=flags).sum())  # (a NaN compares false: counted under)
            ge.copy_(flags)
        else:
            ge.fill_(True)
            under = 0
        if hi is not None:
            ge &= le.copy_(torch.le(x, hi, out=flags))
        inside |= ge
        brackets.append((k, lo, hi, under))
    found = x[inside]  # (a few sample gaps' worth per rank)
    out = []
    for k, lo, hi, under in brackets:
        mine = found
        if lo is not None:
            mine = mine[mine >= lo]
        if hi is not None:
            mine = mine[mine <= hi]
        if under <= k < under + mine.numel():
            out.append(float(mine.kthvalue(k - under + 1).values))
        else:
            out.append(float(x.kthvalue(k + 1).values))
    return out


def strided_sample(n: int, size: int) -> slice:
    """Every k-th of n positions, about `size` of them, k odd: on a flattened (B, T) tensor with T even an even k
    would read the same few positions of every rollout (position 0 of each, with T a multiple of k), and a fault
    at one position would skew the sample."""
    return slice(None, None, max(1, n // size) | 1)


def chi2_token_sum(l: torch.Tensor) -> torch.Tensor:
    """() the sum over every position of rho^2 - 1 (padding holds l = 0, which adds 0), by the formula
    Ratios.of(..., chi2=True) sums in its pass (`rho2_row_sums`), for a record made without it; on the CPU in
    blocks of rows, so no fresh (B, T) tensor pays its page faults."""
    B, T = l.shape
    return sum((rho2_row_sums(expm1(l[rows])).sum() for rows in row_blocks(B, T, l.device)),
               torch.zeros((), dtype=l.dtype, device=l.device))


def near_one(r: Ratios) -> dict[str, float]:
    """abs_ratio_mean and, for each band of RATIO_BANDS, tokens_in_<band> and rollouts_in_<band> (the module
    docstring), from one pass over l in blocks of rows. Padding holds l = 0: it adds exp|0| - 1 = 0 to the sum
    of exp|l| - 1, and lies inside every band (each holds ratio 1), so its count comes off the tokens inside."""
    B, T = r.mask.shape
    l, dev = r.log_ratio, r.mask.device  # (B, T)
    log_edges = [(log_of(lo), log_of(hi)) for lo, hi in RATIO_BANDS]
    excess = torch.zeros((), dtype=r.dtype, device=dev)  # () sum of exp|l| - 1 over the loss tokens
    inside = torch.zeros(len(RATIO_BANDS), dtype=torch.int64, device=dev)  # (K,) positions inside each band
    for rows in row_blocks(B, T, dev):
        block = l[rows]  # (R, T)
        excess += expm1(block.abs().clamp_(max=MAX_LOG_WEIGHT)).sum()
        inside += torch.stack([in_log_band(block, lo, hi).sum() for lo, hi in log_edges])
    tol = r.edge_tolerance  # (B,) how far S_j / T_j may sit from its exact value
    accepted = torch.stack([(r.valid & in_band(r.geo_log_ratio, lo, hi, tol)).sum() for lo, hi in RATIO_BANDS])
    n_tokens, n_valid = int(r.n_tokens), int(r.valid.sum())
    tokens_in = (inside - (B * T - n_tokens)).tolist()  # the padding's positions off
    out = {"abs_ratio_mean": 1 + float(excess) / n_tokens if n_tokens else 0.0}
    for (lo, hi), k in zip(RATIO_BANDS, tokens_in, strict=True):
        out[f"tokens_in_{band_key(lo, hi)}"] = k / n_tokens if n_tokens else 0.0
    for (lo, hi), k in zip(RATIO_BANDS, accepted.tolist(), strict=True):
        out[f"rollouts_in_{band_key(lo, hi)}"] = k / n_valid if n_valid else 0.0
    return out


@torch.no_grad()
def diagnostics(batch: Batch, ratios: Ratios | None = None, *, percentile_sample: int | None = None
                ) -> dict[str, float]:
    """Mismatch statistics of a batch, independent of any estimator. percentile_sample: the p50 and p99 of |l|
    from the loss tokens among about that many positions at a fixed odd stride (a bounded cost; rank error about
    sqrt(q (1 - q) / n) for n loss tokens in it); None: exact."""
    if percentile_sample is not None and (isinstance(percentile_sample, bool) or not isinstance(
            percentile_sample, int) or percentile_sample < 1):
        raise ValueError(f"percentile_sample must be a positive number of positions or None, got "
                         f"{percentile_sample!r}")
    r = ratios if ratios is not None else Ratios.of(batch, extremes=True, chi2=True)  # both read in the one pass
    n_tok = r.n_tokens.clamp(min=1)
    valid = r.valid
    zero = torch.zeros((), dtype=r.dtype, device=r.mask.device)
    S = r.seq_log_ratio.clamp(max=MAX_LOG_WEIGHT)  # (B,)
    chi2_token = r.rho2_rowsum.sum() if r.rho2_rowsum is not None else chi2_token_sum(r.log_ratio)

    # ESS in log space: scale by the largest valid weight first, so it never overflows or divides by 0
    log_w = torch.where(valid, r.seq_log_ratio, torch.full_like(S, -torch.inf))
    w = torch.exp(log_w - log_w.max()) if valid.any() else torch.zeros_like(S)  # (B,) in (0, 1]
    n = valid.sum().clamp(min=1)
    ess = (w.sum() ** 2 / (n * (w**2).sum())) if valid.any() else zero

    n_tokens = int(r.n_tokens)
    flat = r.log_ratio.reshape(-1)  # (B * T,) padding holds l = 0, below every |l| of a loss token
    if r.row_max is not None:  # made with the log-ratios (Ratios.of(..., extremes=True)): no pass of its own
        abs_max = torch.maximum(r.row_max.max(), -r.row_min.min()) if n_tokens else None
    else:
        abs_max = flat.abs().max() if n_tokens else None  # (on the CPU faster than amax and amin, one pass each)
    if percentile_sample is not None and flat.numel() > percentile_sample:
        at = strided_sample(flat.numel(), percentile_sample)
        abs_l, below = flat[at][r.mask.reshape(-1)[at]].abs_(), 0  # (n,) the sampled positions' loss tokens
    elif flat.numel() <= _PERCENTILE_SAMPLE:
        abs_l = flat.abs()  # (B * T,)
        below = abs_l.numel() - n_tokens
    else:  # a batch this large is sampled (percentiles): its loss tokens alone
        abs_l, below = r.log_ratio[r.mask].abs_(), 0  # (n_tokens,)
    p50, p99 = percentiles(abs_l, (0.5, 0.99), below=below)
    return {
        "kl_k1": float(-r.seq_log_ratio.sum() / n_tok),
        "kl_k3": float(r.k3_rollout.sum() / n_tok),
        "chi2_token": float(chi2_token / n_tok),
        "chi2_seq": float(masked_mean(torch.expm1(2 * S), valid)),
        "ess_seq": float(ess),
        "ppl_ratio": float(masked_mean(torch.exp(-r.geo_log_ratio), valid)),
        **near_one(r),
        "abs_log_ratio_p50": p50,
        "abs_log_ratio_p99": p99,
        "abs_log_ratio_max": float(abs_max) if n_tokens else 0.0,
        "n_rollouts": int(valid.sum()),
        "n_tokens": n_tokens,
    }
