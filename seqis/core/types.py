"""The records seqis passes around: a rollout batch, an estimator's output, and declared knobs.

Shapes: B rollouts, T positions. Positions where `loss_mask` is False are padding or prompt tokens
and are ignored entirely; they may hold anything, -inf and NaN included. A loss token's log-probs must be
finite (`Batch` refuses NaN and +-inf there, or leaves such tokens out with drop_nonfinite=True).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import InitVar, dataclass, field
from typing import Any

import torch

# ---------------------------------------------------------------------------------------------------------
# knobs: declared once (default, valid range, slider range, help); configs validate, the app builds widgets


def knob(
    default: Any,
    help: str,
    *,
    gt: float | None = None,
    ge: float | None = None,
    ui: tuple[float, float] | None = None,
    log: bool = False,
    optional: bool = False,
    choices: tuple | None = None,
    finite: bool = False,
    band: bool = True,
    inf: bool = False,
    advanced: bool = False,
) -> Any:
    """A config field whose metadata says how to validate it and how to draw it.

    gt / ge: the value must be greater than / at least this (math.inf is allowed, for clips and band
    edges, unless finite=True).
    ui: the slider's range; log: draw the slider on a log scale; optional: None is a valid value
    (it switches the feature off, e.g. geo_mask's token_clip); choices: a categorical knob (a select box);
    band=False on an X_low knob: X_low / X_high are not a band's edges (prime-rl's dppo_mask_low is the size
    of a downward step), so low need not be below high. inf: the widget offers +inf past the end of its range (a
    clip or an upper band edge that can be opened).
    advanced: a knob most views leave alone (adv_tau only rescales every weight): the app draws it only when its
    advanced knobs are shown, and keeps a value from a link either way.
    """
    meta = dict(help=help, gt=gt, ge=ge, ui=ui, log=log, optional=optional, choices=choices, finite=finite,
                band=band, inf=inf, advanced=advanced)
    return field(default=default, metadata=meta)


def knobs(cfg_or_cls) -> list[dataclasses.Field]:
    """The declared fields of a config class or instance, in declaration order."""
    return [f for f in dataclasses.fields(cfg_or_cls) if "help" in f.metadata]


@dataclass(frozen=True)
class Knobs:
    """Base of every frozen config made of knob() fields: validation driven by the knob metadata.

    Any pair of fields `X_low` / `X_high` is a band: low must be below high.
    """

    def __post_init__(self):
        for f in knobs(self):
            v = getattr(self, f.name)
            m = f.metadata
            if v is None:
                if not m["optional"]:
                    raise ValueError(f"{f.name} must be a number, got None")
                continue
            if m["choices"] is not None:
                if v not in m["choices"]:
                    raise ValueError(f"{f.name} must be one of {m['choices']}, got {v!r}")
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise ValueError(f"{f.name} must be a number, got {v!r}")
            if math.isnan(v):
                raise ValueError(f"{f.name} must be a number, got nan")
            if m["gt"] is not None and not v > m["gt"]:
                raise ValueError(f"{f.name} must be > {m['gt']}, got {v}")
            if m["ge"] is not None and not v >= m["ge"]:
                raise ValueError(f"{f.name} must be >= {m['ge']}, got {v}")
            if v == -math.inf or (m["finite"] and v == math.inf):
                raise ValueError(f"{f.name} must be finite{'' if m['finite'] else ' or +inf'}, got {v}")
        fields = {f.name: f for f in knobs(self)}
        for name in sorted(fields):
            if name.endswith("_low") and (hi := name[: -len("_low")] + "_high") in fields:
                lo_v, hi_v = getattr(self, name), getattr(self, hi)
                if lo_v is None or hi_v is None or not fields[name].metadata["band"]:
                    continue  # an open side, or not a band
                if not lo_v < hi_v:
                    raise ValueError(f"{name} must be below {hi}, got {lo_v} >= {hi_v}")

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in knobs(self)}


@dataclass(frozen=True)
class Config(Knobs):
    """Base of every estimator config: adv_tau, the advantage scale all estimators share."""

    adv_tau: float = knob(1.0, "Advantage scale: every weight multiplies adv_tau * A.", gt=0.0, ui=(0.1, 4.0),
                            finite=True, advanced=True)


# ---------------------------------------------------------------------------------------------------------
# blocks of rows (the ratio pass) and the finite check (Batch._check_finite)

# Elements of a (B, T) pass made at once on the CPU. glibc's malloc hands a large block back to the OS when it is
# freed at the top of the heap (past its trim threshold: twice the largest block it has seen mmapped), and the
# next one of that size page-faults in fresh memory: a 4 MiB (B, T) temporary then costs ~1,000 page faults,
# more than the arithmetic on it. A pass over blocks of rows of this size keeps its temporaries small enough to
# be reused, and in cache.
BLOCK = 1 << 18  # 1 MiB in float32


def row_blocks(B: int, T: int, device: torch.device) -> list[slice]:
    """Slices of rows that cover B rows of T positions, about BLOCK elements each on the CPU; one on a GPU
    (its caching allocator reuses memory: blocks would only add launches)."""
    if device.type != "cpu":
        return [slice(0, B)]
    rows = max(1, BLOCK // max(1, T))
    return [slice(a, min(a + rows, B)) for a in range(0, B, rows)] or [slice(0, 0)]


# The finite check reads each log-prob once, as sums over chunks of CHUNK elements (flat, row-major): a reduction
# only reads, ~0.07x the floor per float32 tensor, where a masked elementwise pass writes a temporary (~0.3x per op).
# 128: the chunk sums are still a fast inner reduction, and the chunks looked at token by token (about one a row in a
# ragged batch) stay a few percent of the batch.
CHUNK = 128


def whole_chunks(x: torch.Tensor, k: int) -> torch.Tensor:
    """(k / CHUNK, CHUNK) x's first k elements in row-major order (k a multiple of CHUNK): a view of a contiguous x."""
    return x.view(-1, CHUNK) if k == x.numel() and x.is_contiguous() else x.reshape(-1)[:k].view(-1, CHUNK)


