"""Rollout batches from files: real dumps from RL frameworks in, any Batch out, and clear refusals.

Formats (by suffix, or `format=`): parquet, jsonl, json, npz, safetensors and torch .pt. A .pt file
is read only with `torch.load(weights_only=True)`: tensors and plain containers; any other pickle is
refused and nothing in it runs. Nothing from a file is executed or written to disk.

Layouts, told apart by the shape of the trainer log-prob column:
  rows     one record per rollout with list columns (parquet, jsonl, a json list of objects, a json
           object of lists of lists, a .pt list of dicts or dict of lists): ragged, or padded when
           every list has the same length
  padded   [B, T] arrays (npz, safetensors, .pt); positions past a rollout's end carry loss_mask 0
  packed   1-D (or [1, N]) micro-batches of N tokens, split into rollouts by `position_ids`
           (restarting at 0 for each rollout, counting up by 1) or by `seq_lens` (B lengths summing to N)

Column names (first found wins; `columns=` maps a role to any other name, e.g.
columns={"trainer_logprobs": "logp_fsdp"}):
  trainer_logprobs    trainer_logprobs | old_log_probs (verl)
  inference_logprobs  inference_logprobs | rollout_log_probs (verl)
  loss_mask           loss_mask | response_mask (verl); default: every token of every rollout
  advantages          advantages, one per rollout or one per token; or else
  reward + group_id   advantage = reward - mean reward of the rollout's group (GRPO)
Every other per-rollout column (prompt id, text, env name, step, a scalar broadcast to every rollout) is
kept in Batch.metadata; per-token extras (input ids, entropies) are skipped.

Refusals raise BatchFormatError (a ValueError) naming the file, the column and the row (rows and tokens
count from 0): missing columns (with the names looked for), lengths that differ within a row, shapes
that disagree, non-numeric values, NaN, inf or positive log-probs on loss tokens (above 1e-6: rounding
gives 0 + eps), no rollouts, empty, unreadable or truncated files, files over `max_bytes` (200 MB).

Memory: columns are read one at a time, and each is padded into the Batch before the next is read
(parquet list columns in slices of about 2^17 values, into one preallocated buffer). Loading a
512 x 16384 dump (float32 log-probs, a bool mask, per-rollout advantages: 72 MB as a Batch) peaks at
1.9x the batch's size over the process's baseline from parquet, npz or safetensors (peak RSS in a fresh
process: scripts/measure_load_memory.py).

    from seqis.io import load_batch, save_batch
    batch = load_batch("dump.parquet")                          # or an uploaded file with a .name
    batch = load_batch(upload, columns={"advantages": "adv"})   # other names
    save_batch(batch, "copy.npz", columns=VERL_NAMES)           # verl's column names
"""

from __future__ import annotations

import io
import json
import math
import os
import pickle
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .types import Batch

FORMATS = (".parquet", ".jsonl", ".json", ".npz", ".safetensors", ".pt")
MAX_BYTES = 200 * 1024 * 1024  # the default size limit (Streamlit's upload limit is 200 MB too)
MAX_EXPANSION = 8  # a compressed file may unpack to at most this many times max_bytes
LOGPROB_TOLERANCE = 1e-6  # a log-prob above this on a loss token is refused
ASSETS_DIR = Path(__file__).resolve().parent.parent / "assets"

# role -> names looked for, in order
ALIASES: dict[str, tuple[str, ...]] = {
    "trainer_logprobs": ("trainer_logprobs", "old_log_probs"),
    "inference_logprobs": ("inference_logprobs", "rollout_log_probs"),
    "loss_mask": ("loss_mask", "response_mask"),
    "advantages": ("advantages",),
    "reward": ("reward",),
    "group_id": ("group_id",),
    "position_ids": ("position_ids",),
    "seq_lens": ("seq_lens",),
}
VERL_NAMES = {"trainer_logprobs": "old_log_probs", "inference_logprobs": "rollout_log_probs",
              "loss_mask": "response_mask"}
PRIME_RL_NAMES = {"trainer_logprobs": "trainer_logprobs", "inference_logprobs": "inference_logprobs",
                  "loss_mask": "loss_mask"}
_SAFETENSORS_META = "seqis.metadata"  # safetensors header key holding non-numeric metadata as JSON


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


# ---------------------------------------------------------------------------------------------------------
# readers: each lists its columns and reads one on demand


class _Source:
    """A file's columns, read one at a time (so the whole file never sits in memory twice)."""

    names: list[str]
    text = False  # JSON: numbers carry no dtype, so log-probs become float32

    def load(self, name: str):
        raise NotImplementedError

    def skip_extra(self, name: str, n_rows: int) -> bool:
        """True when a non-role column is surely not per-rollout (so it need not be read)."""
        return False

    def close(self):
        pass


class _Table(_Source):
    def __init__(self, cols: dict, text: bool):
        self.cols, self.names, self.text = cols, list(cols), text

    def load(self, name):
        return self.cols[name]


def _rows_table(rows: Iterable, text: bool) -> _Table:
    """A table from records, one per rollout (jsonl lines, a json list, a .pt list of dicts)."""
    cols: dict[str, list] = {}
    n = 0
    for r, row in enumerate(rows):
        if not isinstance(row, dict):
            raise BatchFormatError(f"row {r}: expected an object of columns, got {type(row).__name__}")
        for k, v in row.items():
            entries = cols.setdefault(str(k), [_MISSING] * r)
            entries.append(_row_value(v))
        for entries in cols.values():
            if len(entries) < r + 1:
                entries.append(_MISSING)
        n = r + 1
    if n == 0:
        raise BatchFormatError("no rollouts (no records)")
    return _Table({k: _build_column(k, e) for k, e in cols.items()}, text)


def _json_source(data: bytes, jsonl: bool) -> _Source:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BatchFormatError(f"not UTF-8 text ({e})") from None
    if jsonl:
        def lines():
            for i, line in enumerate(text.splitlines()):
                if line.strip():
                    try:
                        yield json.loads(line)
                    except (ValueError, RecursionError) as e:
                        raise BatchFormatError(f"line {i + 1}: not valid JSON ({e})") from None
        return _rows_table(lines(), text=True)
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise BatchFormatError(f"not valid JSON ({e})") from None
    return _python_source(obj, text=True)


