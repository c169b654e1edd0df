"""What every correction shares: the batch's log-ratios and their per-rollout sums (`Ratios`, computed once per
batch), the record a composition evaluates to (`Correction`), the aggregation modes, and the knob helpers of
band edges.

A correction is a Composition (compose.py); evaluate.py turns it into a Correction on a Ratios, and
dispatch.py turns that into a loss, metrics and per-rollout values.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

import torch

from ..types import Batch, knob
from ._kernels import (  # noqa: F401  (masked_mean, gated: shared by the formulas)
    SPARSE_ROW_SHARE,
    KeptRows,
    Profile,
    as_float,
    compute_dtype,
    gated,
    k3_of,
    masked_mean,
    shortcuts_for,
)

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


@dataclass(eq=False)
class Ratios:
    """Log-ratios of one batch and everything derived from them that corrections share.

    Built once per batch (`Ratios.of`); several corrections evaluated on one batch reuse it.
    All tensors are detached and in the compute dtype; padding positions hold 0.
    """

    mask: torch.Tensor  # (B, T) bool, loss tokens
    mask_f: torch.Tensor  # (B, T) the loss mask as 0/1 floats, to multiply finite tensors by
    logp: torch.Tensor  # (B, T) log pi on loss tokens, 0 elsewhere (detached: the surrogate's value)
    log_ratio: torch.Tensor  # (B, T) l_t = log pi - log mu on loss tokens, 0 elsewhere
    advantages: torch.Tensor  # (B,) or (B, T) the batch's advantages, as given (for sign conditions)
    shortcuts: bool = True  # whether a value may be read back to skip a pass (the CPU; _kernels.py)
    sparse_share: float = SPARSE_ROW_SHARE  # a token filter touching at most this share of rows goes sparse
    # a token weight in the rows form, on a per-batch profile (evaluate._sparse): it pays when several
    # corrections share it; None: run_many decides (on for more than one composition)
    profiles: bool | None = None
    _memo: dict = field(default_factory=dict, repr=False)  # pieces several corrections share (memo())

    @classmethod
    def of(cls, batch: Batch, *, shortcuts: bool | None = None, sparse_share: float = SPARSE_ROW_SHARE,
           profiles: bool | None = None) -> Ratios:
        """The batch's ratios. shortcuts None: on for a CPU batch, off on a GPU (where asking a value costs a
        sync); the paths agree either way (tests run both)."""
        dtype = compute_dtype(batch.trainer_logprobs)
        mask_f = as_float(batch.loss_mask, dtype)  # (B, T)
        # padding may hold -inf or NaN: zero it in place on each new tensor (on the CPU a fresh (B, T)
        # allocation can cost more than the arithmetic: page faults)
        logp = batch.trainer_logprobs.detach().to(dtype).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0).mul_(mask_f)
        log_ratio = torch.addcmul(logp, batch.inference_logprobs.to(dtype), mask_f, value=-1)  # (B, T) logp - il * mask
        shortcuts = shortcuts_for(log_ratio) if shortcuts is None else shortcuts
        r = cls(batch.loss_mask, mask_f, logp, log_ratio, batch.advantages, shortcuts, sparse_share, profiles)
        # inference logprobs that are not finite on padding (or on a loss token) leave inf or NaN behind: clean
        # them in place. With shortcuts the per-rollout sums, needed anyway, say whether any is there; without,
        # the cleaning pass always runs.
        if not shortcuts or not bool(torch.isfinite(r.seq_log_ratio).all()):
            log_ratio.nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0).mul_(mask_f)
            r.__dict__.pop("seq_log_ratio", None)  # a cached sum saw the uncleaned tensor
        return r

    def memo(self, key, compute: Callable[[], torch.Tensor]):
        """compute(), made once per batch under key: a piece several corrections of one run_many share (a
        statistic, its per-rollout aggregate, a clamped copy)."""
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    def clamped(self, c: float) -> Ratios:
        """The same batch with l clamped to [-c, c] (verl's SAFETY_BOUND), for a composition's criteria: this
        Ratios itself when no loss token is outside (asked with shortcuts), else a clamped copy made once per c
        that shares everything else."""
        def compute():
            l = self.log_ratio
            if self.shortcuts and bool(l.amax() <= c) and bool(l.amin() >= -c):
                return self
            r = Ratios(self.mask, self.mask_f, self.logp, l.clamp(-c, c), self.advantages, self.shortcuts,
                       self.sparse_share, self.profiles)
            r.__dict__["unclamped_log_ratio"] = l
            return r

        return self.memo(("clamped", c), compute)

    def rows(self, rows: torch.Tensor) -> Ratios:
        """The given rollouts (R,) as a Ratios of their own, with shortcuts off (evaluated in full: the few rows a
        sparse correction's token rules touch)."""
        take = lambda x: x.index_select(0, rows)
        adv = self.advantages if self.advantages.dim() == 0 else take(self.advantages)
        r = Ratios(take(self.mask), take(self.mask_f), take(self.logp), take(self.log_ratio), adv, False,
                   self.sparse_share)
        if self.unclamped_log_ratio is not self.log_ratio:
            r.__dict__["unclamped_log_ratio"] = take(self.unclamped_log_ratio)
        return r

    @cached_property
    def unclamped_log_ratio(self) -> torch.Tensor:  # (B, T) l before any clamp (probabilities come from it)
        return self.log_ratio

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
    def edge_tolerance(self) -> torch.Tensor:
        """(B,) how far S_j / T_j may sit from its exact value: each l_t = log pi - log mu carries the rounding
        of both log-probs in the compute dtype (eps * |log p|), and the mean of those errors is bounded by
        eps * (|sum log pi| + |sum log mu|) / T_j. A geometric ratio that far from a band edge is on it, so
        every token at ratio 1.001 passes a band ending at 1.001 (the drift scenario). A sum S_j has T_j
        times this tolerance."""
        eps = torch.finfo(self.dtype).eps
        logq_rowsum = self.logp_rowsum - self.seq_log_ratio  # (B,) sum of log mu
        return (self.logp_rowsum.abs() + logq_rowsum.abs()).mul_(eps) / self.length.clamp(min=1)

    @cached_property
    def k3(self) -> torch.Tensor:  # (B, T) rho - 1 - l >= 0, the k3 estimate of KL(mu || pi); 0 off-mask
        k3, rollout = k3_of(self.log_ratio)
        self.__dict__.setdefault("k3_rollout", rollout)
        return k3

    @cached_property
    def k3_rollout(self) -> torch.Tensor:  # (B,) sum of k3 over each rollout's loss tokens
        # the (B, T) k3 is kept only once somebody asks for it (a token-level estimator's kept share): a
        # temporary one frees its memory for the next (B, T) tensor, which then finds it in the cache
        return self.__dict__["k3"].sum(-1) if "k3" in self.__dict__ else k3_of(self.log_ratio)[1]

    def k3_of(self, rows: torch.Tensor) -> torch.Tensor:  # (R, T) k3 of the given rollouts
        if "k3" in self.__dict__:  # (index_select, here and wherever rows are gathered: x[rows] is slower on CPU)
            return self.k3.index_select(0, rows)
        return k3_of(self.log_ratio.index_select(0, rows))[0]

    @cached_property
    def k3_total(self) -> torch.Tensor:  # () sum of k3 over the batch's loss tokens
        return self.k3_rollout.sum()

    @cached_property
    def batch_metrics(self) -> dict[str, torch.Tensor]:
        """The metrics that do not depend on the correction (dispatch.py), computed once per batch."""
        return {
            "mismatch_kl": self.k3_total / self.n_tokens.clamp(min=1),
            "seq_log_ratio": masked_mean(self.seq_log_ratio, self.valid),
            "geo_log_ratio": masked_mean(self.geo_log_ratio, self.valid),
        }


@dataclass(eq=False)
class Correction:
    """What a composition does to one batch (evaluate.py); dispatch.py turns it into the output. Two forms:

    rows    (keep and token_weights None): every kept token of rollout j weighs row_weight_j times the
            profile's value (a token weight shared per batch; None: 1); the kept tokens are the loss tokens of
            the rollouts `gate` accepts, except in the few rows of `kept_rows`, which carry their own kept masks
            and token weights (the sparse form of token rules and token weights). Loss and metrics are
            per-rollout sums: no (B, T) tensor of its own in the forward.
    tokens  (keep or token_weights set): keep (B, T) 0/1 floats, the kept loss tokens with the gate applied
            (None: the loss tokens of the gated rollouts), times token_weights (B, T) (None: 1) and row_weight.
            Both are the correction's own tensors: run() turns them into the gradient in place, and rebuilds
            the weights and kept mask from a fresh evaluation when they are read.

    row_weight  (B,) one finite weight per rollout (None: 1)
    gate        (B,) bool, the rollouts the rollout-level rules accept (None: every one); its rejects make the
                "traj_masked" mask
    kept_rows   rows form only: KeptRows (rows (R,), their (R, T) kept masks and token weights)
    profile     rows form only: Profile, the token weight on every other row (exp(l_t) untruncated)
    kept_len    (B,) kept tokens per rollout, when a token rule drops some (else run() counts them)
    clipped     (B,) bool, the rollouts whose weight was truncated (None: no truncation)
    masks       its own (B, T) bool masks ("clipped", "token_masked"), each a tensor or a function that builds
                it (called only if somebody reads the mask: seqis.types.Masks)
    metrics     its own metrics (beyond the common ones run() computes for everyone)
    """

    row_weight: torch.Tensor | None = None
    gate: torch.Tensor | None = None
    kept_rows: KeptRows | None = None
    profile: Profile | None = None
    token_weights: torch.Tensor | None = None
    shared_weights: bool = False  # token_weights is a per-batch profile several corrections read: not to be written
    keep: torch.Tensor | None = None
    kept_len: torch.Tensor | None = None
    clipped: torch.Tensor | None = None
    masks: dict[str, torch.Tensor | Callable[[], torch.Tensor]] = field(default_factory=dict)
    metrics: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def per_token(self) -> bool:
        """The tokens form (a (B, T) keep or weight tensor) rather than the rows form."""
        return self.keep is not None or self.token_weights is not None


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
