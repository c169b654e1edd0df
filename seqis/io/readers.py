"""Readers, one per file format: each lists its columns and reads one on demand."""

from __future__ import annotations

import io
import json
import math
import pickle
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import torch

from .columns import (
    _MISSING,
    _SAFETENSORS_META,
    LIMIT_HINT,
    MAX_EXPANSION,
    BatchFormatError,
    _build_column,
    _column_value,
    _Const,
    _dense_from_numpy,
    _dense_from_torch,
    _Objects,
    _Ragged,
    _row_value,
    _Unusable,
    size_text,
)
from .head import RAW

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
            entries.append(v if str(k) in RAW else _row_value(v))  # the head's nested lists, as they are
        for entries in cols.values():
            if len(entries) < r + 1:
                entries.append(_MISSING)
        n = r + 1
    if n == 0:
        raise BatchFormatError("no rollouts (no records)")
    return _Table({k: _Objects([None if x is _MISSING else x for x in e]) if k in RAW else _build_column(k, e)
                   for k, e in cols.items()}, text)


def _cut_short(e: ValueError, text: str) -> bool:
    """The JSON parser ran out of text (a string never closed, or more expected at the very end): a file cut off
    mid-record, not a malformed one."""
    return isinstance(e, json.JSONDecodeError) and (e.msg.startswith("Unterminated string")
                                                     or e.pos >= len(text.rstrip()) - 1)


def _not_text(data: bytes, e: UnicodeDecodeError) -> BatchFormatError:
    if data[:1] == b"\x80" and data[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):  # pickle protocols 2-5
        return BatchFormatError("is a Python pickle, not JSON: refused, because loading a pickle can run code "
                                "(save the batch as parquet, npz, safetensors or jsonl)")
    return BatchFormatError(f"not UTF-8 text ({e})")


def _jsonl_rows(data: Path | bytes) -> Iterator[dict]:
    """A JSONL file's records, line by line (from the path, or over the bytes in memory): never the whole text
    decoded or split at once, so a 300 MB dump holds only one line's text at a time."""
    stream = data.open("rb") if isinstance(data, Path) else io.BytesIO(data)
    with stream:
        head = stream.read(2)
        stream.seek(0)
        line, i = stream.readline(), 0
        while line:
            following = stream.readline()
            try:
                text = line.decode("utf-8")
            except UnicodeDecodeError as e:
                raise _not_text(head if i == 0 else b"", e) from None
            if text.strip():
                try:
                    yield json.loads(text)
                except (ValueError, RecursionError) as e:
                    if not following and not text.endswith("\n") and _cut_short(e, text):
                        raise BatchFormatError(f"is truncated: its last line ({i + 1}) stops mid-record "
                                               f"(copy or download it again)") from None
                    raise BatchFormatError(f"line {i + 1}: not valid JSON ({e})") from None
            line, i = following, i + 1


def _json_source(data: Path | bytes, jsonl: bool) -> _Source:
    if jsonl:
        return _rows_table(_jsonl_rows(data), text=True)
    raw = data.read_bytes() if isinstance(data, Path) else data
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _not_text(raw, e) from None
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError) as e:
        if _cut_short(e, text):
            raise BatchFormatError("is truncated: the JSON stops mid-record (copy or download it again)") from None
        raise BatchFormatError(f"not valid JSON ({e})") from None
    return _python_source(obj, text=True)


def _python_source(obj, text: bool) -> _Source:
    """A json document or a .pt payload: a list of rollout records, or an object of columns."""
    if isinstance(obj, (list, tuple)):
        return _rows_table(obj, text)
    if isinstance(obj, dict):
        return _Table({str(k): _Objects(list(v)) if str(k) in RAW and isinstance(v, (list, tuple))
                       else _column_value(str(k), v) for k, v in obj.items()}, text)
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
                                   f"{size_text(max_bytes)} limit ({LIMIT_HINT})")

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
        if name in RAW:  # the head's nested lists (or vLLM's maps, as (id, logprob) pairs), as they are
            return _Objects(self.file.read(columns=[name], use_threads=False).column(0).to_pylist())
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
        if values.null_count:  # a NaN written by pandas or a JSON null: name the first one's row and token
            i = int(pc.index(values.is_null(), True).as_py())
            ends = np.cumsum(np.asarray(pc.list_value_length(arr).fill_null(0)))
            r = int(np.searchsorted(ends, i, side="right"))
            token = i - (int(ends[r - 1]) if r else 0)
            return _Unusable(f"row {row0 + r}, token {token}: column '{name}' is null or NaN ({values.null_count} "
                             f"such value{'s' * (values.null_count > 1)} in the column)")
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
                                   f"{MAX_EXPANSION}x the {size_text(max_bytes)} limit ({LIMIT_HINT})")

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