def _python_source(obj, text: bool) -> _Source:
    """A json document or a .pt payload: a list of rollout records, or an object of columns."""
    if isinstance(obj, (list, tuple)):
        return _rows_table(obj, text)
    if isinstance(obj, dict):
        return _Table({str(k): _column_value(str(k), v) for k, v in obj.items()}, text)
    raise BatchFormatError(f"expected a list of rollouts or an object of columns, got {type(obj).__name__}")


class _Parquet(_Source):
    def __init__(self, data, max_bytes):
        import pyarrow as pa
        import pyarrow.parquet as pq

        # no pre-buffering and a 1 MB read buffer: a column is decoded in slices of rows (see load)
        self.file = pq.ParquetFile(data if isinstance(data, Path) else pa.BufferReader(data), pre_buffer=False,
                                   buffer_size=1 << 20)
        self.schema = self.file.schema_arrow
        self.names = list(self.schema.names)
        md = self.file.metadata
        unpacked = sum(md.row_group(i).total_byte_size for i in range(md.num_row_groups))
        if max_bytes is not None and unpacked > MAX_EXPANSION * max_bytes:
            raise BatchFormatError(f"unpacks to {unpacked / 2**20:.0f} MB, over {MAX_EXPANSION}x the "
                                   f"{max_bytes / 2**20:.0f} MB limit")

    def skip_extra(self, name, n_rows):
        import pyarrow as pa

        t = self.schema.field(name).type
        return pa.types.is_nested(t)

    def _n_values(self, name) -> int:
        """Leaf values of a list column, from the metadata: an upper bound on its numbers (an empty or
        null list counts one)."""
        md = self.file.metadata
        leaves = [i for i in range(md.num_columns) if md.schema.column(i).path.split(".")[0] == name]
        if len(leaves) != 1:
            raise BatchFormatError(f"column '{name}' has {len(leaves)} leaf columns; expected one list of numbers")
        return sum(md.row_group(g).column(leaves[0]).num_values for g in range(md.num_row_groups))

    def load(self, name):
        t = self.schema.field(name).type
        if not _is_numeric_list(t):
            return _from_arrow(self.file.read(columns=[name], use_threads=False).column(0), name)
        # a list column in slices of about 2^17 values (arrow's decoding overhead grows with the slice), each
        # copied into one preallocated buffer before the next is decoded: the values are never held twice
        rows = max(1, self.file.metadata.num_rows)
        per_slice = max(1, min(rows, (1 << 17) * rows // max(1, self._n_values(name))))
        batches = self.file.iter_batches(batch_size=per_slice, columns=[name], use_threads=False)
        values = lengths = None
        n = row0 = 0
        for rb in batches:
            col = _from_arrow(rb.column(0), name, row0)
            if isinstance(col, _Unusable):
                return col
            if values is None:
                values = torch.empty(self._n_values(name), dtype=col.values.dtype)  # (capacity,)
                lengths = torch.empty(self.file.metadata.num_rows, dtype=torch.int64)  # (B,)
            k, r = col.values.numel(), col.lengths.numel()
            if n + k > values.numel() or row0 + r > lengths.numel():
                raise BatchFormatError(f"column '{name}' holds more values than its metadata says (corrupt file)")
            values[n:n + k] = col.values
            lengths[row0:row0 + r] = col.lengths
            n, row0 = n + k, row0 + r
        if values is None:
            return _Ragged(torch.zeros(0), torch.zeros(0, dtype=torch.int64))
        return _Ragged(values[:n], lengths[:row0])

    def close(self):
        self.file.close()


def _is_numeric_list(t) -> bool:
    import pyarrow as pa

    if not (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)):
        return False
    vt = t.value_type
    return pa.types.is_integer(vt) or pa.types.is_floating(vt) or pa.types.is_boolean(vt)


def _from_arrow(arr, name, row0: int = 0):
    """A column from an arrow array (or chunked array); row0: the row its first element is, for messages."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    t = arr.type
    is_list = pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)
    if is_list:
        if arr.null_count:
            r = row0 + int(pc.index(arr.is_null(), True).as_py())
            return _Unusable(f"row {r}: column '{name}' is null")
        vt = t.value_type
        if not (pa.types.is_integer(vt) or pa.types.is_floating(vt) or pa.types.is_boolean(vt)):
            what = "nested lists" if pa.types.is_nested(vt) else f"{vt} values, not numbers"
            return _Unusable(f"column '{name}' holds {what}")
        values = arr.flatten()  # respects slicing
        if values.null_count:
            i = int(pc.index(values.is_null(), True).as_py())
            lengths = np.asarray(pc.list_value_length(arr).fill_null(0))
            r = row0 + int(np.searchsorted(np.cumsum(lengths), i, side="right"))
            return _Unusable(f"row {r}: column '{name}' holds a null value")
        lengths = torch.from_numpy(np.asarray(pc.list_value_length(arr), dtype=np.int64))
        col = _dense_from_numpy(values.to_numpy(zero_copy_only=False), owned=False)
        if isinstance(col, _Unusable):
            return _Unusable(f"column '{name}' {col.reason}")
        return _Ragged(col.tensor, lengths, owned=col.owned)
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t):
        if arr.null_count:
            return _Objects(arr.to_pylist())
        return _dense_from_numpy(np.array(arr.to_numpy(zero_copy_only=False)))
    if pa.types.is_nested(t):
        return _Unusable(f"column '{name}' holds {t} values, not numbers")
    return _Objects(arr.to_pylist())


class _Npz(_Source):
    def __init__(self, data, max_bytes):
        obj = np.load(data if isinstance(data, Path) else io.BytesIO(data), allow_pickle=False)
        if not isinstance(obj, np.lib.npyio.NpzFile):
            raise BatchFormatError("holds a single array, not named arrays (save with np.savez(path, name=array))")
        self.npz = obj
        self.names = list(obj.files)
        self.sizes = {i.filename: i.file_size for i in obj.zip.infolist()}
        if max_bytes is not None and sum(self.sizes.values()) > MAX_EXPANSION * max_bytes:
            raise BatchFormatError(f"unpacks to {sum(self.sizes.values()) / 2**20:.0f} MB, over "
                                   f"{MAX_EXPANSION}x the {max_bytes / 2**20:.0f} MB limit")

    def _header(self, name):
        """(shape, dtype, bytes unpacked) from the member's .npy header, without reading its data."""
        member = name + ".npy" if name + ".npy" in self.sizes else name
        fmt = np.lib.format
        with self.npz.zip.open(member) as f:
            version = fmt.read_magic(f)
            read = {(1, 0): fmt.read_array_header_1_0, (2, 0): fmt.read_array_header_2_0}.get(version)
            if read is None:
                raise ValueError(f".npy version {version} is not supported")
            shape, _, dtype = read(f)
        return shape, dtype, self.sizes[member]

    def skip_extra(self, name, n_rows):
        try:
            shape, _, _ = self._header(name)
        except Exception:  # an unreadable header is reported by load()
            return False
        return not (len(shape) == 0 or shape in ((n_rows,), (n_rows, 1)))

    def load(self, name):
        try:
            shape, dtype, size = self._header(name)
        except ValueError:  # a member that is not a .npy array at all
            return _Unusable(f"column '{name}' is not a .npy array")
        if dtype.hasobject:
            raise BatchFormatError(f"column '{name}' is an object array, i.e. a pickle: refused (not executed)")
        if math.prod(shape) * dtype.itemsize > size:
            raise BatchFormatError(f"column '{name}' claims shape {shape} but holds only {size} bytes (truncated?)")
        a = self.npz[name]
        if a.dtype.kind in "US":
            return _Objects(a.tolist()) if a.ndim == 1 else _Const(a.tolist()) if a.ndim == 0 else _Unusable(
                f"column '{name}' holds text")
        col = _dense_from_numpy(a)
        return _Unusable(f"column '{name}' {col.reason}") if isinstance(col, _Unusable) else col

    def close(self):
        self.npz.close()


class _Safetensors(_Source):
    def __init__(self, data, max_bytes):
        if isinstance(data, Path):
            from safetensors import safe_open

            self.file = safe_open(str(data), framework="pt")
            self.tensors = None
            self.names = list(self.file.keys())
            meta = self.file.metadata() or {}
        else:
            from safetensors.torch import load

            self.file = None
            self.tensors = load(bytes(data))
            self.names = list(self.tensors)
            n = int.from_bytes(data[:8], "little")
            meta = json.loads(bytes(data[8:8 + n])).get("__metadata__") or {}
        self.extra = {}
        if _SAFETENSORS_META in meta:
            try:
                extra = json.loads(meta[_SAFETENSORS_META])
            except ValueError:
                raise BatchFormatError(f"header entry '{_SAFETENSORS_META}' is not valid JSON") from None
            if not isinstance(extra, dict):
                raise BatchFormatError(f"header entry '{_SAFETENSORS_META}' must be an object of columns")
            self.extra = {str(k): _column_value(str(k), v) for k, v in extra.items() if k not in self.names}
            self.names += list(self.extra)

    def skip_extra(self, name, n_rows):
        if name in self.extra:
            return False
        shape = tuple(self.file.get_slice(name).get_shape()) if self.file is not None else tuple(
            self.tensors[name].shape)
        return not (len(shape) == 0 or shape in ((n_rows,), (n_rows, 1)))

    def load(self, name):
        if name in self.extra:
            return self.extra.pop(name)
        t = self.file.get_tensor(name) if self.file is not None else self.tensors[name]
        col = _dense_from_torch(t)
        return _Unusable(f"column '{name}' {col.reason}") if isinstance(col, _Unusable) else col

    def close(self):
        if self.file is not None:
            self.file.__exit__(None, None, None)


def _pt_source(data, max_bytes) -> _Source:
    try:
        with warnings.catch_warnings():  # e.g. "Detected pickle protocol 4": the refusal below says enough
            warnings.simplefilter("ignore")
            obj = torch.load(data if isinstance(data, Path) else io.BytesIO(data), map_location="cpu",
                             weights_only=True)
    except pickle.UnpicklingError as e:
        if "weights only" in str(e).lower() or "weights_only" in str(e).lower():
            raise BatchFormatError(
                "refused: it holds Python objects beyond tensors and plain containers, and .pt files are "
                "read only with torch.load(weights_only=True); nothing in it was executed") from None
        raise BatchFormatError(f"not a readable torch file ({e})") from None
    if isinstance(obj, torch.Tensor):
        raise BatchFormatError("holds a single tensor; expected a dict of columns (or a list of rollout dicts)")
    return _python_source(obj, text=False)


# ---------------------------------------------------------------------------------------------------------
# from columns to a Batch


@dataclass
class _Layout:
    kind: str  # "rows", "padded" or "packed"
    lengths: torch.Tensor  # (B,) int64, tokens per rollout
    ref: str  # the trainer column's name, for messages
    shape: tuple = ()  # the trainer column's shape (padded, packed)
    pos: torch.Tensor | None = field(default=None, repr=False)  # (B, T) bool, position < length

    @property
    def B(self) -> int:
        return self.lengths.numel()

    @property
    def T(self) -> int:
        return int(self.lengths.max()) if self.B else 0


def _first(bad: torch.Tensor) -> tuple[int, int]:
    """(row, token) of the first True in a (B, T) bool tensor."""
    i = int(torch.argmax(bad.reshape(-1).view(torch.uint8)))
    return divmod(i, bad.shape[1])


def _resolve(names: list[str], columns: dict | None) -> dict[str, str | None]:
    given: dict[str, str] = {}
    for k, v in (columns or {}).items():
        if k in ALIASES:
            given[k] = v
        elif isinstance(v, str) and v in ALIASES:  # {"my_lp": "trainer_logprobs"} works too
            given[v] = k
        else:
            raise BatchFormatError(f"columns={columns!r}: {k!r} is not a role; roles: {', '.join(ALIASES)}")
    present = set(names)
    roles = {}
    for role, aliases in ALIASES.items():
        if role in given:
            if given[role] not in present:
                raise BatchFormatError(f"column {given[role]!r} (given for {role}) is not in the file; "
                                       f"columns present: {_listing(names)}")
            roles[role] = given[role]
        else:
            roles[role] = next((a for a in aliases if a in present), None)
    return roles


def _listing(names) -> str:
    names = list(names)
    s = ", ".join(repr(n) for n in names[:30])
    return (s + f", ... ({len(names)} in all)" if len(names) > 30 else s) or "(none)"


def _missing(role: str, names) -> BatchFormatError:
    looked = ", ".join(repr(a) for a in ALIASES[role])
    return BatchFormatError(f"no {role.replace('_', ' ')} column: looked for {looked} (pass "
                            f"columns={{'{role}': <name>}} for another name); columns present: {_listing(names)}")


def _numbers(col, name: str) -> torch.Tensor:
    """A column that must be numbers, as a tensor."""
    if isinstance(col, _Dense):
        return col.tensor
    if isinstance(col, _Objects):
        for r, v in enumerate(col.values):
            if not _is_number(v):
                raise BatchFormatError(f"row {r}: column '{name}' "
                                       + ("is null" if v is None else f"holds a non-numeric value {_short(v)}"))
        return torch.tensor([float(v) for v in col.values], dtype=torch.float64)
    if isinstance(col, _Const):
        raise BatchFormatError(f"column '{name}' is a single value {_short(col.value)}, not numbers")
    if isinstance(col, _Unusable):
        raise BatchFormatError(col.reason if name in col.reason else f"column '{name}' {col.reason}")
    raise BatchFormatError(f"column '{name}' holds one list per row; expected one number per rollout")


def _layout(src: _Source, roles: dict, tl, tl_name: str) -> _Layout:
    if isinstance(tl, _Ragged):
        return _Layout("rows", tl.lengths, tl_name)
    t = _numbers(tl, tl_name)
    if t.numel() == 0:
        if t.dim() == 2 and t.shape[0] > 0:
            raise BatchFormatError(f"no tokens: column '{tl_name}' has shape {tuple(t.shape)}")
        raise BatchFormatError(f"no rollouts: column '{tl_name}' is empty")
    split = roles["seq_lens"] or roles["position_ids"]
    if t.dim() == 2 and not (t.shape[0] == 1 and split):
        B, T = t.shape
        return _Layout("padded", torch.full((B,), T, dtype=torch.int64), tl_name, tuple(t.shape))
    if t.dim() not in (1, 2):
        raise BatchFormatError(f"column '{tl_name}' has shape {tuple(t.shape)}; expected one list per row, "
                               f"[B, T] or a packed 1-D micro-batch")
    if not split:
        raise BatchFormatError(
            f"column '{tl_name}' is 1-D ({t.numel()} values) but there is no 'position_ids' or 'seq_lens' "
            f"to split it into rollouts (a single rollout? store it as one row: [{{...}}] or shape [1, T])")
    N = t.numel()
    s = _numbers(_get(src, split), split)
    if s.is_floating_point() or s.dtype == torch.bool:
        raise BatchFormatError(f"column '{split}' must hold integers, got {str(s.dtype).replace('torch.', '')}")
    s = s.reshape(-1).to(torch.int64)
    if split == roles["seq_lens"]:
        if (s < 0).any():
            raise BatchFormatError(f"row {int(torch.argmax((s < 0).view(torch.uint8)))}: column '{split}' is negative")
        if int(s.sum()) != N:
            raise BatchFormatError(f"column '{split}' sums to {int(s.sum())} but '{tl_name}' has {N} tokens")
        lengths = s
    else:
        if s.numel() != N:
            raise BatchFormatError(f"column '{split}' has {s.numel()} values but '{tl_name}' has {N}")
        if N and int(s[0]) != 0:
            raise BatchFormatError(f"column '{split}' must start at 0 (each rollout restarts at 0), got {int(s[0])}")
        start = s == 0  # (N,)
        step_ok = start[1:] | (s[1:] == s[:-1] + 1)  # (N - 1,)
        if not bool(step_ok.all()):
            i = int(torch.argmax((~step_ok).view(torch.uint8))) + 1
            raise BatchFormatError(f"column '{split}' jumps from {int(s[i - 1])} to {int(s[i])} at token {i}: "
                                   f"positions restart at 0 for each rollout and count up by 1")
        starts = torch.nonzero(start).flatten()  # (B,)
        lengths = torch.diff(starts, append=torch.tensor([N]))
    return _Layout("packed", lengths, tl_name, tuple(t.shape))


def _positions(lay: _Layout):
    """Set lay.pos, the (B, T) positions inside each rollout; None when every rollout fills T."""
    if lay.B and not bool((lay.lengths == lay.T).all()):
        lay.pos = torch.arange(lay.T)[None, :] < lay.lengths[:, None]  # (B, T)


def _tokens(col, name: str, lay: _Layout) -> torch.Tensor:
    """A token-level column as a (B, T) tensor, zero past each rollout's end."""
    B, T = lay.B, lay.T
    if isinstance(col, _Dense) and lay.kind == "rows" and col.tensor.dim() == 2 and col.tensor.shape[0] == B:
        n = col.tensor.shape[1]  # a padded column next to ragged ones: rows of n values each
        col = _Ragged(col.tensor.reshape(-1), torch.full((B,), n, dtype=torch.int64), col.owned)
    if isinstance(col, _Ragged):
        if lay.kind == "packed" or col.lengths.numel() != B:
            what = f"{col.lengths.numel()} rows" if lay.kind != "packed" else "one list per row"
            raise BatchFormatError(f"column '{name}' has {what} but '{lay.ref}' has "
                                   + (f"{B} rows" if lay.kind != "packed" else f"shape {lay.shape}"))
        if lay.kind == "padded" and bool((col.lengths != T).any()):
            r = int(torch.argmax((col.lengths != T).view(torch.uint8)))
            raise BatchFormatError(f"row {r}: column '{name}' has {int(col.lengths[r])} values but '{lay.ref}' "
                                   f"has {T}")
        differ = col.lengths != lay.lengths  # (B,)
        if lay.kind == "rows" and bool(differ.any()):
            r = int(torch.argmax(differ.view(torch.uint8)))
            raise BatchFormatError(f"row {r}: column '{name}' has {int(col.lengths[r])} values but '{lay.ref}' "
                                   f"has {int(lay.lengths[r])}")
        flat, owned = col.values, col.owned
    else:
        t = _numbers(col, name)
        if lay.kind == "padded":
            if tuple(t.shape) != lay.shape:
                raise BatchFormatError(f"column '{name}' has shape {tuple(t.shape)} but '{lay.ref}' has "
                                       f"shape {lay.shape}")
            return t if col.owned else t.clone()
        if lay.kind == "rows" or t.numel() != int(lay.lengths.sum()) or t.dim() > 2 or (
                t.dim() == 2 and t.shape[0] != 1):
            raise BatchFormatError(f"column '{name}' has shape {tuple(t.shape)} but '{lay.ref}' has "
                                   + (f"{B} rows of lists" if lay.kind == "rows" else f"shape {lay.shape}"))
        flat, owned = t.reshape(-1), col.owned
    if lay.pos is None:  # every row is full: a reshape
        out = flat.view(B, T)
        return out if owned else out.clone()
    out = torch.zeros(B, T, dtype=flat.dtype)  # (B, T)
    return out.masked_scatter_(lay.pos, flat)


def _float(x: torch.Tensor, text: bool) -> torch.Tensor:
    """Log-probs and advantages as float32, or float64 when a binary file stores float64."""
    return x.to(torch.float64 if x.dtype == torch.float64 and not text else torch.float32)


def _check_finite_tokens(x: torch.Tensor, mask: torch.Tensor, name: str, logprob: bool):
    bad = torch.isfinite(x).logical_not_().logical_and_(mask)  # (B, T), in place: no extra temporaries
    if bool(bad.any()):
        r, t = _first(bad)
        raise BatchFormatError(f"row {r}, token {t}: column '{name}' is {float(x[r, t])} on a loss token")
    if logprob:
        pos = (x > LOGPROB_TOLERANCE).logical_and_(mask)  # (B, T)
        if bool(pos.any()):
            r, t = _first(pos)
            raise BatchFormatError(f"row {r}, token {t}: column '{name}' is {float(x[r, t]):.6g} on a loss token; "
                                   f"a log-probability is at most 0 (up to {LOGPROB_TOLERANCE:g} for rounding)")


def _get(src: _Source, name: str):
    try:
        return src.load(name)
    except BatchFormatError:
        raise
    except Exception as e:  # a reader's own error on a damaged file
        raise BatchFormatError(f"column '{name}' could not be read ({type(e).__name__}: {e})") from None


def _scalar(v):
    if v is None or isinstance(v, (str, bool, int, float)):
        return v
    if isinstance(v, bytes):
        return v.decode("utf-8", errors="replace")
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, (list, tuple, dict)):
        try:
            return json.dumps(v, default=str)
        except (TypeError, ValueError, RecursionError):
            pass
    return str(v)


