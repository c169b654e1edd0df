"""The fast paths, in one place: exp2 for exp, 0/1 float masks through uint8 (bool ops are slow paths on the
CPU), row maxima instead of (B, T) masks, sparse rows for token filters that touch few rollouts, and the
surrogate loss as one autograd node. Each function states the plain formula it computes; the formulas
(evaluate.py) call these and never fork on speed themselves.

`shortcuts` (an argument, held by Ratios): whether reading a value back into Python is free (the CPU) so a
data-dependent question may skip a whole pass; on a GPU that question costs a sync and the pass runs instead.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial

import numpy as np
import torch

# Every weight is exp(x) with x clamped at MAX_LOG_WEIGHT first: e^40 ~ 2.4e17 is finite in fp32 (and
# squares finitely too), and a summed log-ratio of +800 still gives a finite loss and gradient.
MAX_LOG_WEIGHT = 40.0

def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """fp16 / bf16 inputs are computed in float32; float64 stays float64."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def log_of(x: float) -> float:
    """log of a knob value: log 0 = -inf, log inf = inf."""
    return -math.inf if x == 0 else math.log(x)


LOG2_E = 1 / math.log(2)


def capped_exp(x: torch.Tensor, clip: float = math.inf) -> torch.Tensor:
    """min(exp(x), clip, e^40), computed as 2^(log2(e) * min(x, log clip, 40)) in a new tensor.

    On the CPU torch.exp goes through MKL's VML, which is slow on some CPUs (AMD's); exp2 has a SIMD
    kernel everywhere, about four times faster there. Rounding the product costs a relative error of at
    most 40 * 2^-24 (2.4e-6, at the cap) in float32, 40 * 2^-53 in float64."""
    return x.clamp(max=min(log_of(clip), MAX_LOG_WEIGHT)).mul_(LOG2_E).exp2_()  # clamp makes a copy


def exp_of(x: torch.Tensor) -> torch.Tensor:
    """exp(x) as 2^(log2(e) x), a new tensor: exp2's SIMD kernel, not MKL's VML exp (slow on some CPUs); a
    relative error of at most |x| 2^-24 in float32."""
    return x.mul(LOG2_E).exp2_()


def expm1(x: torch.Tensor) -> torch.Tensor:
    """exp(x) - 1, accurate near 0, as a new tensor.

    On the CPU, torch.expm1 calls MKL's VML, which on many CPUs takes a generic path 4-20 times slower than
    numpy's SIMD expm1 (within an ulp of the exact value). CPU float32 / float64 tensors therefore always go
    through numpy: one fixed path, so two processes give bitwise-identical results for the same batch."""
    if x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64) and not x.requires_grad:
        out = torch.empty(x.shape, dtype=x.dtype)
        with np.errstate(over="ignore"):  # overflow gives inf, as torch's does, without a warning
            np.expm1(x.contiguous().numpy(), out=out.numpy())
        return out
    return torch.expm1(x)


def shortcuts_for(x: torch.Tensor) -> bool:
    """The default shortcut policy: on for CPU tensors (a value read back is free), off elsewhere."""
    return x.device.type == "cpu"


def in_band(x: torch.Tensor, low: float, high: float, tol: torch.Tensor | float = 0.0) -> torch.Tensor:
    """low <= exp(x) <= high, inclusive, compared in log space; an x within tol of an edge counts as on it."""
    ok = x.ge(log_of(low) - tol)
    ok &= x.le(log_of(high) + tol)
    return ok


