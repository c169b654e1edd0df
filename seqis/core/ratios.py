"""A batch's shared per-token pieces: its log-ratios l = log pi - log mu on the loss tokens and their per-rollout
sums, made in one pass (`Ratios.of`), a frozen record any module may read without importing an evaluator.

The pass runs over blocks of rows on the CPU (about 1 MiB each, so its temporaries are reused rather than
page-faulted in) and over the whole batch on a GPU. The primitives it needs live here too, each with the formula it
computes; the evaluators' other primitives (seqis/evaluators/kernels.py) build on them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import partial

import numpy as np
import torch

from .types import Batch, row_blocks

MAX_LOG_WEIGHT = 40.0  # every weight is at most e^40 (finite in float32, and so is its square)


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """fp16 / bf16 / fp32 inputs are computed in float32; float64 stays float64."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def expm1(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """exp(x) - 1, accurate near 0, as a new tensor (or into `out`, contiguous, of x's shape and dtype).

    On the CPU, torch.expm1 calls MKL's VML, which on many CPUs takes a generic path 4-20 times slower than
    numpy's SIMD expm1 (within an ulp of the exact value). CPU float32 / float64 tensors therefore always go
    through numpy: one fixed path, so two processes give bitwise-identical results for the same batch."""
    if x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64) and not x.requires_grad:
        out = torch.empty(x.shape, dtype=x.dtype) if out is None else out
        with np.errstate(over="ignore"):  # overflow gives inf, as torch's does, without a warning
            np.expm1(x.contiguous().numpy(), out=out.numpy())
        return out
    return torch.expm1(x, out=out) if out is not None else torch.expm1(x)


def shortcuts_for(x: torch.Tensor) -> bool:
    """The default shortcut policy: on for CPU tensors (a value read back is free), off elsewhere."""
    return x.device.type == "cpu"


# Token rules (and a token weight's truncation or band) that touch at most this share of the rollouts are kept in
# the sparse form when shortcuts are on: only those rows get their own (R, T) kept masks and weights; every other
# row keeps all its loss tokens, weighed by a per-batch profile that several corrections share.
SPARSE_ROW_SHARE = 1 / 2

def row_extremes(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(B,) maxima and minima of x (B, T) over T (amax and amin: one fast pass each, aminmax is not on the CPU)."""
    if x.shape[-1] == 0:
        empty = x.new_zeros(x.shape[:-1])
        return empty, empty
    return x.amax(-1), x.amin(-1)


def dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """sum(a * b) over two same-shaped tensors, without a temporary (a BLAS dot); differentiable."""
    return torch.dot(a.reshape(-1), b.reshape(-1))


def as_dtype(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x in dtype: x itself when it already is (a .to() call costs a dispatch even then)."""
    return x if x.dtype == dtype else x.to(dtype)


def as_float(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A bool mask as 0/1 floats (through uint8: bool -> float is a slow path on CPU)."""
    return mask.view(torch.uint8).to(dtype)


def k3_row_sums(log_ratio: torch.Tensor) -> torch.Tensor:
    """(B,) sum over T of k3 = rho - 1 - l, made in blocks of rows (no (B, T) temporary on the CPU)."""
    B, T = log_ratio.shape
    return torch.cat([k3_of(log_ratio[rows])[1] for rows in row_blocks(B, T, log_ratio.device)])


RHO_M1_CAP = math.expm1(20.0)  # rho - 1 at l = MAX_LOG_WEIGHT / 2: rho^2 stays finite

def rho2_row_sums(e: torch.Tensor, scratch: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """(B,) each row's sum of rho^2 - 1 = e (e + 2), from e = rho - 1 = expm1(l) (B, T) (0 on padding), e capped
    at RHO_M1_CAP (l at 20, as diagnostics caps it); scratch: two (B, T) tensors to write into (a block's
    buffers that are free by then)."""
    a, b = scratch if scratch is not None else (None, None)
    c = torch.clamp(e, max=RHO_M1_CAP, out=a)  # (B, T) capped rho - 1
    return torch.add(c, 2.0, out=b).mul_(c).sum(-1)  # capped (rho + 1) (rho - 1)


def rho2_row_sums_by_norm(e: torch.Tensor) -> torch.Tensor:
    """rho2_row_sums(e) as |e|^2 + 2 sum e per row: two reductions that read e once each, against a clamp, an add,
    a product and a sum (60 -> 20 us a 64 x 4096 block). A row whose norm passes RHO_M1_CAP (so that an e in it
    may: the cap applies) takes rho2_row_sums. Asks whether any row does (a sync): the CPU's form."""
    norm = torch.linalg.vector_norm(e, dim=-1)  # (B,)
    capped = ~(norm <= RHO_M1_CAP)  # (B,) inf and NaN too
    out = norm.square().add_(e.sum(-1), alpha=2.0)
    if bool(capped.any()):
        rows = capped.nonzero().squeeze(1)
        out.index_copy_(0, rows, rho2_row_sums(e.index_select(0, rows)))
    return out


def k3_of(log_ratio: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """k3 = rho - 1 - l per token (a new tensor, exact up to the dtype's overflow: inf past l = 88.7 in float32)
    and its per-row sums."""
    k3 = expm1(log_ratio).sub_(log_ratio)
    return k3, k3.sum(-1)


def _l_block(tl: torch.Tensor, il: torch.Tensor, m: torch.Tensor, dtype: torch.dtype,
             bufs: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """(mask as 0/1, log pi, l) of one block of rows (R, T), written into bufs: log pi cleaned (padding may hold
    -inf or NaN), then masked (0 * inf is NaN, so never masked first); l = log pi - log mu * mask, not finite
    where log mu is not on padding (the caller cleans those rows)."""
    mf = bufs[0].copy_(m.view(torch.uint8))
    logp = torch.nan_to_num(as_dtype(tl, dtype), 0.0, 0.0, 0.0, out=bufs[1]).mul_(mf)
    return mf, logp, torch.addcmul(logp, as_dtype(il, dtype), mf, value=-1, out=bufs[2])


def log_ratios(tl: torch.Tensor, il: torch.Tensor, m: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(B, T) l = log pi - log mu on the loss tokens, 0 elsewhere: the values Ratios.of makes, block by block
    (for a record made without its (B, T) l, when a reader asks for it)."""
    B, T = m.shape
    l = torch.empty((B, T), dtype=dtype, device=m.device)
    blocks = row_blocks(B, T, m.device)
    R = max((b.stop - b.start for b in blocks), default=0)
    mf_, logp_ = (torch.empty((R, T), dtype=dtype, device=m.device) for _ in range(2))
    for rows in blocks:
        n = rows.stop - rows.start
        mf, _, lr = _l_block(tl[rows], il[rows], m[rows], dtype, (mf_[:n], logp_[:n], l[rows]))
        lr.nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0).mul_(mf)  # log mu not finite on padding: cleaned
    return l


# ---------------------------------------------------------------------------------------------------------
# the record


@dataclass(frozen=True, eq=False)
class Ratios:
    """Log-ratios of one batch and their per-rollout sums, in the compute dtype, detached; 0 off the loss mask.

    `Ratios.of(batch)` makes one; a caller that evaluates several calls on one batch passes it to run_many.
    `clamped(c)` and `rows(index)` give records of their own (a clamped copy shares every tensor it can).
    The loss mask as floats and the cleaned log pi (B, T) are made only by the compositions that need them
    (`Cache.mask_f`, `Cache.logp`): the rows form does not."""

    mask: torch.Tensor  # (B, T) bool, loss tokens
    # (B, T) l_t (clamped to [-clamp, clamp] in a clamped copy) and l_t before any clamp (probabilities come from
    # it); None when the record was made without them (Ratios.of(..., tokens=False)): `log_ratio` and
    # `unclamped_log_ratio` make them when first read
    l_tokens: torch.Tensor | None
    l_unclamped: torch.Tensor | None
    trainer_logprobs: torch.Tensor  # (B, T) log pi as given (detached; padding may hold anything)
    inference_logprobs: torch.Tensor  # (B, T) log mu as given
    advantages: torch.Tensor  # (B,) or (B, T) the batch's advantages, as given (for sign conditions)
    length: torch.Tensor  # (B,) T_j as a float
    seq_log_ratio: torch.Tensor  # (B,) S_j
    logp_rowsum: torch.Tensor  # (B,) sum of log pi over each rollout's loss tokens
    k3_rollout: torch.Tensor  # (B,) sum of k3 = rho - 1 - l over each rollout's loss tokens
    k3: torch.Tensor | None = None  # (B, T) k3 per token, when it was asked for (Ratios.of(..., k3=True))
    clamp: float | None = None  # the clamp of a clamped copy
    shortcuts: bool = True  # whether a value may be read back to skip a pass (the CPU)
    sparse_share: float = SPARSE_ROW_SHARE  # a token-level part touching at most this share of rows goes sparse
    # clamp order "aggregate" (SkyRL, slime): a rollout's sum / mean ratio rule reads the unclamped record's
    # aggregate, clamped to [-c, c] (set on the record a composition's criteria see; see aggregate_view)
    raw: Ratios | None = None
    aggregate_clamp: float | None = None
    # (B,) each row's max and min of log_ratio over every position (padding's 0 included), when made with the
    # log-ratios (Ratios.of(..., extremes=True): while a block is in cache they cost little; a pass of their own
    # over a fresh (B, T) l costs two)
    row_max: torch.Tensor | None = None
    row_min: torch.Tensor | None = None
    # (B,) each row's sum of rho^2 - 1 (l capped at MAX_LOG_WEIGHT / 2), when made with the log-ratios
    # (Ratios.of(..., chi2=True): from the block's expm1(l) that k3 is made of; diagnostics' chi2_token reads it)
    rho2_rowsum: torch.Tensor | None = None
    # derived once, at construction (every output reads them: a few tensor operations each, made once)
    valid: torch.Tensor = field(init=False)  # (B,) bool, T_j > 0
    valid_f: torch.Tensor = field(init=False)  # (B,) the same as 0/1
    length_1: torch.Tensor = field(init=False)  # (B,) max(T_j, 1)
    n_tokens: torch.Tensor = field(init=False)  # () loss tokens in the batch
    n_valid: torch.Tensor = field(init=False)  # () valid rollouts, at least 1 (a divisor)
    geo_log_ratio: torch.Tensor = field(init=False)  # (B,) S_j / T_j, 0 for an empty rollout
    batch_metrics: dict = field(init=False)  # the metrics that do not depend on the correction

    def __post_init__(self):
        put = partial(object.__setattr__, self)
        put("valid", self.length > 0)
        put("valid_f", as_float(self.valid, self.dtype))
        put("length_1", self.length.clamp(min=1))
        put("n_tokens", self.length.sum())
        put("n_valid", self.valid_f.sum().clamp(min=1))
        put("geo_log_ratio", self.seq_log_ratio / self.length_1)
        put("batch_metrics", {"mismatch_kl": self.k3_rollout.sum() / self.n_tokens.clamp(min=1),
                              "seq_log_ratio": self.valid_mean(self.seq_log_ratio),
                              "geo_log_ratio": self.valid_mean(self.geo_log_ratio)})

    @property
    def log_ratio(self) -> torch.Tensor:
        """(B, T) l_t, 0 off the loss mask (clamped in a clamped copy), made now if the record was made without it."""
        if self.l_tokens is None:
            l = self.unclamped_log_ratio
            object.__setattr__(self, "l_tokens", l if self.clamp is None else l.clamp(-self.clamp, self.clamp))
        return self.l_tokens

    @property
    def unclamped_log_ratio(self) -> torch.Tensor:
        """(B, T) l_t before any clamp, 0 off the loss mask, made now if the record was made without it."""
        if self.l_unclamped is None:
            l = log_ratios(self.trainer_logprobs, self.inference_logprobs, self.mask, self.dtype)
            object.__setattr__(self, "l_unclamped", l)
            if self.l_tokens is None and self.clamp is None:
                object.__setattr__(self, "l_tokens", l)
        return self.l_unclamped

    def valid_mean(self, x: torch.Tensor) -> torch.Tensor:
        """() the mean of a finite (B,) x over valid rollouts (0.0 when there are none)."""
        return dot(x, self.valid_f) / self.n_valid

    @classmethod
    def of(cls, batch: Batch, *, shortcuts: bool | None = None, sparse_share: float = SPARSE_ROW_SHARE,
           k3: bool = False, extremes: bool = False, chi2: bool = False, tokens: bool = True) -> Ratios:
        """The batch's ratios, in one pass over the batch: torch operations in blocks of rows (row_blocks). Only l
        (B, T) (and k3 (B, T) with k3=True: run_many asks for it when a token-level composition will need its kept
        share) is made at full size; tokens=False: not even l (every reader of the record takes only per-rollout
        sums: a fresh (B, T) tensor's page faults saved; `log_ratio` makes it if read after all); extremes=True:
        each row's max and min of l too (run_many asks when a token rule on the ratio will read them); chi2=True:
        each row's sum of rho^2 - 1 (seqis.runs.monitor asks). shortcuts None: on for a CPU batch, off on a GPU
        (where asking a value costs a sync); the forms agree either way (tests run both)."""
        tl, il, m = batch.trainer_logprobs.detach(), batch.inference_logprobs, batch.loss_mask
        dtype = compute_dtype(tl)
        shortcuts = shortcuts_for(tl) if shortcuts is None else shortcuts
        B, T = m.shape
        tokens = tokens or k3
        l = torch.empty((B, T), dtype=dtype, device=m.device) if tokens else None
        k3_tokens = torch.empty((B, T), dtype=dtype, device=m.device) if k3 else None
        length, S, logp_sum, k3_sum = (torch.empty(B, dtype=dtype, device=m.device) for _ in range(4))
        row_max, row_min = (torch.empty(B, dtype=dtype, device=m.device) if extremes else None for _ in range(2))
        rho2_sum = torch.empty(B, dtype=dtype, device=m.device) if chi2 else None
        blocks = row_blocks(B, T, m.device)
        R = max((b.stop - b.start for b in blocks), default=0)
        mf_, logp_, k3_, l_ = (torch.empty((R, T), dtype=dtype, device=m.device) if i < 3 or not tokens else None
                               for i in range(4))  # reused per block
        for rows in blocks:
            n = rows.stop - rows.start
            mf, logp, lr = _l_block(tl[rows], il[rows], m[rows], dtype,
                                    (mf_[:n], logp_[:n], l[rows] if tokens else l_[:n]))  # (R, T) each
            S[rows], logp_sum[rows], length[rows] = lr.sum(-1), logp.sum(-1), mf.sum(-1)
            if not shortcuts:  # inference log-probs not finite on padding leave inf or NaN behind: cleaned
                lr.nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0).mul_(mf)
                S[rows] = lr.sum(-1)
            if extremes:
                row_max[rows], row_min[rows] = row_extremes(lr)
            k3_rows = k3_tokens[rows] if k3_tokens is not None else k3_[:n]
            e = expm1(lr, out=k3_rows)  # (R, T) rho - 1
            if chi2:  # by the norm where a value may be asked for; else into the block's free mask and log pi buffers
                rho2_sum[rows] = rho2_row_sums_by_norm(e) if shortcuts else rho2_row_sums(e, (logp_[:n], mf_[:n]))
            k3_sum[rows] = torch.sub(e, lr, out=k3_rows).sum(-1)
        if shortcuts and not bool(torch.isfinite(S).all()):  # the sums, needed anyway, say whether any is there
            bad = (~torch.isfinite(S)).nonzero().squeeze(1)  # (R,) the rows to clean, and their sums and k3 again
            lr = log_ratios(tl.index_select(0, bad), il.index_select(0, bad), m.index_select(0, bad), dtype)
            if l is not None:
                l.index_copy_(0, bad, lr)
            k3_rows = k3_of(lr)
            S.index_copy_(0, bad, lr.sum(-1))
            k3_sum.index_copy_(0, bad, k3_rows[1])
            if k3_tokens is not None:
                k3_tokens.index_copy_(0, bad, k3_rows[0])
            if extremes:
                bad_max, bad_min = row_extremes(lr)
                row_max.index_copy_(0, bad, bad_max)
                row_min.index_copy_(0, bad, bad_min)
            if chi2:
                rho2_sum.index_copy_(0, bad, rho2_row_sums(expm1(lr)))
        return cls(m, l, l, tl, il, batch.advantages, length, S, logp_sum, k3_sum, k3_tokens, None, shortcuts,
                   sparse_share, row_max=row_max, row_min=row_min, rho2_rowsum=rho2_sum)

    def clamped(self, c: float) -> Ratios:
        """The same batch with l clamped to [-c, c] (verl's SAFETY_BOUND), for a composition's criteria: this
        record itself when no loss token is outside (asked with shortcuts), else a clamped copy."""
        if self.row_max is not None:  # the rows' extremes answer without a pass
            if self.shortcuts and bool(self.row_max.max() <= c) and bool(self.row_min.min() >= -c):
                return self
        elif self.shortcuts and bool(self.log_ratio.amax() <= c) and bool(self.log_ratio.amin() >= -c):
            return self
        lc = self.log_ratio.clamp(-c, c)
        extremes = {} if self.row_max is None else {"row_max": self.row_max.clamp(-c, c),  # clamp is monotone
                                                    "row_min": self.row_min.clamp(-c, c)}
        return replace(self, l_tokens=lc, seq_log_ratio=lc.sum(-1), k3=None, k3_rollout=k3_row_sums(lc), clamp=c,
                       rho2_rowsum=None, **extremes)

    def aggregate_view(self, raw: Ratios, c: float) -> Ratios:
        """This (clamped) record, its rollout ratio rules reading raw's sums and means clamped to [-c, c]."""
        return replace(self, raw=raw, aggregate_clamp=c)

    def rows(self, rows: torch.Tensor) -> Ratios:
        """The given rollouts (R,) as a record of their own, with shortcuts off (evaluated in full: the few rows
        a sparse correction's token rules touch)."""
        take = lambda x: None if x is None else x.index_select(0, rows)
        adv = self.advantages if self.advantages.dim() == 0 else take(self.advantages)
        l = take(self.l_tokens)  # a record made without l: theirs made when read
        return Ratios(take(self.mask), l, l if self.l_unclamped is self.l_tokens else take(self.l_unclamped),
                      take(self.trainer_logprobs), take(self.inference_logprobs), adv, take(self.length),
                      take(self.seq_log_ratio), take(self.logp_rowsum), take(self.k3_rollout), take(self.k3),
                      self.clamp, False, self.sparse_share, row_max=take(self.row_max), row_min=take(self.row_min),
                      rho2_rowsum=take(self.rho2_rowsum))

    @property
    def dtype(self) -> torch.dtype:
        return self.length.dtype

    @property
    def edge_tolerance(self) -> torch.Tensor:
        """(B,) how far S_j / T_j may sit from its exact value: each l_t = log pi - log mu carries the rounding
        of both log-probs in the compute dtype (eps * |log p|), and the mean of those errors is bounded by
        eps * (|sum log pi| + |sum log mu|) / T_j. A geometric ratio that far from a band edge is on it, so
        every token at ratio 1.001 passes a band ending at 1.001 (the drift scenario). A sum S_j has T_j
        times this tolerance."""
        eps = torch.finfo(self.dtype).eps
        logq_rowsum = self.logp_rowsum - self.seq_log_ratio  # (B,) sum of log mu
        return (self.logp_rowsum.abs() + logq_rowsum.abs()).mul_(eps) / self.length_1