def _metadata_column(col, lay: _Layout) -> list | None:
    B = lay.B
    if isinstance(col, _Dense):
        t = col.tensor
        if t.is_floating_point() and t.dtype != torch.float64:
            t = t.to(torch.float64)
        if t.dim() == 0:
            return [t.item()] * B
        if tuple(t.shape) in ((B,), (B, 1)):
            return t.reshape(B).tolist()
        return None
    if isinstance(col, _Objects) and len(col.values) == B:
        return [_scalar(v) for v in col.values]
    if isinstance(col, _Const):
        return [_scalar(col.value)] * B
    return None


def _assemble(src: _Source, columns: dict | None) -> Batch:
    names = src.names
    seen = set()
    for n in names:
        if n in seen:
            raise BatchFormatError(f"column '{n}' appears twice")
        seen.add(n)
    roles = _resolve(names, columns)
    for req in ("trainer_logprobs", "inference_logprobs"):
        if roles[req] is None:
            raise _missing(req, names)
    adv_name, reward_name, gid_name = roles["advantages"], roles["reward"], roles["group_id"]
    if adv_name is None and (reward_name is None or gid_name is None):
        if reward_name is not None:
            raise BatchFormatError(f"column '{reward_name}' needs a group column to form GRPO groups (advantage "
                                   f"= reward - group mean): looked for 'group_id'; columns present: "
                                   f"{_listing(names)}")
        raise BatchFormatError(f"no advantages: looked for 'advantages', or 'reward' with 'group_id' (pass "
                               f"columns={{'advantages': <name>}} for another name); columns present: "
                               f"{_listing(names)}")

    tl_name, il_name, mask_name = roles["trainer_logprobs"], roles["inference_logprobs"], roles["loss_mask"]
    tl_col = _get(src, tl_name)
    lay = _layout(src, roles, tl_col, tl_name)
    _positions(lay)
    B, T = lay.B, lay.T
    if B == 0:
        raise BatchFormatError(f"no rollouts: column '{tl_name}' is empty")
    if T == 0:
        raise BatchFormatError(f"no tokens: every rollout in column '{tl_name}' is empty")

    # the mask first (small), then each log-prob column padded and checked before the next is read
    if mask_name is not None:
        m = _tokens(_get(src, mask_name), mask_name, lay)  # (B, T)
        if m.dtype != torch.bool:
            notbin = (m != 0) & (m != 1)  # (B, T), NaN included
            if lay.pos is not None:
                notbin &= lay.pos
            if bool(notbin.any()):
                r, t = _first(notbin)
                raise BatchFormatError(f"row {r}, token {t}: column '{mask_name}' is {m[r, t].item()}; a mask holds "
                                       f"0/1 or true/false")
            m = m != 0
        loss_mask = m if lay.pos is None else m & lay.pos
    else:
        loss_mask = lay.pos.clone() if lay.pos is not None else torch.ones(B, T, dtype=torch.bool)

    trainer = _float(_tokens(tl_col, tl_name, lay), src.text)  # (B, T)
    del tl_col
    _check_finite_tokens(trainer, loss_mask, tl_name, logprob=True)
    inference = _float(_tokens(_get(src, il_name), il_name, lay), src.text)  # (B, T)
    _check_finite_tokens(inference, loss_mask, il_name, logprob=True)
    valid = loss_mask.any(-1)  # (B,) rollouts with a loss token

    metadata: dict[str, list] = {}
    if adv_name is not None:
        advantages = _advantages(_get(src, adv_name), adv_name, lay, loss_mask, valid, src.text)
    else:
        reward = _numbers(_get(src, reward_name), reward_name)
        gid = _get(src, gid_name)
        advantages = _from_rewards(reward, gid, reward_name, gid_name, lay).to(trainer.dtype)
        metadata[reward_name] = reward.reshape(-1).tolist()
        metadata[gid_name] = _metadata_column(gid, lay)

    used = {roles[r] for r in ("trainer_logprobs", "inference_logprobs", "loss_mask", "advantages", "position_ids",
                               "seq_lens")}
    for name in names:
        if name in used or name in metadata or src.skip_extra(name, B):
            continue
        values = _metadata_column(_get(src, name), lay)
        if values is not None:
            metadata[name] = values
    try:
        return Batch(trainer, inference, advantages, loss_mask, metadata)
    except ValueError as e:
        raise BatchFormatError(str(e)) from None


