"""The column model: names and limits, and columns as read (ragged, dense, objects) before they become a Batch."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

FORMATS = (".parquet", ".jsonl", ".json", ".npz", ".safetensors", ".pt")
MAX_BYTES = 200 * 1024 * 1024  # the default size limit (Streamlit's upload limit is 200 MB too)
MAX_EXPANSION = 8  # a compressed file may unpack to at most this many times max_bytes
LIMIT_HINT = "load_batch(..., max_bytes=...) raises it"  # ends every size refusal; a command line says its flag
SIZE_UNITS = {"": 1, "B": 1, "K": 2**10, "KB": 2**10, "M": 2**20, "MB": 2**20, "G": 2**30, "GB": 2**30}  # MB: 2**20
LOGPROB_TOLERANCE = 1e-6  # a log-prob above this on a loss token is refused
ASSETS_DIR = Path(__file__).resolve().parents[2] / "assets"

# role -> names looked for: seqis's own name first, then each framework's (read from its code). The role's own name
# wins over the others; two of the others in one file are ambiguous, refused naming both (assemble._resolve).
ALIASES: dict[str, tuple[str, ...]] = {
    "trainer_logprobs": ("trainer_logprobs",
                         "old_log_probs",  # verl
                         "prev_logprobs",  # NeMo-RL
                         "old_per_token_logps",  # TRL
                         "log_probs",  # slime, miles
                         "action_log_probs",  # OpenRLHF, SkyRL
                         "prox_logp"),  # AReaL (recompute_logprob on)
    "inference_logprobs": ("inference_logprobs",
                           "rollout_log_probs",  # verl, slime, OpenRLHF
                           "generation_logprobs",  # NeMo-RL
                           "sampling_per_token_logps",  # TRL
                           "sampler_logprobs",
                           "rollout_logprobs",  # SkyRL
                           "logprobs"),  # AReaL (the inference engine's)
    "loss_mask": ("loss_mask",  # prime-rl, SkyRL, AReaL
                  "response_mask",  # verl
                  "token_mask",  # NeMo-RL
                  "completion_mask",  # TRL
                  "loss_masks",  # slime, miles
                  "action_mask"),  # OpenRLHF
    "sample_mask": ("sample_mask",),  # NeMo-RL: 0/1 per rollout, multiplied into the loss mask
    "advantages": ("advantages", "advantage"),
    "reward": ("reward",),
    "group_id": ("group_id",
                 "uid"),  # verl: the prompt's id, shared by its group of rollouts
    "position_ids": ("position_ids",),
    "seq_lens": ("seq_lens",),
}
VERL_NAMES = {"trainer_logprobs": "old_log_probs", "inference_logprobs": "rollout_log_probs",
              "loss_mask": "response_mask"}
_SAFETENSORS_META = "seqis.metadata"  # safetensors header key holding non-numeric metadata as JSON


def parse_size(text: str) -> int | None:
    """A size as a command line gives it: '400MB', '1.5G', '4096' (bytes) -> bytes; 'none' -> None (no limit)."""
    t = str(text).strip().upper().replace(" ", "")
    if t == "NONE":
        return None
    number = t.rstrip("KMGB")
    unit = t[len(number):]
    try:
        n = float(number) * SIZE_UNITS[unit]
    except (ValueError, KeyError):
        n = -1.0
    if not n >= 0 or n == float("inf"):  # NaN too
        raise ValueError(f"{text!r} is not a size: bytes, or a number with K, M, G, KB, MB or GB (400MB; 1 MB is "
                         f"2**20 bytes), or none for no limit")
    return int(n)


def size_text(n: int) -> str:
    """A size in the largest unit it fills: '200 MB', '1.5 KB', '1000 bytes'."""
    for unit in ("GB", "MB", "KB"):
        if n >= SIZE_UNITS[unit]:
            return f"{n / SIZE_UNITS[unit]:.4g} {unit}"
    return f"{n} bytes"


class BatchFormatError(ValueError):
    """A file that cannot be read as a rollout batch; the message names the column and the row."""


def list_assets() -> list[Path]:
    """The example batches shipped in assets/, sorted by name ([] when the folder is absent)."""
    if not ASSETS_DIR.is_dir():
        return []
    return sorted(p for p in ASSETS_DIR.iterdir() if p.is_file() and p.suffix.lower() in FORMATS)


# ---------------------------------------------------------------------------------------------------------
# columns as read, before they become a Batch


@dataclass
class _Ragged:
    """One list per row: all rows' values end to end, and each row's length."""

    values: torch.Tensor  # (N,)
    lengths: torch.Tensor  # (R,) int64
    owned: bool = True  # False: a view of a reader's read-only buffer, copy before handing it out


@dataclass
class _Dense:
    tensor: torch.Tensor  # any shape
    owned: bool = True


@dataclass
class _Objects:
    values: list  # one non-numeric (or null) value per row


@dataclass
class _Const:
    value: Any  # one non-numeric value for the whole file


@dataclass
class _Unusable:
    reason: str  # why it cannot be a column of numbers, naming the row


_MISSING = object()


def _short(v) -> str:
    r = repr(v)
    return r if len(r) <= 40 else r[:37] + "..."


def _dense_from_numpy(a: np.ndarray, owned: bool = True) -> _Dense | _Unusable:
    kind = a.dtype.kind
    if kind not in "biuf":
        return _Unusable(f"holds {a.dtype} values, not numbers")
    if kind == "u" and a.dtype != np.uint8:
        a, owned = a.astype(np.int64), True
    if kind == "f" and a.dtype.itemsize > 8:  # long double: torch has no such dtype
        a, owned = a.astype(np.float64), True
    if not a.dtype.isnative:
        a, owned = a.astype(a.dtype.newbyteorder("=")), True
    if not a.flags.writeable:
        with warnings.catch_warnings():  # never written to: copied before it leaves the loader
            warnings.simplefilter("ignore")
            return _Dense(torch.from_numpy(a), owned=False)
    return _Dense(torch.from_numpy(a), owned=owned)


def _dense_from_torch(t: torch.Tensor) -> _Dense | _Unusable:
    if t.layout != torch.strided or t.is_quantized or t.device.type == "meta":
        return _Unusable("is not a plain dense tensor")
    if t.is_complex():
        return _Unusable("holds complex numbers")
    if t.is_floating_point() and t.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        t = t.to(torch.float32)  # float8 and friends
    elif t.dtype in (torch.uint16, torch.uint32, torch.uint64):
        t = t.to(torch.int64)
    return _Dense(t.detach().cpu())


def _row_value(v):
    """One row's value: a 1-D numeric array for a list, the reason it is not one, or a scalar."""
    if isinstance(v, torch.Tensor):
        col = _dense_from_torch(v)
        if isinstance(col, _Unusable):
            return col
        t = col.tensor
        if t.dim() == 0:
            return t.item()
        if t.dim() != 1:
            return _Unusable(f"a {t.dim()}-D tensor")
        return (t.float() if t.dtype == torch.bfloat16 else t).numpy()
    if not isinstance(v, (list, tuple)):
        return v
    try:
        a = np.array(v)
    except (ValueError, TypeError, OverflowError, RecursionError):
        return _Unusable("nested lists")
    if a.ndim != 1:
        return _Unusable("nested lists")
    if a.dtype.kind in "biuf":
        return a
    for x in v:  # object dtype: numbers and nulls, or something else
        if isinstance(x, (list, tuple, dict)):
            return _Unusable("nested lists" if not isinstance(x, dict) else f"a non-numeric value {_short(x)}")
        if x is not None and not isinstance(x, (int, float)):
            return _Unusable(f"a non-numeric value {_short(x)}")
    try:
        return np.array([math.nan if x is None else float(x) for x in v], dtype=np.float64)
    except OverflowError:
        return _Unusable("a number too large for a float")


