"""The fast evaluator's primitives (seqis/evaluators/fast.py and its rules.py, rows.py, outputs.py): exp2 for exp,
0/1 float masks through uint8 (bool ops are slow paths on the CPU), row maxima instead of (B, T) masks, products
summed in blocks of rows, and the surrogate loss as one autograd node. Each function states the plain formula it
computes; every k3 the evaluator reads comes from one formula (k3_of: expm1(l) - l), so a row's pieces add up to
its whole.

`shortcuts` (an argument, held by Ratios): whether reading a value back into Python is free (the CPU) so a
data-dependent question may skip a whole pass; on a GPU that question costs a sync and the pass runs instead.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from ..core.ratios import MAX_LOG_WEIGHT
from .plain import log_of

LOG2_E = 1 / math.log(2)


def capped_exp(x: torch.Tensor, clip: float = math.inf, exact: bool = False) -> torch.Tensor:
    """min(exp(x), clip, e^40), computed as 2^(log2(e) * min(x, log clip, 40)) in a new tensor (exact:
    torch.exp of it, the frameworks' own exp, for a weight whose band is decided in ratio space: a token kept on
    the edge then weighs what the framework's does, to the bit).

    On the CPU torch.exp goes through MKL's VML, which is slow on some CPUs (AMD's); exp2 has a SIMD
    kernel everywhere, about four times faster there. Rounding the product costs a relative error of at
    most 40 * 2^-24 (2.4e-6, at the cap) in float32, 40 * 2^-53 in float64."""
    capped = x.clamp(max=min(log_of(clip), MAX_LOG_WEIGHT))  # clamp makes a copy
    return capped.exp_() if exact else capped.mul_(LOG2_E).exp2_()


def in_band(x: torch.Tensor, low: float, high: float, tol: torch.Tensor | float = 0.0) -> torch.Tensor:
    """low <= exp(x) <= high, inclusive, compared in log space; an x within tol of an edge counts as on it."""
    return in_log_band(x, log_of(low), log_of(high), tol)


def in_log_band(x: torch.Tensor, lo: float, hi: float, tol: torch.Tensor | float = 0.0) -> torch.Tensor:
    """lo <= x <= hi for log-ratio edges lo, hi; an x within tol of an edge counts as on it."""
    ok = x.ge(lo - tol)
    ok &= x.le(hi + tol)
    return ok


def band_f(x: torch.Tensor, lo: float, hi: float) -> torch.Tensor:
    """1.0 where lo <= x <= hi (log-ratio edges), else 0.0, as a new float tensor (x finite): clamp and
    compare in place. On the CPU a comparison that writes a bool tensor is a slow path; this is not."""
    return x.clamp(lo, hi).eq_(x)


def tokens_of(mask: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """(B, T) bool mask, (B,) bool gate -> the mask's tokens in the rows where gate is True (through uint8:
    a broadcast bool `&` is a slow path on CPU)."""
    return (mask.view(torch.uint8) & gate.view(torch.uint8)[:, None]).view(torch.bool)


def outside_band(mask: torch.Tensor, x: torch.Tensor, lo: float, hi: float) -> torch.Tensor:
    """(B, T) bool: the mask's tokens where x lies outside [lo, hi] (log-ratio edges; x finite), through the fast
    float path of band_f."""
    return mask & x.clamp(lo, hi).ne_(x).bool()


def rows_outside(x_max: torch.Tensor, x_min: torch.Tensor, low: float, high: float, *,
                 strict: bool = False) -> torch.Tensor:
    """(B,) bool: the rows with a value outside [low, high], from the rows' maxima and minima (over every
    position: off the mask x holds 0 or a value of the row's loss tokens, so a row flagged by a padding 0 is
    only a row evaluated in full, never a row missed; a nan extreme flags its row too)."""
    if strict:  # an open band: a value on an edge is outside it
        out = ~(x_max < high)
        out |= ~(x_min > low)
        return out
    out = ~(x_max <= high)
    out |= ~(x_min >= low)
    return out


DOT_BLOCK = 1 << 16  # elements of a * b made at once by dot_rows on the CPU (256 KiB in float32)


def dot_rows(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(B,) sum over T of a * b, for two (B, T) tensors; on the CPU in blocks of rows, so the product never
    takes a fresh (B, T) allocation (whose page faults cost more than the arithmetic)."""
    rows = max(1, DOT_BLOCK // max(1, a.shape[-1]))
    if a.device.type != "cpu" or a.shape[0] <= rows:
        return (a * b).sum(-1)
    return torch.cat([(x * y).sum(-1) for x, y in zip(a.split(rows), b.split(rows))])


def band_keep(x: torch.Tensor, mask_f: torch.Tensor, lo: float, hi: float) -> torch.Tensor:
    """(B, T) 0/1 floats: the loss tokens with lo <= x <= hi (log-ratio edges; x finite, 0 on padding)."""
    return band_f(x, lo, hi).mul_(mask_f)


def any_per_row(mask: torch.Tensor) -> torch.Tensor:
    """(B, T) bool -> (B,) bool, any over T (a uint8 max: bool reductions are slow on CPU)."""
    if mask.shape[-1] == 0:
        return torch.zeros(mask.shape[:-1], dtype=torch.bool, device=mask.device)
    return mask.view(torch.uint8).amax(-1) > 0


class SharedGradient:
    """A (B, T) gradient, built in the forward, that the loss nodes of identical corrections hand out (run_many
    computes a correction once for every key that names it): a node's first backward takes a copy while other
    nodes still wait for theirs, and the last one takes the tensor itself; a node backpropagated again
    (retain_graph=True) gets a new one from `rebuild`."""

    def __init__(self, G: torch.Tensor, rebuild: Callable[[], torch.Tensor], users: int = 1):
        self.G, self.rebuild, self.waiting = G, rebuild, users

    def take(self, first: bool) -> torch.Tensor:
        if not first or self.G is None:
            return self.rebuild()
        self.waiting -= 1
        if self.waiting > 0:
            return self.G.clone()
        G, self.G = self.G, None
        return G


def scaled(G: torch.Tensor, g: torch.Tensor, shortcuts: bool) -> torch.Tensor:
    """G * g in place, for the 0-d gradient g a node receives (loss.backward() sends 1: skipped on the CPU)."""
    return G if shortcuts and g.item() == 1.0 else G.mul_(g)


class _Known(torch.autograd.Function):
    """A loss whose value and gradient in logp our own code computes: one autograd node, no graph of elementwise
    ops behind it. Its backward asks gradient(first, g) for a new (B, T) tensor, d loss / d logp times the 0-d
    incoming g (first: this node's first backward). `logp` (the batch's trainer_logprobs in the compute dtype)
    is only the graph's input."""

    @staticmethod
    def forward(ctx, logp, value, gradient):
        ctx.gradient, ctx.first = gradient, True
        return value.clone()

    @staticmethod
    def backward(ctx, g):
        first, ctx.first = ctx.first, False
        return ctx.gradient(first, g), None, None


def known_losses(logp: torch.Tensor, value: torch.Tensor, gradient: Callable[[bool, torch.Tensor], torch.Tensor],
                 n: int = 1) -> list[torch.Tensor]:
    """n loss tensors of this value, each its own node with d loss / d logp from gradient(first, g) (see _Known),
    when logp is differentiated; else the value alone."""
    if not (logp.requires_grad and torch.is_grad_enabled()):
        return [value] * n
    return [_Known.apply(logp, value, gradient) for _ in range(n)]


def masked_mean(x: torch.Tensor, select: torch.Tensor) -> torch.Tensor:
    """Mean of x where select is True; 0.0 for an empty selection (never NaN)."""
    total = torch.where(select, x, 0.0).sum()
    return total / select.sum().clamp(min=1)


def gated(gate: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """x where gate is True, else 0 (a select, never a multiply: 0 * inf is NaN)."""
    return torch.where(gate, x, 0.0)