def _advantages(col, name, lay: _Layout, loss_mask, valid, text) -> torch.Tensor:
    B, T = lay.B, lay.T
    per_rollout = False
    if not isinstance(col, _Ragged):
        t = _numbers(col, name)
        per_rollout = tuple(t.shape) in ((B,), (B, 1)) and not (lay.kind == "packed" and t.numel() == lay.shape[-1]
                                                                 and t.numel() != B)
        if lay.kind == "padded" and tuple(t.shape) == (B, 1) and T == 1:
            per_rollout = False
        if per_rollout:
            adv = _float(t.reshape(B), text)  # (B,)
            bad = valid & ~torch.isfinite(adv)
            if bool(bad.any()):
                r = int(torch.argmax(bad.view(torch.uint8)))
                raise BatchFormatError(f"row {r}: column '{name}' is {float(adv[r])}")
            return adv
        if lay.kind == "rows" and t.dim() == 1:
            raise BatchFormatError(f"column '{name}' has {t.numel()} values but '{lay.ref}' has {B} rows")
    adv = _float(_tokens(col, name, lay), text)  # (B, T)
    _check_finite_tokens(adv, loss_mask, name, logprob=False)
    return adv


def _from_rewards(reward, gid_col, reward_name, gid_name, lay: _Layout) -> torch.Tensor:
    B = lay.B
    if tuple(reward.shape) not in ((B,), (B, 1)):
        raise BatchFormatError(f"column '{reward_name}' has shape {tuple(reward.shape)}; expected one reward per "
                               f"rollout ({B})")
    reward = reward.reshape(B).to(torch.float64)  # (B,)
    if not bool(torch.isfinite(reward).all()):
        r = int(torch.argmax((~torch.isfinite(reward)).view(torch.uint8)))
        raise BatchFormatError(f"row {r}: column '{reward_name}' is {float(reward[r])}")
    if isinstance(gid_col, _Dense) and tuple(gid_col.tensor.shape) in ((B,), (B, 1)):
        g = gid_col.tensor.reshape(B)
        if g.is_floating_point() and not bool(torch.isfinite(g).all()):
            r = int(torch.argmax((~torch.isfinite(g)).view(torch.uint8)))
            raise BatchFormatError(f"row {r}: column '{gid_name}' is {float(g[r])}")
        _, inverse = torch.unique(g, return_inverse=True)  # (B,)
    elif isinstance(gid_col, _Objects) and len(gid_col.values) == B:
        ids: dict = {}
        for r, v in enumerate(gid_col.values):
            if not isinstance(v, (str, int, float, bool)):
                raise BatchFormatError(f"row {r}: column '{gid_name}' is {_short(v)}; a group id is a number or text")
        inverse = torch.tensor([ids.setdefault(v, len(ids)) for v in gid_col.values], dtype=torch.int64)
    else:
        what = _col_desc(gid_col)
        raise BatchFormatError(f"column '{gid_name}' {what}; expected one group id per rollout ({B})")
    n = int(inverse.max()) + 1
    count = torch.zeros(n, dtype=torch.float64).index_add_(0, inverse, torch.ones(B, dtype=torch.float64))
    mean = torch.zeros(n, dtype=torch.float64).index_add_(0, inverse, reward) / count  # (groups,)
    return reward - mean[inverse]  # (B,)