def chunk_sums(x: torch.Tensor) -> torch.Tensor:
    """(n,) the sums of the rows of x (n, CHUNK), in float32 at least: a 16-bit sum of large finite values overflows,
    which would only send more chunks to the token-by-token look."""
    return x.sum(-1) if x.dtype.itemsize >= 4 else x.sum(-1, dtype=torch.float32)


def chunks_without_loss(m: torch.Tensor) -> torch.Tensor:
    """(n,) bool: the rows of the bool m (n, CHUNK) with no True. Summed as int64 words of eight bools each (torch's
    bools are bytes 0 or 1, so a word is 0 iff its eight are False, and CHUNK / 8 = 16 words of at most
    0x0101010101010101 sum below 2**63: no overflow, no cancelling): any(-1) is 20x slower."""
    if m.storage_offset() % 8 == 0:
        return m.view(torch.int64).sum(-1) == 0
    return m.any(-1).logical_not_()  # a view that does not start on a word


def nonfinite_at(tl: torch.Tensor, il: torch.Tensor, loss: torch.Tensor) -> torch.Tensor:
    """(n, tl.dim()) the loss tokens where either log-prob is NaN or +-inf, in row-major order; tl and il are
    overwritten (pass copies). First one sum of tl + il over the loss tokens: finite, there is none (as in
    nonfinite_loss_tokens); else the exact test: x * 0 is 0 for a finite x and NaN for NaN or +-inf, and 0 + 0 stays 0,
    with no sum of two log-probs to overflow."""
    if math.isfinite(torch.where(loss, tl + il, 0).sum()):
        return loss.new_zeros((0, loss.dim()), dtype=torch.long)
    return torch.where(loss, tl.mul_(0).add_(il.mul_(0)), 0).nonzero()


