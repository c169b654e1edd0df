"""The loss tokens of a batch as flat (log pi, l) pairs after any re-alignment, and the estimates clustered by
rollout that every detector reads (tokens of one rollout are dependent, rollouts are not)."""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from functools import cached_property

import torch

from ..core.types import Batch
from .levels import _SAFETY, Z_CI


@dataclass
class _Pairs:
    """The loss tokens of a batch as flat pairs (after any re-alignment), on the CPU."""

    a: torch.Tensor  # (N,) log pi, float32
    l: torch.Tensor  # (N,) log pi - log mu, float32
    mask: torch.Tensor  # (B, T) where the N tokens sit
    entropy: torch.Tensor | None  # (N,) the trainer's entropy, when the batch has it
    n_rollouts: int
    rows: torch.Tensor | None = None  # (N,) the rollout of each token
    advantages: torch.Tensor | None = None  # (N,) each token's advantage, float64

    def where(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(rollout, position) of the flat tokens at `index`."""
        rows, pos = self.mask.nonzero(as_tuple=True)
        return rows[index], pos[index]

    # each test reads these on the kept tokens: made once per batch, not once per test
    @cached_property
    def a64(self) -> torch.Tensor:
        return self.a.double()  # (N,)

    @cached_property
    def l64(self) -> torch.Tensor:
        return self.l.double()  # (N,)

    @cached_property
    def h64(self) -> torch.Tensor | None:
        return None if self.entropy is None else self.entropy.double()  # (N,)

    @cached_property
    def rho(self) -> torch.Tensor:
        return self.l64.clamp(-_SAFETY, _SAFETY).exp()  # (N,) rho, |l| bounded by verl's safety bound


# ---------------------------------------------------------------------------------------------------------
# alignment and the flat pairs


def best_shift(trainer: torch.Tensor, inference: torch.Tensor, mask: torch.Tensor, shifts=(-2, -1, 0, 1, 2),
               max_tokens: int = 1 << 16) -> tuple[int, dict[int, float]]:
    """The shift k at which inference[:, t + k] agrees best with trainer[:, t] (median |difference| over
    positions where both are loss tokens, on the first rollouts up to max_tokens positions), and the
    agreement at every k. k != 0 only when it beats k = 0 by 4x: a batch that is merely noisy stays at 0."""
    t, i, m = _first_rollouts(trainer, inference, mask, max_tokens)
    agreement = {}
    for k in shifts:
        if abs(k) >= t.shape[1]:
            continue
        both, diff = _partners(t, i, m, k)
        d = diff[both].abs()
        agreement[k] = float(d.median()) if d.numel() else math.inf
    best = min(agreement, key=lambda k: (agreement[k], abs(k)))
    if best != 0 and not agreement[best] * 4 < agreement.get(0, math.inf):
        best = 0
    return best, agreement


def find_shift(trainer: torch.Tensor, inference: torch.Tensor, mask: torch.Tensor,
               shifts=(-2, -1, 0, 1, 2)) -> tuple[int, dict[int, float] | None]:
    """best_shift's shift (and its agreement when the shift is not 0), without a median per shift when the
    answer is 0, the usual one: a shift k wins only when its median |difference| is under a quarter of the
    in-place one, so at least half its pairs lie within that quarter; a count per shift says whether any
    could, and only then best_shift runs. (None for the agreement when the shift is 0.)"""
    t, i, m = _first_rollouts(trainer, inference, mask, 1 << 16)  # best_shift's default max_tokens
    in_place = (t - i)[m].abs()
    if 0 not in shifts or in_place.numel() == 0:
        return best_shift(trainer, inference, mask, shifts)
    agreement = float(in_place.median())
    if not agreement > 0:  # 0 (or NaN): no shift can beat it 4x
        return 0, None
    quarter = agreement / 4
    mf = m.float()  # (R, T) the counts in 0/1 floats (bool ops are slow paths on the CPU; exact below 2^24)
    T = t.shape[1]
    for k in shifts:
        if k == 0 or abs(k) >= T:
            continue
        lo, hi = max(0, -k), T - max(0, k)  # as _partners: positions t whose partner t + k exists
        both = mf[:, lo:hi] * mf[:, lo + k:hi + k]  # (R, T - |k|) 1 where both are loss tokens
        pairs = int(both.sum())
        close = torch.sub(t[:, lo:hi], i[:, lo + k:hi + k]).abs_().le_(quarter)  # (a NaN difference is not close)
        if pairs and 2 * int(close.mul_(both).sum()) >= pairs:
            return best_shift(trainer, inference, mask, shifts)  # k might win: every median, as it would
    return 0, None


def _first_rollouts(trainer: torch.Tensor, inference: torch.Tensor, mask: torch.Tensor,
                    max_tokens: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(R, T) the first rollouts up to max_tokens positions (at least one), the log-probs in float32."""
    B, T = trainer.shape
    rows = slice(0, max(1, min(B, max_tokens // max(T, 1))))
    return trainer[rows].float(), inference[rows].float(), mask[rows]


def _partners(t: torch.Tensor, i: torch.Tensor, m: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(R, T - |k|) where position t and its partner t + k are both loss tokens, and trainer[t] - inference[t + k]
    there (a new tensor)."""
    T = t.shape[1]
    lo, hi = max(0, -k), T - max(0, k)  # positions t whose partner t + k exists
    return m[:, lo:hi] & m[:, lo + k:hi + k], t[:, lo:hi] - i[:, lo + k:hi + k]


def realign(batch: Batch, shift: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(trainer, inference, mask) on the CPU in float32, the inference log-probs read `shift` positions later
    and the mask limited to finite pairs whose partner exists."""
    trainer = batch.trainer_logprobs.detach().cpu().float()
    inference = batch.inference_logprobs.detach().cpu().float()
    mask = batch.loss_mask.cpu()
    if shift:
        inference = torch.roll(inference, -shift, dims=1)  # (B, T) position t now holds t + shift
        partner = torch.roll(mask, -shift, dims=1)
        T = mask.shape[1]
        partner[:, max(0, T - shift):] = False  # rolled in from the other end
        partner[:, :max(0, -shift)] = False
        mask = mask & partner
    return trainer, inference, mask


def aligned_pairs(batch: Batch, shift: int = 0) -> _Pairs:
    """The loss tokens' (log pi, l) with the inference log-probs read `shift` positions later, each token's
    rollout and advantage, and the trainer's entropy when the batch has it."""
    trainer, inference, mask = realign(batch, shift)
    index = mask.reshape(-1).nonzero().squeeze(1)  # (N,) where the loss tokens sit, row by row
    a = trainer.reshape(-1).index_select(0, index)  # (N,) what trainer[mask] gives, with one search for both
    l = a - inference.reshape(-1).index_select(0, index)  # (N,)
    finite = torch.isfinite(l)
    if not bool(finite.all()):  # a log-prob of -inf or NaN on a loss token: leave it out
        keep = torch.zeros_like(mask)
        keep[mask] = finite
        mask, a, l, index = keep, a[finite], l[finite], index[finite]
    entropy = batch.extras.get("entropy")
    if entropy is not None:
        entropy = entropy.detach().cpu().float().reshape(-1).index_select(0, index)
        entropy = entropy if bool(torch.isfinite(entropy).all()) else None
    rows = torch.div(index, max(mask.shape[1], 1), rounding_mode="floor")  # (N,) the rollout of each token
    adv = batch.advantages.detach().cpu().double()
    adv = adv.index_select(0, rows) if adv.dim() == 1 else adv.reshape(-1).index_select(0, index)  # (N,)
    adv = adv if bool(torch.isfinite(adv).all()) else None
    return _Pairs(a, l, mask, entropy, int(batch.loss_mask.any(-1).sum()), rows, adv)


def _sample(x: torch.Tensor, n: int = 1 << 18) -> torch.Tensor:
    """Every k-th element, so at most about n remain (a fixed, seedless choice)."""
    return x[:: max(1, x.numel() // n)]


# ---------------------------------------------------------------------------------------------------------
# clustered estimates: tokens of one rollout are dependent, rollouts are not


def clustered_mean(x: torch.Tensor, rows: torch.Tensor) -> tuple[float, float]:
    """Mean of the (N,) values x and its standard error with the rollouts (rows) as clusters:
    se^2 = sum_j (sum_{t in j} (x_t - mean))^2 / N^2 (the CLT on per-rollout sums)."""
    x = x.double()
    n = x.numel()
    mean = float(x.sum()) / n
    per = cluster_sums(x - mean, rows)  # (R,)
    return mean, math.sqrt(float(per.pow(2).sum())) / n


def clustered_ratio(num: torch.Tensor, den: torch.Tensor, rows: torch.Tensor) -> tuple[float, float]:
    """sum num / sum den and its standard error by the delta method with rollouts as clusters:
    se = sqrt(sum_j (sum_{t in j} (num_t - r den_t))^2) / |sum den|."""
    num, den = num.double(), den.double()
    total = float(den.sum())
    if total == 0:
        return math.nan, math.inf
    r = float(num.sum()) / total
    per = cluster_sums(num - r * den, rows)  # (R,)
    return r, math.sqrt(float(per.pow(2).sum())) / abs(total)


def _ci(value: float, se: float) -> list[float]:
    return [value - Z_CI * se, value + Z_CI * se]


def _ratio(p: _Pairs, keep: torch.Tensor) -> torch.Tensor:
    return kept(p.rho, keep)  # (n,) rho on the kept tokens


def kept(x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """x[keep], without the copy when every token is kept (a batch without catastrophic tokens, the usual one)."""
    index = _kept_index(keep)
    return x if index is None else x.index_select(0, index)


_KEPT = threading.local()  # .last: (keep, its version, its index), the last mask this thread asked about


def _kept_index(keep: torch.Tensor) -> torch.Tensor | None:
    """(n,) where keep is true, or None when it is true everywhere; made once per mask, as the tests read a
    dozen tensors with one (a bool index searches the mask each time). The entry (one per thread: the explorer
    diagnoses in several) holds the mask itself, so its memory is not reused while it stands, and its version
    counter says whether it was written since."""
    last = getattr(_KEPT, "last", None)
    if last is not None and last[0] is keep and last[1] == keep._version:
        return last[2]
    every = keep.numel() == 0 or bool(keep.view(torch.uint8).min())  # (a bool all() is 20x slower on the CPU)
    index = None if every else keep.nonzero().squeeze(1)
    _KEPT.last = keep, keep._version, index
    return index


def cluster_sums(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """(R,) the sums of the (N,) values x over each rollout that rows holds (in order of rollout), in float64.
    Rows in order (as aligned_pairs makes them) are summed as consecutive runs, else scattered."""
    x = x.double()
    if x.numel() == 0:
        return x
    in_order = rows.numel() < 2 or int((rows[1:] - rows[:-1]).min()) >= 0
    if in_order:
        counts = torch.bincount(rows)  # (max row + 1,)
        return torch.segment_reduce(x, "sum", lengths=counts[counts > 0])
    per = torch.zeros(int(rows.max()) + 1, dtype=torch.float64).index_add_(0, rows, x)
    return per[torch.bincount(rows) > 0]