def _col_desc(col) -> str:
    if isinstance(col, _Dense):
        return f"has shape {tuple(col.tensor.shape)}"
    if isinstance(col, _Objects):
        return f"has {len(col.values)} values"
    if isinstance(col, _Ragged):
        return "holds one list per row"
    if isinstance(col, _Unusable):
        return col.reason
    return "is a single value"


# ---------------------------------------------------------------------------------------------------------
# load_batch


def _label(source) -> str:
    if isinstance(source, (str, os.PathLike)):
        return Path(source).name
    name = getattr(source, "name", None)
    return Path(name).name if isinstance(name, str) and name else f"<{type(source).__name__}>"


def _suffix(format: str | None, name: str) -> str:
    fmt = format if format is not None else Path(name).suffix
    if not fmt:
        raise BatchFormatError(f"cannot tell the format: the name {name!r} has no suffix; pass format= one of "
                               f"{', '.join(FORMATS)}")
    fmt = str(fmt).lower()
    fmt = fmt if fmt.startswith(".") else "." + fmt
    if fmt == ".pth":
        fmt = ".pt"
    if fmt not in FORMATS:
        raise BatchFormatError(f"unknown format {fmt!r}" + ("" if format else f" (from the name {name!r})")
                               + f"; accepted: {', '.join(FORMATS)}")
    return fmt