def nonfinite_loss_tokens(tl: torch.Tensor, il: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """(n,) ascending flat (row-major) positions of the loss tokens where either log-prob is NaN or +-inf.

    Why it holds: an IEEE sum is finite only if every addend is (NaN + anything is NaN, inf + finite is inf, inf - inf
    is NaN, and a non-finite partial sum stays non-finite whatever the order of the additions), so a chunk whose sums of
    both log-probs (and the sum of those two) are finite holds no non-finite value, loss token or padding. A sum of
    finite values that overflows (1e38 + 1e38) reads as not finite: that only sends a clean chunk to the token-by-token
    look, which decides. That look covers the chunks with a non-finite sum and a loss token (in a ragged batch with
    -inf padding, about one per row, where its padding starts), and the fewer than CHUNK elements past the last whole
    chunk."""
    N = tl.numel()
    k = N - N % CHUNK
    tc, ic, mc = (whole_chunks(x, k) for x in (tl, il, m))  # (k / CHUNK, CHUNK)
    sums = chunk_sums(tc).add_(chunk_sums(ic)).mul_(0)  # (k / CHUNK,) 0 where finite, else NaN
    if k == N and not math.isnan(sums.sum()):  # nothing non-finite anywhere (one read back, a sync on a GPU)
        return torch.zeros(0, dtype=torch.long, device=tl.device)
    chunks = sums.masked_fill_(chunks_without_loss(mc), 0).nonzero().squeeze(1)  # (K,) NaN is nonzero
    at = nonfinite_at(tc.index_select(0, chunks), ic.index_select(0, chunks), mc.index_select(0, chunks))  # (n, 2)
    found = [chunks[at[:, 0]] * CHUNK + at[:, 1]] if at.numel() else []
    if k < N:  # the elements past the last whole chunk, token by token
        t, i, loss = (x.reshape(-1)[k:] for x in (tl, il, m))
        found.append(k + nonfinite_at(t.clone(), i.clone(), loss).squeeze(1))
    return torch.cat(found) if found else chunks[:0]


# ---------------------------------------------------------------------------------------------------------
# Batch


def _shape(x) -> str:
    return f"{tuple(x.shape)} {str(x.dtype).replace('torch.', '')}" if isinstance(x, torch.Tensor) else repr(
        type(x).__name__
    )


@dataclass(eq=False)
class Batch:
    """One batch of rollouts as the trainer sees it.

    trainer_logprobs    (B, T) float: log pi(y_t), the trainer's log-prob of each sampled token; may
                        require grad (the loss backpropagates into it, and only into it)
    inference_logprobs  (B, T) float: log mu(y_t), the sampler's log-prob of the same token
    advantages          (B,) one per rollout, or (B, T) one per token
    loss_mask           (B, T) bool: the tokens that carry loss (default: all)
    metadata            optional per-rollout columns (prompt id, env, step, ...): name -> list of B values
    extras              optional per-token columns for the views (a prime-rl export's "entropy",
                        "token_ids"): name -> (B, T) tensor aligned with trainer_logprobs
    drop_nonfinite      a NaN or +-inf log-prob (either one) on a loss token raises ValueError naming the first
                        row and token and how many there are; True leaves those tokens out of loss_mask instead
                        and counts them in `n_dropped_nonfinite`

    The sampler's head (optional; all three or none), for corrections that read the sampler's top-k (score
    centering): at each position the ids of the sampler's top-k tokens and both policies' log-probs of them,
    normalised over the whole vocabulary:
    topk_ids                 (B, T, K) integer token ids; -1 pads a slot with no token
    topk_inference_logprobs  (B, T, K) float: log q_v, the sampler's
    topk_trainer_logprobs    (B, T, K) float: log p_v, the trainer's; may require grad (the loss reaches it)
    topk_support             (B, T, K) bool or None: the replayed sampling support (top-p / top-k sampling),
                             for score centering's exact variant; the head is then the whole support

    A framework's own answer to such a token differs (0 weight, a NaN loss); replacing log pi by 0 would give
    token TIS a weight e^1 on it. Padding (loss_mask False) may hold anything.
    """

    trainer_logprobs: torch.Tensor
    inference_logprobs: torch.Tensor
    advantages: torch.Tensor
    loss_mask: torch.Tensor | None = None
    metadata: dict[str, list] = field(default_factory=dict)
    extras: dict[str, torch.Tensor] = field(default_factory=dict)
    drop_nonfinite: InitVar[bool] = False
    n_dropped_nonfinite: int = field(default=0, init=False)  # loss tokens drop_nonfinite=True left out
    topk_ids: torch.Tensor | None = None
    topk_inference_logprobs: torch.Tensor | None = None
    topk_trainer_logprobs: torch.Tensor | None = None
    topk_support: torch.Tensor | None = None

    def __post_init__(self, drop_nonfinite: bool = False):
        tl, il, adv = self.trainer_logprobs, self.inference_logprobs, self.advantages
        mask = self.loss_mask

        def got() -> str:  # what was given, for an error (built only then: a valid Batch pays nothing for it)
            return (f"got trainer_logprobs {_shape(tl)}, inference_logprobs {_shape(il)}, advantages {_shape(adv)}, "
                    f"loss_mask {_shape(mask) if mask is not None else None}")
        for name, x in (("trainer_logprobs", tl), ("inference_logprobs", il), ("advantages", adv)):
            if not isinstance(x, torch.Tensor):
                raise ValueError(f"Batch.{name} must be a torch.Tensor; {got()}")
            if not x.is_floating_point():
                raise ValueError(f"Batch.{name} must be a float tensor; {got()}")
        if tl.dim() != 2:
            raise ValueError(f"Batch.trainer_logprobs must be 2-D (B, T); {got()}")
        if il.shape != tl.shape:
            raise ValueError(f"Batch.inference_logprobs must have the shape of trainer_logprobs; {got()}")
        B, T = tl.shape
        if adv.shape not in ((B,), (B, T)):
            raise ValueError(f"Batch.advantages must be ({B},) or ({B}, {T}); {got()}")
        if self.loss_mask is None:
            self.loss_mask = torch.ones(B, T, dtype=torch.bool, device=tl.device)
        m = self.loss_mask
        if not isinstance(m, torch.Tensor) or m.shape != tl.shape:
            raise ValueError(f"Batch.loss_mask must be a ({B}, {T}) bool tensor; {got()}")
        if m.dtype != torch.bool:
            if m.is_floating_point() or m.is_complex():
                raise ValueError(f"Batch.loss_mask must be bool (or 0/1 integers); {got()}")
            self.loss_mask = m = m != 0
        devices = {x.device for x in (tl, il, adv, m)}
        if len(devices) > 1:
            raise ValueError(f"Batch tensors must share one device, got {sorted(map(str, devices))}")
        for k, v in self.metadata.items():
            if len(v) != B:
                raise ValueError(f"Batch.metadata[{k!r}] must have one value per rollout ({B}), got {len(v)}")
        for k, x in self.extras.items():
            if not isinstance(x, torch.Tensor) or x.shape != tl.shape or x.device != tl.device:
                raise ValueError(f"Batch.extras[{k!r}] must be a ({B}, {T}) tensor on {tl.device}, got {_shape(x)}")
        self._check_finite(drop_nonfinite)
        self._check_head()

    HEAD = ("topk_ids", "topk_inference_logprobs", "topk_trainer_logprobs")

    @property
    def has_head(self) -> bool:
        """Whether the batch carries the sampler's top-k head (topk_ids and both policies' log-probs of it)."""
        return self.topk_ids is not None

    def _check_head(self) -> None:
        """The head's three tensors all or none, (B, T, K) on the batch's device, ids >= -1, and finite log-probs in
        every filled slot of a loss token (the first bad one named by row, token and slot)."""
        given = [name for name in (*self.HEAD, "topk_support") if getattr(self, name) is not None]
        if not given:
            return
        if any(getattr(self, name) is None for name in self.HEAD):
            missing = [name for name in self.HEAD if getattr(self, name) is None]
            raise ValueError(f"Batch: the sampler's head needs {', '.join(self.HEAD)} together; got {', '.join(given)}"
                             f" without {', '.join(missing)}")
        B, T = self.shape
        ids = self.topk_ids
        for name in given:
            x = getattr(self, name)
            if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[:2] != (B, T) or x.shape != ids.shape:
                raise ValueError(f"Batch.{name} must be a ({B}, {T}, K) tensor like topk_ids {_shape(ids)}, "
                                 f"got {_shape(x)}")
            if x.device != self.device:
                raise ValueError(f"Batch.{name} must be on {self.device}, got {x.device}")
        if ids.is_floating_point() or ids.dtype == torch.bool:
            raise ValueError(f"Batch.topk_ids must hold integer token ids (-1 for an empty slot), got {ids.dtype}")
        for name in ("topk_inference_logprobs", "topk_trainer_logprobs"):
            if not getattr(self, name).is_floating_point():
                raise ValueError(f"Batch.{name} must be a float tensor, got {getattr(self, name).dtype}")
        if self.topk_support is not None and self.topk_support.dtype != torch.bool:
            raise ValueError(f"Batch.topk_support must be bool, got {self.topk_support.dtype}")
        with torch.no_grad():
            filled = (ids >= 0) & self.loss_mask[..., None]  # (B, T, K) slots that carry a head token
            sampled = filled if self.topk_support is None else filled & self.topk_support  # the sampler's -inf
            checks = [("topk_ids", ids < -1, "an id below -1 (-1 is the empty slot)"),  # outside its support is fine
                      ("topk_inference_logprobs", sampled & ~torch.isfinite(self.topk_inference_logprobs),
                       "a non-finite log-prob"),
                      ("topk_trainer_logprobs", filled & ~torch.isfinite(self.topk_trainer_logprobs),
                       "a non-finite log-prob")]
            for name, bad, what in checks:
                if bool(bad.any()):
                    row, tok, slot = (int(i) for i in bad.nonzero()[0])
                    value = getattr(self, name)[row, tok, slot]
                    raise ValueError(f"Batch: row {row}, token {tok}, slot {slot}: {name} is {value.item()} "
                                     f"({what}, {int(bad.sum())} such slots on loss tokens)")

    def head(self) -> tuple:
        """(topk_ids, topk_inference_logprobs, topk_trainer_logprobs, topk_support) as given."""
        return self.topk_ids, self.topk_inference_logprobs, self.topk_trainer_logprobs, self.topk_support

    def _check_finite(self, drop: bool) -> None:
        """NaN or +-inf in either log-prob on a loss token is refused (or dropped), in one read of each log-prob as
        chunk sums (`nonfinite_loss_tokens`); only the few chunks those flag are looked at token by token."""
        tl, il, m = self.trainer_logprobs, self.inference_logprobs, self.loss_mask
        with torch.no_grad():
            pos = nonfinite_loss_tokens(tl, il, m)
        n = pos.numel()
        if n == 0:
            return
        if drop:
            keep = m.reshape(-1).clone()  # the caller's mask is kept
            keep[pos] = False
            self.loss_mask = keep.view(m.shape)
            self.n_dropped_nonfinite = n
            return
        row, tok = divmod(int(pos[0]), tl.shape[1])  # the first, in row-major order
        named = (("trainer_logprobs", tl), ("inference_logprobs", il))
        values = [f"{name} is {float(x[row, tok])}" for name, x in named if not math.isfinite(float(x[row, tok]))]
        raise ValueError(f"Batch: row {row}, token {tok}: {' and '.join(values)} on a loss token ({n} loss token"
                         f"{'s' if n != 1 else ''} with a non-finite log-prob); fix the source, mask them out, or "
                         f"pass drop_nonfinite=True to leave them out of loss_mask")

    @classmethod
    def _trusted(cls, tl, il, adv, mask, metadata, extras, n_dropped: int = 0, head=(None,) * 4) -> Batch:
        """A Batch of pieces taken from a checked one (to, select): no second validation pass."""
        b = cls.__new__(cls)
        b.trainer_logprobs, b.inference_logprobs, b.advantages, b.loss_mask = tl, il, adv, mask
        b.metadata, b.extras, b.n_dropped_nonfinite = metadata, extras, n_dropped
        b.topk_ids, b.topk_inference_logprobs, b.topk_trainer_logprobs, b.topk_support = head
        return b

    def __repr__(self) -> str:
        B, T = self.shape
        tl = self.trainer_logprobs
        tokens = int(self.loss_mask.sum())
        adv = "per token" if self.advantages.dim() == 2 else "per rollout"
        parts = [f"{B} rollouts x {T} positions", f"{tokens:,} loss tokens", f"{str(tl.dtype).replace('torch.', '')}",
                 f"{self.device}", f"advantages {adv}"]
        if tl.requires_grad:
            parts.append("trainer_logprobs requires grad")
        if self.metadata:
            parts.append(f"metadata {', '.join(self.metadata)}")
        if self.extras:
            parts.append(f"extras {', '.join(self.extras)}")
        if self.n_dropped_nonfinite:
            parts.append(f"{self.n_dropped_nonfinite} non-finite loss tokens dropped")
        if self.has_head:
            parts.append(f"a top-{self.topk_ids.shape[-1]} sampler head"
                         + (" (the replayed support)" if self.topk_support is not None else ""))
        return f"Batch({'; '.join(parts)})"

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.trainer_logprobs.shape)

    @property
    def device(self) -> torch.device:
        return self.trainer_logprobs.device

    def to(self, device) -> Batch:
        return Batch._trusted(
            self.trainer_logprobs.to(device),
            self.inference_logprobs.to(device),
            self.advantages.to(device),
            self.loss_mask.to(device),
            dict(self.metadata),
            {k: x.to(device) for k, x in self.extras.items()},
            self.n_dropped_nonfinite,
            tuple(None if x is None else x.to(device) for x in self.head()),
        )

    def select(self, index) -> Batch:
        """The rollouts at `index` (a slice, list or tensor of rollout indices)."""
        idx = torch.as_tensor(index, device=self.device) if not isinstance(index, slice) else index
        if not isinstance(index, slice):
            if idx.dtype == torch.bool:  # a mask over rollouts: its positions
                idx = idx.nonzero().squeeze(1)
            if idx.dim() != 1:
                raise ValueError(f"Batch.select takes a slice or a 1-D list or tensor of rollout indices, got a "
                                 f"{idx.dim()}-D one")
            idx = idx.long()  # an empty list comes as a float tensor
        rows = list(range(self.shape[0]))
        picked = rows[index] if isinstance(index, slice) else [rows[i] for i in idx.tolist()]
        meta = {k: [v[i] for i in picked] for k, v in self.metadata.items()}
        if isinstance(index, slice):
            take = lambda x: x[index]
        else:  # index_select of the rows picked (negative ones counted from the end, as above): x[idx] is the same
            idx = torch.tensor(picked, dtype=torch.long, device=self.device)  # rows, in a slower path on the CPU
            take = lambda x: x.index_select(0, idx)
        return Batch._trusted(
            take(self.trainer_logprobs),
            take(self.inference_logprobs),
            take(self.advantages),
            take(self.loss_mask),
            meta,
            {k: take(x) for k, x in self.extras.items()},
            head=tuple(None if x is None else take(x) for x in self.head()),
        )


