"""One prime-rl token-export file, line-safe: the complete part of a file still being written, each row's
line number, the first bad line named, and the fields the reader needs parsed by pyarrow."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import NamedTuple

import numpy as np

from .columns import BatchFormatError

SCHEMA_VERSIONS = (1,)  # the versions this reader knows (prime-rl has written 1 since the export began)
LOGPROB_TOLERANCE = 1e-6  # a log-prob above this on a loss token is refused (as load_batch does)
RANK_FILE = re.compile(r"^rank_(\d+)\.jsonl$")
_BLOCK = 1 << 20  # pyarrow JSON block (grown to the file's longest line): the parser holds a few at once
_CHUNK = 1 << 20  # bytes read at a time when counting lines, into one reused buffer


class LineSpan(NamedTuple):
    """Whole lines of a file: bytes [start, end) and the 1-based line number of the first (prime-rl's first
    export layout appends every step to one file per rank: a step is a span of each file)."""

    start: int
    end: int
    first_line: int

    def read(self, path: Path) -> bytes:
        with open(path, "rb") as f:
            f.seek(self.start)
            return f.read(self.end - self.start)


def _schema(extras: bool):
    """The fields read (pyarrow skips every other one without building it)."""
    import pyarrow as pa

    floats = pa.list_(pa.float32())
    rl = pa.struct([("advantage", pa.float32()), ("mask", pa.bool_())])
    fields = [
        ("trainer_logprobs", floats), ("inference_logprobs", floats), ("loss_mask", pa.list_(pa.bool_())),
        ("advantages", floats), ("rl_weights", floats), ("rewards", floats),
        ("losses", pa.list_(pa.struct([("rl", rl)]))),
        ("schema_version", pa.int64()), ("step", pa.int64()), ("export_step", pa.int64()), ("rank", pa.int64()),
        ("micro_step", pa.int64()), ("micro_sequence_idx", pa.int64()), ("run_id", pa.string()),
        ("env_name", pa.string()),
    ]
    if extras:
        fields += [("entropy", floats), ("token_ids", pa.list_(pa.int64()))]
    return pa.schema(fields)


def is_prime_rl_export(head: bytes) -> bool:
    """True when a JSONL file's first bytes are a prime-rl token export record (its first key)."""
    return re.match(rb'\s*\{\s*"schema_version"\s*:', head) is not None




# ---------------------------------------------------------------------------------------------------------
# one file: bytes -> a table of the needed fields, with each row's line number


def _bytes(source: bytes | Path, end: int | None = None) -> bytes:
    data = source if isinstance(source, bytes) else source.read_bytes()
    return data if end is None else data[:end]


def _size(source: bytes | Path) -> int:
    return len(source) if isinstance(source, bytes) else source.stat().st_size


def _tail(source: bytes | Path, n: int) -> bytes:
    if isinstance(source, bytes):
        return source[-n:]
    with open(source, "rb") as f:
        f.seek(max(0, _size(source) - n))
        return f.read()


def _complete_part(source: bytes | Path, tolerate_truncated: bool, notes: list[str], first_line: int = 1) -> int:
    """Where the file's complete lines end: a last line without its newline that is not whole JSON is a
    record still being written (refused, or skipped with a note). A file is read from its end only.
    `first_line`: the line number of the source's first line (a span of a larger file)."""
    size = _size(source)
    tail = _tail(source, 1 << 20)
    if not tail or tail.endswith(b"\n"):
        return size
    if b"\n" not in tail and len(tail) < size:  # a last line over 1 MB: look at the whole file
        tail = _bytes(source)
    cut = size - len(tail) + tail.rfind(b"\n") + 1
    rest = tail[tail.rfind(b"\n") + 1:]
    if not rest.strip():
        return size
    try:
        json.loads(rest)
        return size
    except (ValueError, RecursionError):
        pass
    line = _count_newlines(source, cut) + first_line
    msg = f"line {line}: truncated JSON line (a file still being written?)"
    if not tolerate_truncated:
        raise BatchFormatError(msg + "; loading its step folder skips such a line")
    notes.append(msg + ": skipped")
    return cut


def _chunks(source: bytes | Path, end: int):
    """The first `end` bytes as memoryviews of at most _CHUNK bytes (a file read into one reused buffer:
    it never sits in memory whole, and counting its lines allocates nothing per chunk)."""
    if isinstance(source, bytes):
        view = memoryview(source)
        for i in range(0, end, _CHUNK):
            yield view[i:min(end, i + _CHUNK)]
        return
    buffer = bytearray(_CHUNK)
    with open(source, "rb") as f:
        while end > 0 and (n := f.readinto(memoryview(buffer)[:min(end, _CHUNK)])):
            yield memoryview(buffer)[:n]
            end -= n


def _count_newlines(source: bytes | Path, end: int) -> int:
    if isinstance(source, bytes):
        return source.count(b"\n", 0, end)
    return sum(chunk.obj.count(b"\n", 0, len(chunk)) for chunk in _chunks(source, end))