def _too_big(n: int, max_bytes) -> BatchFormatError:
    return BatchFormatError(f"is {n / 2**20:.1f} MB, over the {max_bytes / 2**20:.0f} MB limit "
                            f"(load_batch(..., max_bytes=...) raises it)")


def _read(source, max_bytes) -> Path | bytes:
    """A path (read by the format's own reader) or the bytes of an upload, after the size check."""
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        try:
            size = path.stat().st_size
        except OSError as e:
            raise BatchFormatError(f"cannot be opened ({e.strerror or e})") from None
        if not path.is_file():
            raise BatchFormatError("is not a file")
        if max_bytes is not None and size > max_bytes:
            raise _too_big(size, max_bytes)
        if size == 0:
            raise BatchFormatError("is empty (0 bytes)")
        return path
    if isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source)
    elif hasattr(source, "getvalue") or hasattr(source, "read"):
        size = getattr(source, "size", None)
        if isinstance(size, int) and max_bytes is not None and size > max_bytes:
            raise _too_big(size, max_bytes)
        try:
            if hasattr(source, "getvalue"):
                data = source.getvalue()
            else:
                if getattr(source, "seekable", lambda: False)():
                    source.seek(0)
                data = source.read() if max_bytes is None else source.read(max_bytes + 1)
        except Exception as e:
            raise BatchFormatError(f"cannot be read ({type(e).__name__}: {e})") from None
        if isinstance(data, str):
            data = data.encode("utf-8")
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise BatchFormatError(f"reading it gave {type(data).__name__}, not bytes")
        data = bytes(data)
    else:
        raise BatchFormatError(f"cannot read a {type(source).__name__}: pass a path, bytes or a file-like object "
                               f"with .read() and a .name")
    if max_bytes is not None and len(data) > max_bytes:
        raise _too_big(len(data), max_bytes)
    if not data:
        raise BatchFormatError("is empty (0 bytes)")
    return data