def _is_number(x) -> bool:
    return isinstance(x, (int, float, np.bool_, np.integer, np.floating))  # bool is an int


def _build_column(name: str, entries: list):
    """A column from per-row entries (as `_row_value` gives them, or _MISSING)."""
    listy = [i for i, e in enumerate(entries) if isinstance(e, (np.ndarray, _Unusable))]
    if listy:  # a token-level column: every row must hold a list of numbers
        for r, e in enumerate(entries):
            if e is _MISSING:
                return _Unusable(f"row {r}: column '{name}' is missing")
            if isinstance(e, _Unusable):
                return _Unusable(f"row {r}: column '{name}' holds {e.reason}")
            if not isinstance(e, np.ndarray):
                return _Unusable(f"row {r}: column '{name}' is {_short(e)}, not a list (row {listy[0]} has a list)")
        lengths = torch.tensor([len(e) for e in entries], dtype=torch.int64)
        values = np.concatenate(entries) if entries else np.zeros(0)
        col = _dense_from_numpy(values)
        if isinstance(col, _Unusable):
            return _Unusable(f"column '{name}' {col.reason}")
        return _Ragged(col.tensor, lengths)
    values = [None if e is _MISSING else e for e in entries]
    if values and all(_is_number(x) for x in values):
        try:
            a = np.array(values)
        except (OverflowError, ValueError):
            return _Objects(values)
        if a.dtype.kind == "O":
            try:
                a = a.astype(np.float64)
            except (OverflowError, ValueError, TypeError):
                return _Objects(values)
        return _dense_from_numpy(a)
    if not values:
        return _Dense(torch.zeros(0))
    return _Objects(values)


def _column_value(name: str, v):
    """A column stored whole (a json object of columns, a .pt dict)."""
    if isinstance(v, torch.Tensor):
        return _dense_from_torch(v)
    if isinstance(v, (list, tuple)):
        return _build_column(name, [_row_value(x) for x in v])
    if _is_number(v):
        try:
            return _Dense(torch.tensor(v))
        except (OverflowError, RuntimeError):  # an int beyond int64
            return _Dense(torch.tensor(float(v))) if abs(v) < 1e308 else _Const(str(v))
    if isinstance(v, dict):
        return _Unusable(f"column '{name}' is an object of {len(v)} entries, not a column")
    return _Const(v)


