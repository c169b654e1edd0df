"""Pieces every estimator shares: log-ratios and their per-rollout sums (computed once per batch),
log-space bands and clips, masked means, the surrogate loss and the aggregation modes.

An estimator is a pure function `fn(r: Ratios, cfg) -> Correction`: it says only how its token weights
and masks differ. `seqis.run` turns the correction into a loss, metrics and per-rollout values.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property, partial

import numpy as np
import torch

from ..types import Batch, knob

# Every weight is exp(x) with x clamped at MAX_LOG_WEIGHT first: e^40 ~ 2.4e17 is finite in fp32 (and
# squares finitely too), and a summed log-ratio of +800 still gives a finite loss and gradient.
MAX_LOG_WEIGHT = 40.0

_K3_CAP = math.expm1(MAX_LOG_WEIGHT) - MAX_LOG_WEIGHT

AGGREGATIONS = ("token-mean", "kept-token-mean", "seq-mean-token-mean", "seq-mean-token-sum")


def band_low(default: float, what: str, ui: tuple[float, float] = (0.01, 1.0)):
    """The lower edge of a ratio band (inclusive; 0 opens it): `what` says what it bounds."""
    return knob(default, f"Lower edge of the band on {what}: below it the gradient is dropped (0 opens it).",
                ge=0.0, ui=ui, log=True)


def band_high(default: float, what: str, ui: tuple[float, float] = (1.0, 100.0)):
    """The upper edge of a ratio band (inclusive; inf opens it)."""
    return knob(default, f"Upper edge of the band on {what}: above it the gradient is dropped (inf opens it).",
                gt=0.0, ui=ui, log=True)


GEO = "the rollout's geometric ratio exp(S/T)"
TOKEN = "each token's ratio rho_t"


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


def cheap_to_ask(x: torch.Tensor) -> bool:
    """Whether reading a value of x back into Python is free (CPU) rather than a sync (GPU). The CPU paths
    ask such questions to skip whole passes (a cap no token needs, cleaning nothing needs, a dense mask
    for a few rows); the GPU paths run those passes instead."""
    return x.device.type == "cpu"


def in_band(x: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """low <= exp(x) <= high, inclusive, compared in log space."""
    ok = x.ge(log_of(low))
    ok &= x.le(log_of(high))
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


# A token rule that drops tokens in at most this share of the rollouts is kept in the sparse form (Correction.
# kept_rows) on the CPU: the loss and metrics stay per-rollout sums, and only those rows carry a (B, T) mask.
SPARSE_ROW_SHARE = 1 / 16


def rows_outside(x: torch.Tensor, low: float, high: float) -> torch.Tensor | None:
    """The indices of the rows of x (B, T) with a value outside [log low, log high], when they are few enough
    for the sparse form: two reductions, no (B, T) tensor. None when they are not, and on a GPU (where the
    question costs a sync and the dense passes are cheap)."""
    if not cheap_to_ask(x):
        return None
    hit = x.amax(-1) > log_of(high)  # amax and amin: one fast pass each (aminmax is not, on the CPU)
    hit |= x.amin(-1) < log_of(low)
    rows = hit.nonzero().squeeze(1)
    return rows if len(rows) <= SPARSE_ROW_SHARE * len(hit) else None


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


def _rows_loss(r: Ratios, row_coef: torch.Tensor, kept_rows: KeptRows | None) -> torch.Tensor:
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
    def forward(ctx, logp, r: Ratios, rows: tuple | None, G, rebuild):
        ctx.rows = rows is not None
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
        if not cheap_to_ask(grad) or grad.item() != 1.0:  # loss.backward() sends 1: skip that pass on CPU
            G.mul_(grad)
        return G, None, None, None, None


def surrogate_loss(logp: torch.Tensor, r: Ratios, row_coef: torch.Tensor | None = None,
                   kept_rows: KeptRows | None = None, G: torch.Tensor | None = None,
                   rebuild: Callable[[], torch.Tensor] | None = None) -> torch.Tensor:
    """The loss, differentiable in logp only: -sum_j row_coef_j * (sum of log pi over rollout j's kept
    loss tokens: all of them but in the rows of kept_rows), or sum(G * log pi) for a gradient G (B, T)
    that `rebuild()` can make again."""
    if not (logp.requires_grad and torch.is_grad_enabled()):  # the value alone: no node to record
        return _rows_loss(r, row_coef, kept_rows) if G is None else dot(G, r.logp)
    return _Surrogate.apply(logp, r, None if G is not None else (row_coef, kept_rows), G, rebuild)


def masked_mean(x: torch.Tensor, select: torch.Tensor) -> torch.Tensor:
    """Mean of x where select is True; 0.0 for an empty selection (never NaN)."""
    total = torch.where(select, x, 0.0).sum()
    return total / select.sum().clamp(min=1)


def capped_k3(log_ratio: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """k3 = rho - 1 - l per token (a new tensor) and its per-row sums, k3 capped at its value at l = 40 (k3
    grows with l, so that equals computing it on min(l, 40)). On the CPU the cap costs a pass only when a
    row sum says some token needs it (k3 >= 0: no token exceeds the cap unless its row's sum does); on a
    GPU it always runs."""
    k3 = expm1(log_ratio).sub_(log_ratio)
    rows = k3.sum(-1)
    if not cheap_to_ask(k3) or not bool((rows <= _K3_CAP).all()):
        rows = k3.clamp_(max=_K3_CAP).sum(-1)
    return k3, rows


@dataclass(eq=False)
class Ratios:
    """Log-ratios of one batch and everything derived from them that estimators share.

    Built once per batch (`Ratios.of`); several estimators evaluated on one batch reuse it.
    All tensors are detached and in the compute dtype; padding positions hold 0.
    """

    mask: torch.Tensor  # (B, T) bool, loss tokens
    mask_f: torch.Tensor  # (B, T) the loss mask as 0/1 floats, to multiply finite tensors by
    logp: torch.Tensor  # (B, T) log pi on loss tokens, 0 elsewhere (detached: the surrogate's value)
    log_ratio: torch.Tensor  # (B, T) l_t = log pi - log mu on loss tokens, 0 elsewhere

    @classmethod
    def of(cls, batch: Batch) -> Ratios:
        dtype = compute_dtype(batch.trainer_logprobs)
        mask_f = as_float(batch.loss_mask, dtype)  # (B, T)
        # padding may hold -inf or NaN: zero it in place on each new tensor (on the CPU a fresh (B, T)
        # allocation can cost more than the arithmetic: page faults)
        logp = batch.trainer_logprobs.detach().to(dtype).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0).mul_(mask_f)
        log_ratio = torch.addcmul(logp, batch.inference_logprobs.to(dtype), mask_f, value=-1)  # (B, T) logp - il * mask
        r = cls(batch.loss_mask, mask_f, logp, log_ratio)
        # inference logprobs that are not finite on padding (or on a loss token) leave inf or NaN behind: clean
        # them in place. On the CPU the per-rollout sums, needed anyway, say whether any is there; on a GPU
        # that question would cost a sync, so the cleaning pass always runs.
        if not cheap_to_ask(log_ratio) or not bool(torch.isfinite(r.seq_log_ratio).all()):
            log_ratio.nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0).mul_(mask_f)
            r.__dict__.pop("seq_log_ratio", None)  # a cached sum saw the uncleaned tensor
        return r

    @property
    def dtype(self) -> torch.dtype:
        return self.log_ratio.dtype

    @cached_property
    def logp_rowsum(self) -> torch.Tensor:  # (B,) sum of log pi over each rollout's loss tokens
        return self.logp.sum(-1)

    @cached_property
    def length(self) -> torch.Tensor:  # (B,) T_j as a float
        return self.mask_f.sum(-1)

    @cached_property
    def valid(self) -> torch.Tensor:  # (B,) T_j > 0
        return self.length > 0

    @cached_property
    def n_tokens(self) -> torch.Tensor:  # () loss tokens in the batch
        return self.length.sum()

    @cached_property
    def seq_log_ratio(self) -> torch.Tensor:  # (B,) S_j
        return self.log_ratio.sum(-1)

    @cached_property
    def geo_log_ratio(self) -> torch.Tensor:  # (B,) S_j / T_j, 0 for an empty rollout
        return self.seq_log_ratio / self.length.clamp(min=1)

    @cached_property
    def k3(self) -> torch.Tensor:  # (B, T) rho - 1 - l >= 0, the k3 estimate of KL(mu || pi); 0 off-mask
        k3, rollout = capped_k3(self.log_ratio)
        self.__dict__.setdefault("k3_rollout", rollout)
        return k3

    @cached_property
    def k3_rollout(self) -> torch.Tensor:  # (B,) sum of k3 over each rollout's loss tokens
        # the (B, T) k3 is kept only once somebody asks for it (a token-level estimator's kept share): a
        # temporary one frees its memory for the next (B, T) tensor, which then finds it in the cache
        return self.__dict__["k3"].sum(-1) if "k3" in self.__dict__ else capped_k3(self.log_ratio)[1]

    def k3_of(self, rows: torch.Tensor) -> torch.Tensor:  # (R, T) k3 of the given rollouts
        if "k3" in self.__dict__:  # (index_select, here and wherever rows are gathered: x[rows] is slower on CPU)
            return self.k3.index_select(0, rows)
        return capped_k3(self.log_ratio.index_select(0, rows))[0]

    @cached_property
    def k3_total(self) -> torch.Tensor:  # () sum of k3 over the batch's loss tokens
        return self.k3_rollout.sum()

    @cached_property
    def batch_metrics(self) -> dict[str, torch.Tensor]:
        """The metrics that do not depend on the estimator (seqis.estimators.dispatch), computed once per batch."""
        return {
            "mismatch_kl": self.k3_total / self.n_tokens.clamp(min=1),
            "seq_log_ratio": masked_mean(self.seq_log_ratio, self.valid),
            "geo_log_ratio": masked_mean(self.geo_log_ratio, self.valid),
        }


@dataclass(eq=False)
class Correction:
    """What an estimator function returns; run() turns it into a loss, metrics and per-rollout values.

    The weight on a token is given one of three ways (before adv_tau * A):
    seq_weights  (B,) one finite weight for all of a rollout's tokens (sequence-level estimators), or
    weights      (B, T) a finite weight per token, a tensor of its own (run() zeroes it in place), or
    neither      weight 1 on every kept token (pure filters).
    kept         (B, T) float, 1.0 on the loss tokens whose gradient survives and 0.0 elsewhere (padding
                 included), when a token-level rule drops some; run() may return it as the weights
    kept_len     (B,) the sum of kept over each rollout, when the estimator has it already
    accepted     (B,) bool rollout gate: kept = loss mask & accepted (when `kept` is not given); run()
                 makes the "traj_masked" mask of the rejected rollouts' loss tokens from it
                 With neither, every loss token is kept (a weight that underflows to 0 is not dropped).
    kept_rows    (rows (R,), kept (R, T) 0/1 floats): the sparse form of a token rule that drops loss tokens in
                 only a few rollouts (rows_outside): their kept masks; every other rollout keeps all its loss
                 tokens. The rest of the correction stays per-rollout (seq_weights, accepted), so the loss
                 needs no (B, T) tensor in the forward. Never with weights or kept.
    clipped      (B,) bool, the rollouts whose sequence weight was truncated
    masks        its own (B, T) bool masks ("clipped", "token_masked", "traj_masked", ...), each a tensor
                 or a function that builds it (called only if somebody reads the mask: seqis.types.Masks)
    metrics      its own metrics (beyond the common ones run() computes for everyone)
    """

    seq_weights: torch.Tensor | None = None
    weights: torch.Tensor | None = None
    kept: torch.Tensor | None = None
    kept_len: torch.Tensor | None = None
    accepted: torch.Tensor | None = None
    kept_rows: KeptRows | None = None
    clipped: torch.Tensor | None = None
    masks: dict[str, torch.Tensor | Callable[[], torch.Tensor]] = field(default_factory=dict)
    metrics: dict[str, torch.Tensor] = field(default_factory=dict)


def gated(gate: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """x where gate is True, else 0 (a select, never a multiply: 0 * inf is NaN)."""
    return torch.where(gate, x, 0.0)


def seq_weight_metric(r: Ratios, seq_weight: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
    """seq_weight: mean applied sequence weight over valid rollouts that keep their gradient."""
    return masked_mean(seq_weight, r.valid & kept)


def clipped_metric(r: Ratios, clipped: torch.Tensor) -> torch.Tensor:
    """is_clipped: fraction of valid rollouts whose weight was truncated."""
    return masked_mean(clipped.to(r.dtype), r.valid)


def token_scale(r: Ratios, n_kept: torch.Tensor, agg: str) -> torch.Tensor:
    """The normaliser each aggregation applies: a () or (B, 1) factor s with loss = -sum(s * coef * logp)."""
    if agg == "token-mean":  # N = every loss token, dropped ones included (prime-rl)
        return r.n_tokens.clamp(min=1).reciprocal()
    if agg == "kept-token-mean":  # N = kept tokens only
        return n_kept.clamp(min=1).reciprocal()
    n_seq = r.valid.sum().clamp(min=1).to(r.dtype)
    if agg == "seq-mean-token-mean":
        return (r.length.clamp(min=1) * n_seq).reciprocal()[:, None]
    if agg == "seq-mean-token-sum":
        return n_seq.reciprocal()
    raise ValueError(f"agg must be one of {AGGREGATIONS}, got {agg!r}")