def _open(fmt: str, data: Path | bytes, max_bytes) -> _Source:
    try:
        if fmt in (".json", ".jsonl"):
            raw = data.read_bytes() if isinstance(data, Path) else data
            return _json_source(raw, jsonl=fmt == ".jsonl")
        if fmt == ".parquet":
            return _Parquet(data, max_bytes)
        if fmt == ".npz":
            return _Npz(data, max_bytes)
        if fmt == ".safetensors":
            return _Safetensors(data, max_bytes)
        return _pt_source(data, max_bytes)
    except BatchFormatError:
        raise
    except Exception as e:  # the format's reader refused it: unreadable, truncated or not this format
        raise BatchFormatError(f"is not a readable {fmt[1:]} file ({type(e).__name__}: {e})") from None


def _load(source, format, columns, max_bytes) -> Batch:
    """load_batch without its last-resort guard (the fuzz tests call this one)."""
    label = _label(source)
    try:
        data = _read(source, max_bytes)
        src = _open(_suffix(format, label), data, max_bytes)
        try:
            return _assemble(src, columns)
        finally:
            src.close()
    except BatchFormatError as e:
        raise BatchFormatError(f"{label}: {e}") from None


def load_batch(source, format: str | None = None, *, columns: dict[str, str] | None = None,
               max_bytes: int | None = MAX_BYTES) -> Batch:
    """Read a rollout batch from a path, bytes, or a file-like upload with a `.name` (Streamlit's UploadedFile).

    format: ".parquet", "jsonl", ... (default: the name's suffix). columns: role -> name in the file, for
    names other than the accepted ones (roles: trainer_logprobs, inference_logprobs, loss_mask, advantages,
    reward, group_id, position_ids, seq_lens). max_bytes: refuse larger files (None: no limit).
    Raises BatchFormatError (a ValueError) for anything that is not a valid batch.
    """
    try:
        return _load(source, format, columns, max_bytes)
    except BatchFormatError:
        raise
    except MemoryError:
        raise BatchFormatError(f"{_label(source)}: too large to load into memory") from None
    except Exception as e:  # last resort: the readers' errors are already translated, this should not happen
        raise BatchFormatError(f"{_label(source)}: could not be loaded ({type(e).__name__}: {e})") from e


# ---------------------------------------------------------------------------------------------------------
# save_batch

_LAYOUTS = {
    "rows": (".parquet", ".jsonl", ".json", ".pt"),
    "padded": FORMATS,
    "packed": (".npz", ".safetensors", ".pt", ".json"),
}


def save_batch(batch: Batch, path, *, format: str | None = None, layout: str | None = None,
               columns: dict[str, str] | None = None, split_by: str = "position_ids", compress: bool = False):
    """Write a batch in any format `load_batch` reads.

    layout: "rows" (one record per rollout, each as long as its last loss token; the default for parquet,
    jsonl and json), "padded" ([B, T]; the default for npz, safetensors and pt) or "packed" (1-D tokens split
    by `split_by`, "position_ids" or "seq_lens"). columns: role -> name to write, e.g. VERL_NAMES.
    compress: zip-deflate an npz. Positions off the loss mask that are not finite are written as 0.
    Metadata becomes per-rollout columns (text columns of a safetensors file go into its header).
    """
    path = Path(path)
    fmt = _suffix(format, path.name)
    layout = layout or ("rows" if fmt in (".parquet", ".jsonl", ".json") else "padded")
    if layout not in _LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(_LAYOUTS)}, got {layout!r}")
    if fmt not in _LAYOUTS[layout]:
        raise ValueError(f"layout {layout!r} cannot be written as {fmt}; it can as {', '.join(_LAYOUTS[layout])}")
    if split_by not in ("position_ids", "seq_lens"):
        raise ValueError(f"split_by must be 'position_ids' or 'seq_lens', got {split_by!r}")
    names = {r: (columns or {}).get(r, r) for r in ("trainer_logprobs", "inference_logprobs", "loss_mask",
                                                     "advantages")}
    written = set(names.values()) | ({split_by} if layout == "packed" else set())
    clash = sorted(set(batch.metadata) & written)
    if clash:
        raise ValueError(f"metadata column {clash[0]!r} clashes with a batch column of that name")

    mask = batch.loss_mask.detach().cpu()  # (B, T)
    B, T = mask.shape

    def clean(x):  # (B, T) off-mask non-finite values -> 0; bf16 only where the format has it
        x = x.detach().cpu()
        if x.dtype == torch.bfloat16 and fmt not in (".safetensors", ".pt"):
            x = x.float()
        return torch.where(mask | torch.isfinite(x), x, torch.zeros((), dtype=x.dtype))

    token_cols = {names["trainer_logprobs"]: clean(batch.trainer_logprobs),
                  names["inference_logprobs"]: clean(batch.inference_logprobs),
                  names["loss_mask"]: mask}
    adv = batch.advantages.detach().cpu()
    if adv.dtype == torch.bfloat16 and fmt not in (".safetensors", ".pt"):
        adv = adv.float()
    if adv.dim() == 2:
        token_cols[names["advantages"]] = clean(adv)
    row_cols = {names["advantages"]: adv} if adv.dim() == 1 else {}

    # each row's length: through its last loss token (rows, packed) or T (padded)
    last = torch.where(mask.any(-1), T - mask.flip(-1).to(torch.uint8).argmax(-1), 0)  # (B,)
    if layout == "padded":
        lengths = torch.full((B,), T, dtype=torch.int64)
    elif layout == "packed" and split_by == "position_ids":
        lengths = last.clamp(min=1)  # an empty rollout keeps one off-mask token, so it is not lost
    else:
        lengths = last
    pos = torch.arange(T)[None, :] < lengths[:, None]  # (B, T)

    if fmt == ".parquet":
        _write_parquet(path, token_cols, row_cols, batch.metadata, lengths, pos)
    elif fmt in (".jsonl", ".json") and layout != "packed":
        _write_json_rows(path, token_cols, row_cols, batch.metadata, lengths, jsonl=fmt == ".jsonl")
    elif layout == "rows":  # .pt
        rows = {k: list(torch.split(v[pos], lengths.tolist())) for k, v in token_cols.items()}
        torch.save({**rows, **row_cols, **_plain_metadata(batch.metadata)}, path)
    else:
        if layout == "packed":
            cols = {k: v[pos] for k, v in token_cols.items()}  # (N,) each
            if split_by == "position_ids":
                cols["position_ids"] = torch.arange(T).expand(B, T)[pos]  # (N,) restarting at 0
            else:
                cols["seq_lens"] = lengths
        else:
            cols = dict(token_cols)
        cols.update(row_cols)
        _write_arrays(path, fmt, cols, batch.metadata, compress)