class LineStats(NamedTuple):
    """The first `end` bytes' newlines and their longest line (its newline counted), from one pass."""

    newlines: int
    longest: int


def line_stats(source: bytes | Path, end: int) -> LineStats:
    """One read of the bytes gives both what the parser needs (the longest line sizes its blocks) and what the
    line numbers need (the count of newlines)."""
    longest = run = count = 0  # run: bytes since the last newline
    for chunk in _chunks(source, end):
        newlines = np.flatnonzero(np.frombuffer(chunk, np.uint8) == 10)  # (K,) positions in the chunk
        count += newlines.size
        if newlines.size == 0:
            run += len(chunk)
            continue
        gaps = np.diff(newlines)
        longest = max(longest, run + int(newlines[0]) + 1, int(gaps.max()) if gaps.size else 0)
        run = len(chunk) - int(newlines[-1]) - 1
    return LineStats(count, max(longest, run))


def _last_byte(source: bytes | Path, end: int) -> bytes:
    if isinstance(source, bytes):
        return source[end - 1:end]
    with open(source, "rb") as f:
        f.seek(end - 1)
        return f.read(1)


def _line_numbers(source: bytes | Path, end: int, n_rows: int, stats: LineStats, first_line: int = 1) -> np.ndarray:
    """Line number of each record (blank lines are not records), the source's first line `first_line`."""
    n_lines = stats.newlines + (end > 0 and _last_byte(source, end) != b"\n")
    if n_rows == n_lines:
        return np.arange(first_line, first_line + n_rows)
    lines = _bytes(source, end).split(b"\n")
    return np.array([i + first_line for i, line in enumerate(lines) if line.strip()][:n_rows])


def _kind_of(v) -> str:
    return "null" if v is None else type(v).__name__


def _bad_line(source: bytes | Path, end: int, schema, first_line: int = 1) -> BatchFormatError | None:
    """The first line pyarrow could not read, named (a slow second pass, only after a failure)."""
    import pyarrow as pa

    for i, line in enumerate(_bytes(source, end).split(b"\n")):
        if not line.strip():
            continue
        where = f"line {i + first_line}"
        try:
            rec = json.loads(line)
        except (ValueError, RecursionError) as e:
            return BatchFormatError(f"{where}: not valid JSON ({e})")
        if not isinstance(rec, dict):
            return BatchFormatError(f"{where}: expected a JSON object, got {_kind_of(rec)}")
        for f in schema:
            v = rec.get(f.name)
            if v is None:
                continue
            if pa.types.is_list(f.type):
                if not isinstance(v, list):
                    return BatchFormatError(f"{where}: field '{f.name}' holds a {_kind_of(v)}, expected a list")
                if f.name == "losses":
                    if any(x is not None and not isinstance(x, dict) for x in v):
                        return BatchFormatError(f"{where}: field 'losses' holds a non-object record")
                    continue
                for t, x in enumerate(v):
                    if x is not None and not isinstance(x, (int, float)):
                        return BatchFormatError(f"{where}, token {t}: field '{f.name}' holds {_kind_of(x)} "
                                                f"{str(x)[:30]!r}, expected a number")
            elif pa.types.is_string(f.type) and not isinstance(v, str):
                return BatchFormatError(f"{where}: field '{f.name}' holds a {_kind_of(v)}, expected a string")
            elif pa.types.is_integer(f.type) and (isinstance(v, bool) or not isinstance(v, int)):
                return BatchFormatError(f"{where}: field '{f.name}' holds {v!r}, expected an integer")
    return None


def _parse(source: bytes | Path, end: int, extras: bool, stats: LineStats, first_line: int = 1):
    """The needed fields of the first `end` bytes; a whole file on disk is streamed, never held in memory."""
    import pyarrow as pa
    import pyarrow.json as pj

    schema = _schema(extras)
    whole_file = isinstance(source, Path) and end == _size(source)
    data = None if whole_file else pa.py_buffer(_bytes(source, end))
    parse = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    # blocks of 1 MB, or of the longest line (pyarrow refuses a line that spans a whole block); one thread (the
    # scan's engines run one step per core) and the system allocator: the parser's scratch memory goes back
    # (pyarrow's default mimalloc and its threads kept 3x as much resident on a 16 MB step, 4 MB blocks about
    # twice as much as 1 MB ones: measured with seqis/bench/runs.py's probe)
    block = max(_BLOCK, stats.longest + 1)
    try:
        return pj.read_json(str(source) if whole_file else pa.BufferReader(data),
                            read_options=pj.ReadOptions(block_size=block, use_threads=False), parse_options=parse,
                            memory_pool=pa.system_memory_pool())
    except pa.ArrowInvalid as e:
        bad = _bad_line(source, end, schema, first_line)
        raise bad or BatchFormatError(f"unreadable as JSON lines ({e})") from None