# ---------------------------------------------------------------------------------------------------------
# EstimatorOutput


class Masks(Mapping):
    """name -> (B, T) bool mask, each built on first access and kept: a trainer that reads only the loss
    and the metrics never pays for them. Values given as tensors are stored as they are; a value given
    as a zero-argument function is called once, when it is first read. A read-only dict otherwise."""

    def __init__(self, masks: Mapping[str, torch.Tensor | Callable[[], torch.Tensor]]):
        self._masks = dict(masks)

    def __getitem__(self, name: str) -> torch.Tensor:
        m = self._masks[name]
        if not isinstance(m, torch.Tensor):
            m = self._masks[name] = m()
        return m

    def __contains__(self, name: object) -> bool:
        # Mapping's own test reads self[name], building the mask, and a missing name raises KeyError inside it:
        # 5.6 ms of a 57 ms forward of all 62 keys through run_many (29 tests a call)
        return name in self._masks

    def __iter__(self) -> Iterator[str]:
        return iter(self._masks)

    def __len__(self) -> int:
        return len(self._masks)

    def __repr__(self) -> str:
        return f"Masks({', '.join(self._masks)})"


class EstimatorOutput:
    """What `seqis.run` returns.

    loss      0-d tensor; its gradient flows into trainer_logprobs only
    weights   (B, T) detached gradient coefficient, 0 where the token's gradient is dropped: with
              agg="token-mean", d loss / d trainer_logprobs = -weights * adv_tau * A / N, plus
              coef * f'(l_t) / N on every loss token when the correction has a penalty (prime-rl's KL:
              f = l^2, f' = 2 l; seqis.estimators.compose.Penalty); `weights` never includes the penalty
    masks     name -> (B, T) bool: always "kept", plus the estimator's own ("clipped", "token_masked",
              "traj_masked", ...); all are subsets of the loss mask
    metrics   name -> 0-d tensor (seqis.estimators.dispatch; `.scalars()` gives floats)
    rollouts  name -> (B,) per-rollout values for charts:
                length           T_j, the rollout's loss-token count
                seq_log_ratio    S_j = sum of l_t over its loss tokens
                geo_log_ratio    S_j / T_j (0 for an empty rollout)
                weight           the applied sequence weight (mean applied weight over its loss tokens)
                accepted         bool, the rollout keeps some gradient
                clipped          bool, its weight was truncated
                kept_fraction    fraction of its loss tokens that keep a gradient

    head_weights  (B, T, K) detached, with a score-centering term only (else None): the coefficient on each head
              token's log p_v, the head's counterpart of `weights`: with agg="token-mean",
              d loss / d topk_trainer_logprobs = -head_weights * adv_tau * A / N (-c_v on loss tokens)

    The (B, T) tensors a training step rarely reads, `weights` and the masks (a read-only Mapping,
    `Masks`), are built when first read and then kept: weights may be given as a zero-argument function.
    Outputs of one `run_many` call whose keys name the same composition share these tensors and the metric
    tensors (all detached: do not write to them); each has its own loss, whose backward gives a gradient
    tensor of its own.
    """

    def __init__(self, loss: torch.Tensor, weights: torch.Tensor | Callable[[], torch.Tensor],
                 masks: Mapping[str, torch.Tensor | Callable[[], torch.Tensor]], metrics: dict[str, torch.Tensor],
                 rollouts: dict[str, torch.Tensor], head_weights: torch.Tensor | None = None):
        self.loss = loss
        self.head_weights = head_weights
        self._weights = weights
        self.masks = masks if isinstance(masks, Masks) else Masks(masks)
        self.metrics = metrics
        self.rollouts = rollouts

    @property
    def weights(self) -> torch.Tensor:
        if not isinstance(self._weights, torch.Tensor):
            self._weights = self._weights()
        return self._weights

    def __repr__(self) -> str:
        """One line: the loss, the shape, dtype and device, the tokens kept, the names of masks and metrics."""
        parts = [f"loss {float(self.loss.detach()):.6g}"]
        if "kept" in self.masks:  # (B, T): built here if no one read it yet
            kept = self.masks["kept"]
            B, T = kept.shape
            parts.append(f"{B} rollouts x {T} positions")
            length = self.rollouts.get("length")
            n = f" of {int(length.sum()):,}" if isinstance(length, torch.Tensor) else ""
            parts.append(f"{int(kept.sum()):,}{n} loss tokens kept")
        parts += [str(self.loss.dtype).replace("torch.", ""), str(self.loss.device)]
        if self.masks:
            parts.append(f"masks {', '.join(self.masks)}")
        if self.metrics:
            parts.append(f"metrics {', '.join(self.metrics)}")
        return f"EstimatorOutput({'; '.join(parts)})"

    def scalars(self) -> dict[str, float]:
        """The metrics as floats, read back from the device in one transfer."""
        tensors = [v if v.dim() == 0 else v.reshape(()) for v in self.metrics.values() if isinstance(v, torch.Tensor)]
        if len({t.dtype for t in tensors}) > 1:
            tensors = [t.to(torch.float64) for t in tensors]
        read = iter(torch.stack(tensors).tolist() if tensors else ())
        return {k: next(read) if isinstance(v, torch.Tensor) else float(v) for k, v in self.metrics.items()}