def _plain_metadata(metadata: dict) -> dict[str, list]:
    return {k: [_scalar(v) for v in vs] for k, vs in metadata.items()}


def _numeric_metadata(values: list) -> np.ndarray | None:
    if values and all(isinstance(v, (bool, np.bool_)) for v in values):
        return np.array(values, dtype=bool)
    if values and all(isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)
                      for v in values):
        a = np.array(values)
        return a if a.dtype.kind in "if" else None
    return None


def _write_parquet(path, token_cols, row_cols, metadata, lengths, pos):
    import pyarrow as pa
    import pyarrow.parquet as pq

    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths.numpy(), out=offsets[1:])
    big = offsets[-1] >= 2**31
    data = {}
    for k, v in token_cols.items():
        values = pa.array(v[pos].numpy())
        cls = pa.LargeListArray if big else pa.ListArray
        data[k] = cls.from_arrays(pa.array(offsets if big else offsets.astype(np.int32)), values)
    for k, v in row_cols.items():
        data[k] = pa.array(v.numpy())
    for k, vs in _plain_metadata(metadata).items():
        try:
            data[k] = pa.array(vs)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            data[k] = pa.array([None if v is None else str(v) for v in vs])
    pq.write_table(pa.table(data), path, compression="zstd")


def _json_numbers(x: torch.Tensor) -> str:
    """A 1-D tensor as a JSON array; float32 in its shortest exact form, NaN/Infinity as Python writes them."""
    if x.dtype == torch.bool:
        return "[" + ",".join("true" if v else "false" for v in x.tolist()) + "]"
    if not x.is_floating_point():
        return json.dumps(x.tolist())
    a = x.numpy()
    items = [str(v) for v in a] if a.dtype == np.float32 else [repr(v) for v in a.tolist()]
    if not np.isfinite(a).all():
        special = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}
        items = [special.get(s, s) for s in items]
    return "[" + ",".join(items) + "]"


def _write_json_rows(path, token_cols, row_cols, metadata, lengths, jsonl: bool):
    meta = _plain_metadata(metadata)
    rows = []
    for j, n in enumerate(lengths.tolist()):  # a writer walks its rows; all math is elsewhere
        parts = [f"{json.dumps(k)}: {_json_numbers(v[j, :n])}" for k, v in token_cols.items()]
        parts += [f"{json.dumps(k)}: {_json_numbers(v[j:j + 1])[1:-1]}" for k, v in row_cols.items()]
        parts += [f"{json.dumps(k)}: {json.dumps(vs[j], default=str)}" for k, vs in meta.items()]
        rows.append("{" + ", ".join(parts) + "}")
    text = "\n".join(rows) + "\n" if jsonl else "[\n" + ",\n".join(rows) + "\n]\n"
    Path(path).write_text(text)


def _write_arrays(path, fmt, cols: dict[str, torch.Tensor], metadata, compress):
    meta = _plain_metadata(metadata)
    if fmt == ".json":
        doc = ", ".join(f"{json.dumps(k)}: {_json_numbers(v.reshape(-1))}" for k, v in cols.items())
        doc += "".join(f", {json.dumps(k)}: {json.dumps(vs, default=str)}" for k, vs in meta.items())
        Path(path).write_text("{" + doc + "}\n")
    elif fmt == ".pt":
        torch.save({**cols, **meta}, path)
    elif fmt == ".npz":
        arrays = {k: v.numpy() for k, v in cols.items()}
        for k, vs in meta.items():
            a = _numeric_metadata(vs)
            arrays[k] = a if a is not None else np.array(["" if v is None else str(v) for v in vs])
        (np.savez_compressed if compress else np.savez)(path, **arrays)
    else:  # safetensors: numeric metadata as tensors, the rest as JSON in the header
        from safetensors.torch import save_file

        tensors = {k: v.contiguous() for k, v in cols.items()}
        text = {}
        for k, vs in meta.items():
            a = _numeric_metadata(vs)
            if a is not None:
                tensors[k] = torch.from_numpy(a)
            else:
                text[k] = vs
        save_file(tensors, str(path), metadata={_SAFETENSORS_META: json.dumps(text)} if text else None)