def band_f(x: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """1.0 where low <= exp(x) <= high, else 0.0, as a new float tensor (x finite): clamp and compare in
    place. On the CPU a comparison that writes a bool tensor is a slow path; this is not."""
    return x.clamp(log_of(low), log_of(high)).eq_(x)


def outside_f(x: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """1.0 where exp(x) lies outside [low, high], else 0.0, as a new float tensor (x finite)."""
    return x.clamp(log_of(low), log_of(high)).ne_(x)


def tokens_of(mask: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """(B, T) bool mask, (B,) bool gate -> the mask's tokens in the rows where gate is True (through uint8:
    a broadcast bool `&` is a slow path on CPU)."""
    return (mask.view(torch.uint8) & gate.view(torch.uint8)[:, None]).view(torch.bool)


def outside_band(mask: torch.Tensor, x: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """(B, T) bool: the mask's tokens where exp(x) lies outside [low, high] (x finite)."""
    return mask & outside_f(x, low, high).bool()


# A token filter that drops tokens in at most this share of the rollouts is kept in the sparse form (its rows'
# kept masks only) when shortcuts are on: the loss and metrics stay per-rollout sums.
SPARSE_ROW_SHARE = 1 / 16


def rows_outside(x: torch.Tensor, low: float, high: float, share: float) -> torch.Tensor:
    """The indices of the rows of x (B, T) with a value outside [log low, log high], when at most `share` of
    the rows have one: two reductions, no (B, T) tensor. None when more do."""
    hit = x.amax(-1) > log_of(high)  # amax and amin: one fast pass each (aminmax is not, on the CPU)
    hit |= x.amin(-1) < log_of(low)
    rows = hit.nonzero().squeeze(1)
    return rows if len(rows) <= share * len(hit) else None


KeptRows = tuple[torch.Tensor, torch.Tensor]  # (R,) row indices, (R, T) their kept masks as 0/1 floats


def row_sums(full: torch.Tensor, kept_rows: KeptRows | None,
             of_rows: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
    """(B,) sums over each rollout's kept loss tokens of x, given `full` (its sums over all its loss tokens)
    and of_rows(rows), x in the rows of kept_rows (R, T); without of_rows, x = 1 (kept-token counts)."""
    if kept_rows is None:
        return full
    rows, kept = kept_rows
    if len(rows) == 0:
        return full
    sums = kept.sum(-1) if of_rows is None else (of_rows(rows) * kept).sum(-1)
    return full.index_copy(0, rows, sums)


def spread(row_values: torch.Tensor, mask_f: torch.Tensor, kept_rows: KeptRows | None) -> torch.Tensor:
    """(B, T): row_values_j on each of rollout j's kept loss tokens (all of them but in the rows of
    kept_rows, which keep their own), 0 elsewhere."""
    out = row_values[:, None] * mask_f
    if kept_rows is not None:
        rows, kept = kept_rows
        out.index_copy_(0, rows, row_values[rows, None] * kept)
    return out


def band_filter(x: torch.Tensor, mask_f: torch.Tensor, low: float, high: float, *, shortcuts: bool,
                share: float = SPARSE_ROW_SHARE):
    """The loss tokens with low <= exp(x) <= high, in whichever form is cheaper:
    ("sparse", rows (R,), keep (R, T) 0/1 floats of those rows): every other row keeps all its loss tokens
    (when shortcuts are on and few rows have a token outside), or ("dense", None, keep (B, T) 0/1 floats).
    Either way keep is 1.0 on kept loss tokens and 0.0 elsewhere, padding included (x finite, 0 on padding)."""
    rows = rows_outside(x, low, high, share) if shortcuts else None
    if rows is not None:
        mask_rows = mask_f.index_select(0, rows)  # (R, T)
        return "sparse", rows, band_f(x.index_select(0, rows), low, high).mul_(mask_rows)
    return "dense", None, band_f(x, low, high).mul_(mask_f)


def above(x: torch.Tensor, c: float) -> torch.Tensor:
    """x > c as a bool tensor (x finite), through the fast float path of band_f."""
    return x.clamp(max=c).ne_(x).bool()


def above_on(mask: torch.Tensor, x: torch.Tensor, c: float) -> torch.Tensor:
    """(B, T) bool: the mask's tokens where x > c (x finite)."""
    return mask & above(x, c)


def rows_above(x: torch.Tensor, mask: torch.Tensor, c: float) -> torch.Tensor:
    """(B,) bool: the rows with a loss token where x > c, for an x that off the mask holds 0 or repeats a
    value of the row's loss tokens (log-ratios, their prefix sums). Then for c >= 0 (a clip at or above
    ratio 1) one max per row answers, with no (B, T) mask; below that the mask is built."""
    if c >= 0:
        return x.amax(-1) > c if x.shape[-1] else torch.zeros(x.shape[:-1], dtype=torch.bool, device=x.device)
    return any_per_row(above_on(mask, x, c))


def any_per_row(mask: torch.Tensor) -> torch.Tensor:
    """(B, T) bool -> (B,) bool, any over T (a uint8 max: bool reductions are slow on CPU)."""
    if mask.shape[-1] == 0:
        return torch.zeros(mask.shape[:-1], dtype=torch.bool, device=mask.device)
    return mask.view(torch.uint8).amax(-1) > 0


def dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """sum(a * b) over two same-shaped tensors, without a temporary (a BLAS dot); differentiable."""
    return torch.dot(a.reshape(-1), b.reshape(-1))


def as_float(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A bool mask as 0/1 floats (through uint8: bool -> float is a slow path on CPU)."""
    return mask.view(torch.uint8).to(dtype)


def _rows_loss(r, row_coef: torch.Tensor, kept_rows: KeptRows | None) -> torch.Tensor:
    """-sum_j row_coef_j * (sum of the detached log pi over rollout j's kept loss tokens)."""
    return -(row_coef * row_sums(r.logp_rowsum, kept_rows, partial(r.logp.index_select, 0))).sum()


class _Surrogate(torch.autograd.Function):
    """The surrogate loss as one autograd node, in one of two forms.

    rows:     loss = -sum_j row_coef_j * row_logp_j, where row_logp_j sums the detached, padding-free
              log pi over rollout j's kept loss tokens (every kept token of a rollout has one
              coefficient): the forward is a (B,) dot; the backward writes -row_coef_j on the kept tokens
              in one pass (`spread`; kept = all loss tokens but in the few rows of kept_rows).
    gradient: loss = sum_jt G_jt * log pi_jt, where G (B, T) is d loss / d log pi, already built (0 off
              the loss mask): the forward is a dot, and the first backward hands G out scaled in place
              (no second (B, T) tensor); a second backward (retain_graph=True) asks `rebuild` for a new G.
    `logp` (the batch's trainer_logprobs in the compute dtype) is only the graph's input."""

    @staticmethod
    def forward(ctx, logp, r, rows: tuple | None, G, rebuild):
        ctx.rows, ctx.shortcuts = rows is not None, r.shortcuts
        if ctx.rows:
            row_coef, kept_rows = rows
            ctx.kept_rows = kept_rows
            ctx.save_for_backward(r.mask_f, row_coef)
            return _rows_loss(r, row_coef, kept_rows)
        ctx.G, ctx.rebuild = G, rebuild
        return dot(G, r.logp)

    @staticmethod
    def backward(ctx, grad):
        if ctx.rows:
            mask_f, row_coef = ctx.saved_tensors
            return spread(row_coef * -grad, mask_f, ctx.kept_rows), None, None, None, None
        G, ctx.G = ctx.G, None
        if G is None:  # backpropagated before (retain_graph=True), and that G was handed out
            G = ctx.rebuild()
        if not ctx.shortcuts or grad.item() != 1.0:  # loss.backward() sends 1: skip that pass on CPU
            G.mul_(grad)
        return G, None, None, None, None


def surrogate_loss(logp: torch.Tensor, r, row_coef: torch.Tensor | None = None,
                   kept_rows: KeptRows | None = None, G: torch.Tensor | None = None,
                   rebuild: Callable[[], torch.Tensor] | None = None) -> torch.Tensor:
    """The loss, differentiable in logp only: -sum_j row_coef_j * (sum of log pi over rollout j's kept
    loss tokens: all of them but in the rows of kept_rows), or sum(G * log pi) for a gradient G (B, T)
    that `rebuild()` can make again."""
    if not (logp.requires_grad and torch.is_grad_enabled()):  # the value alone: no node to record
        return _rows_loss(r, row_coef, kept_rows) if G is None else dot(G, r.logp)
    return _Surrogate.apply(logp, r, None if G is not None else (row_coef, kept_rows), G, rebuild)


class _Known(torch.autograd.Function):
    """A term whose value and gradient in logp are already computed (a penalty on l = logp - log mu, whose
    d / d logp is f'(l)): one node, no graph of elementwise ops behind it."""

    @staticmethod
    def forward(ctx, logp, value, grad):
        ctx.grad = grad
        return value

    @staticmethod
    def backward(ctx, g):
        return ctx.grad * g, None, None


def known_term(logp: torch.Tensor, value: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """value, with d value / d logp = grad (B, T), when logp is differentiated; else the value alone."""
    if not (logp.requires_grad and torch.is_grad_enabled()):
        return value
    return _Known.apply(logp, value, grad)


def masked_mean(x: torch.Tensor, select: torch.Tensor) -> torch.Tensor:
    """Mean of x where select is True; 0.0 for an empty selection (never NaN)."""
    total = torch.where(select, x, 0.0).sum()
    return total / select.sum().clamp(min=1)




def gated(gate: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """x where gate is True, else 0 (a select, never a multiply: 0 * inf is NaN)."""
    return torch.where(gate, x, 0.0)


def k3_of(log_ratio: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """k3 = rho - 1 - l per token (a new tensor, exact up to the dtype's overflow: inf past l = 88.7 in float32)
    and its per-row sums."""
    k3 = expm1(log_ratio).sub_(log_ratio)
    return k3, k3.sum(-1)
