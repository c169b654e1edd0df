"""load_batch: a path, bytes or an upload in, a validated Batch out, every error as a BatchFormatError."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

from ..core.types import Batch
from .assemble import _assemble, require_loss_tokens
from .columns import FORMATS, LIMIT_HINT, MAX_BYTES, BatchFormatError, size_text
from .prime_rl import rank_files, read_prime_rl_bytes, read_prime_rl_files
from .prime_rl_lines import is_prime_rl_export
from .readers import _json_source, _Npz, _Parquet, _pt_source, _Safetensors, _Source

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
    return BatchFormatError(f"is {size_text(n)}, over the {size_text(max_bytes)} limit ({LIMIT_HINT})")


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
        if fmt in (".json", ".jsonl"):  # jsonl: line by line, from the path or over the bytes
            return _json_source(data, jsonl=fmt == ".jsonl")
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
        raise BatchFormatError(_unreadable(fmt, _head(data), e)) from None


# what a file's first bytes say it is, when its reader refused it
PICKLE_HEADS = tuple(bytes([0x80, v]) for v in range(2, 6))  # pickle protocols 2-5 start with PROTO, then the version
STARTS = {".parquet": (b"PAR1", "a parquet file", "its footer (the last bytes)"),
          ".npz": (b"PK\x03\x04", "a zip archive (npz)", "its central directory (the last bytes)"),
          ".pt": (b"PK\x03\x04", "a zip archive (torch.save)", "its central directory (the last bytes)")}


def _unreadable(fmt: str, head: bytes, e: Exception) -> str:
    """Why a file the format's reader refused cannot be read, in the file's terms: a pickle is a pickle, a file
    that starts as this format but lost its end is truncated; else the reader's own words."""
    if head.startswith(PICKLE_HEADS):
        return (f"is a Python pickle, not a {fmt[1:]} file: refused, because loading a pickle can run code (save the "
                f"batch as parquet, npz, safetensors or jsonl)")
    start = STARTS.get(fmt)
    text = str(e)
    if start and head.startswith(start[0]):
        return f"is truncated: it starts as {start[1]} but {start[2]} is missing (copy or download it again)"
    if fmt == ".safetensors" and "incomplete metadata" in text:
        return "is truncated: its header promises more bytes than the file has (copy or download it again)"
    if fmt == ".npz" and "pickled" in text:
        return ("holds pickled Python objects (object arrays): refused, because loading them can run code (save "
                "plain numeric arrays with np.savez)")
    return f"is not a readable {fmt[1:]} file ({type(e).__name__}: {e})"


def _head(data: Path | bytes) -> bytes:
    if isinstance(data, bytes):
        return data[:256]
    with open(data, "rb") as f:
        return f.read(256)


def _load_folder(path: Path, max_bytes) -> Batch:
    """A prime-rl token export step folder: every rank file, one batch; partial last lines skipped."""
    files = rank_files(path)
    if not files:
        raise BatchFormatError(f"{path.name}: a folder without rank_R.jsonl files (load_batch reads a file or a "
                               f"prime-rl step folder; a whole run: seqis.runs.load_run)")
    batch, notes = read_prime_rl_files(files, max_bytes=max_bytes)
    try:
        require_loss_tokens(batch)
    except BatchFormatError as e:
        raise BatchFormatError(f"{path.name}: {e}") from None
    for note in notes:
        warnings.warn(f"{path.name}/{note}", stacklevel=4)
    return batch


def _load(source, format, columns, max_bytes) -> Batch:
    """load_batch without its last-resort guard (the fuzz tests call this one)."""
    label = _label(source)
    if isinstance(source, (str, os.PathLike)) and Path(source).is_dir():
        return _load_folder(Path(source), max_bytes)
    try:
        data = _read(source, max_bytes)
        fmt = _suffix(format, label)
        if fmt == ".jsonl" and columns is None and is_prime_rl_export(_head(data)):
            batch = read_prime_rl_bytes(data.read_bytes() if isinstance(data, Path) else data)
        else:
            src = _open(fmt, data, max_bytes)
            try:
                batch = _assemble(src, columns)
            finally:
                src.close()
        require_loss_tokens(batch)  # every reader's batch: a file of prompts alone has nothing to estimate
        return batch
    except BatchFormatError as e:
        raise BatchFormatError(f"{label}: {e}") from None


def load_batch(source, format: str | None = None, *, columns: dict[str, str] | None = None,
               max_bytes: int | None = MAX_BYTES) -> Batch:
    """Read a rollout batch from a path, bytes, or a file-like upload with a `.name` (Streamlit's UploadedFile).
    A prime-rl token export (a rank_R.jsonl file, or a step folder of them) is read by seqis.io.prime_rl.

    format: ".parquet", "jsonl", ... (default: the name's suffix). columns: role -> name in the file, for
    names other than the accepted ones (roles: the keys of seqis.io.ALIASES). max_bytes: refuse larger files
    (None: no limit).
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


