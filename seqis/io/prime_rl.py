"""prime-rl's token export (`token_exports/step_N/rank_R.jsonl`) read as one Batch, with per-token extras.

prime-rl (PrimeIntellect-ai/prime-rl, src/prime_rl/trainer/rl/token_export.py, `enable_token_export`)
writes one JSON line per packed sequence: per-token lists over the whole sequence (prompt tokens carry
loss_mask false), non-finite floats written as null, and per-line fields (`step`, `rank`, `env_name`, ...).
Its schema moved while keeping `schema_version` 1; this reader reads only the fields it needs and accepts
every variant seen so far:

  mask for IS     the `rl` channel's: `losses[t]["rl"]["mask"]` in exports with per-channel `losses` records
                  (there `loss_mask` is the union of all channels: ce and ref_kl tokens too); else
                  `loss_mask & (rl_weights != 0)` when `rl_weights` is written (null: weight 1 on the loss
                  mask); else `loss_mask`
  advantages      `advantages` per token (the rl channel's values; `losses[t]["rl"]["advantage"]` if absent);
                  a Batch gets one per rollout when they are constant over its loss tokens, else (B, T)
  step            `export_step` (a multi-run export's run step) when present, else `step`
  extras          `entropy` -> Batch.extras["entropy"] (float32, NaN for null), `token_ids` ->
                  Batch.extras["token_ids"] (int64, -1 past a rollout's end)
  metadata        env_name, step, rank, line (1-based, in its rank's file), micro_step, micro_sequence_idx,
                  run_id (when written), reward (first non-null of `rewards`, when written)

prime-rl's own per-token results (`mismatch_kl`, `importance_ratio`, `is_masked`, ...: float32 k3 over all
tokens, its DPPO mask) are never read: seqis recomputes what it reports.

The sampler's head: none. prime-rl's exporter writes one sampler log-prob per token and nothing of the sampler's
top-k or sampling support (token_export.py at 559b44772e, 2026-08-21, the newest main fetched; likewise at
004274ec and d2f82fa). Its sampling replay and its IPO score centering carry `sampling_mask` (per token, the kept
ids) and `sampling_mask_logprobs` (the sampler's log-probs of them) from the inference server to the trainer only,
and the trainer's log-probs of those ids (`trainer_mask_logprobs`) exist only inside its loss; the newer trainer has
no token exporter at all (trace annotations instead: trainer_logprobs, entropies, mismatch_kl, is_masked). A Batch
read here has no head, and a score-centering correction on it says which fields it lacks (NO_HEAD, in a scan's
notes; docs/score-centering.md, "Heads in files").

Refusals (BatchFormatError) name the file and the 1-based line: a truncated last line (a file still being
written; `tolerate_truncated=True`, as for a step folder, skips it with a warning instead), a line that is
not JSON or has a field of the wrong type, a missing field, an unknown schema_version, token lists of
different lengths, a null or positive log-prob or a null advantage on a loss token.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import torch

from ..core.types import Batch
from .columns import LIMIT_HINT, BatchFormatError, size_text
from .prime_rl_lines import (
    LOGPROB_TOLERANCE,
    RANK_FILE,
    SCHEMA_VERSIONS,
    LineSpan,
    _complete_part,
    _line_numbers,
    _parse,
    line_stats,
)

NO_HEAD = ("prime-rl's token export (schema_version 1) writes no sampler head: its sampling mask and the sampler's "
           "and trainer's log-probs of it stay inside prime-rl (docs/score-centering.md, \"Heads in files\")")


def rank_files(folder: Path) -> list[Path]:
    """A step folder's rank files, by rank number (gaps allowed)."""
    found = [(int(m.group(1)), p) for p in Path(folder).iterdir() if (m := RANK_FILE.match(p.name)) and p.is_file()]
    return [p for _, p in sorted(found)]


# ---------------------------------------------------------------------------------------------------------
# one file's records: per-token fields end to end, aligned with trainer_logprobs, checked


def _list_field(table, name: str, fill=None):
    """A list field: (its values end to end over the records that have it, each record's length, which
    records have it)."""
    col = table.column(name).combine_chunks()
    present = col.is_valid().to_numpy(zero_copy_only=False)  # (R,)
    lengths = col.value_lengths().fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)  # (R,)
    values = col.flatten()
    return values if fill is None else values.fill_null(fill), lengths, present


def _numpy(values) -> np.ndarray:
    return values.to_numpy(zero_copy_only=False)  # nulls of a float field become NaN


class _Records:
    """One rank file's records, every per-token field aligned with trainer_logprobs' tokens."""

    def __init__(self, table, lines: np.ndarray, extras: bool):
        import pyarrow.compute as pc

        self.where = lambda r: f"line {lines[r]}"
        R = table.num_rows
        version = _numpy(table.column("schema_version"))  # (R,) float, NaN where absent
        unknown = ~np.isnan(version) & ~np.isin(version, SCHEMA_VERSIONS)
        if unknown.any():
            r = int(unknown.argmax())
            raise BatchFormatError(f"{self.where(r)}: schema_version {int(version[r])}; seqis reads prime-rl token "
                                   f"exports of schema_version {', '.join(map(str, SCHEMA_VERSIONS))}")
        tl, self.n, present = _list_field(table, "trainer_logprobs")  # n: (R,) tokens per record
        self._require(present, "trainer_logprobs")
        self.offsets = np.concatenate([[0], np.cumsum(self.n)])  # (R+1,)
        self.trainer = _numpy(tl)  # (N,) float32
        self.inference = self._aligned(table, "inference_logprobs", np.nan, required=True)

        losses = table.column("losses").combine_chunks()
        if losses.null_count < R:  # per-channel records: the rl channel's mask and advantages
            self._require(losses.is_valid().to_numpy(zero_copy_only=False), "losses")
            rl = pc.struct_field(losses.flatten(), "rl")  # (N,) struct, null where the token has no rl record
            self._same_length(losses.value_lengths().to_numpy(zero_copy_only=False), "losses")
            self.mask = _numpy(pc.struct_field(rl, "mask").fill_null(False))  # (N,) bool
            rl_advantages = _numpy(pc.struct_field(rl, "advantage"))
            advantages = self._aligned(table, "advantages", np.nan)
            self.advantages = np.where(np.isnan(advantages), rl_advantages, advantages)
        else:  # newer exports: loss_mask, and an rl weight stream (null: weight 1 on the loss mask)
            self.mask = self._aligned(table, "loss_mask", False, required=True, fill_values=False)
            weights = self._aligned(table, "rl_weights", np.nan)
            self.mask &= weights != 0  # NaN (no stream) != 0
            self.advantages = self._aligned(table, "advantages", np.nan, required=True)
        self._check(self.trainer, "trainer_logprobs", logprob=True)
        self._check(self.inference, "inference_logprobs", logprob=True)
        self._check(self.advantages, "advantages", logprob=False)

        self.extras = {}
        if extras:
            self.extras["entropy"] = self._aligned(table, "entropy", np.nan).astype(np.float32)
            self.extras["token_ids"] = self._aligned(table, "token_ids", -1, fill_values=-1).astype(np.int64)
        self.meta = self._metadata(table, lines)

    def _require(self, present: np.ndarray, field: str):
        if not present.any():
            raise BatchFormatError(f"no field '{field}' in any record (is this a prime-rl token export?)")
        if not present.all():
            raise BatchFormatError(f"{self.where(int((~present).argmax()))}: no field '{field}'")

    def _same_length(self, lengths: np.ndarray, field: str, present: np.ndarray | None = None):
        wrong = lengths != self.n
        if present is not None:
            wrong &= present
        if wrong.any():
            r = int(wrong.argmax())
            raise BatchFormatError(f"{self.where(r)}: field '{field}' has {lengths[r]} tokens, 'trainer_logprobs' "
                                   f"{self.n[r]}")

    def _aligned(self, table, field: str, fill, *, required: bool = False, fill_values=None) -> np.ndarray:
        """A per-token field as (N,) values aligned with trainer_logprobs; `fill` on records without it."""
        values, lengths, present = _list_field(table, field, fill_values)
        if required:
            self._require(present, field)
        self._same_length(lengths, field, present)
        values = _numpy(values)
        if present.all():
            return values
        out = np.full(int(self.offsets[-1]), fill, dtype=values.dtype if values.dtype != bool else bool)
        out[np.repeat(present, self.n)] = values
        return out

    def _check(self, x: np.ndarray, field: str, logprob: bool):
        bad = ~np.isfinite(x)  # (N,) null in the export (non-finite there), or absent
        if logprob:
            bad |= x > LOGPROB_TOLERANCE
        bad &= self.mask
        if bad.any():
            i = int(bad.argmax())
            r = int(np.searchsorted(self.offsets, i, side="right")) - 1
            what = "null (non-finite in the export)" if np.isnan(x[i]) else f"{x[i]:.6g} (a log-prob must be <= 0)"
            raise BatchFormatError(f"{self.where(r)}, token {i - self.offsets[r]}: '{field}' is {what} on a loss "
                                   f"token")

    def _metadata(self, table, lines: np.ndarray) -> dict[str, list]:
        col = lambda f: table.column(f).to_pylist()
        export_step = col("export_step")
        meta = {
            "env_name": col("env_name"),
            "step": [e if e is not None else s for e, s in zip(export_step, col("step"))],
            "rank": col("rank"),
            "line": lines.tolist(),
            "micro_step": col("micro_step"),
            "micro_sequence_idx": col("micro_sequence_idx"),
        }
        run_id = col("run_id")
        if any(v is not None for v in run_id):
            meta["run_id"] = run_id
        rewards, lengths, present = _list_field(table, "rewards")
        if present.any():
            values, starts = _numpy(rewards), np.concatenate([[0], np.cumsum(lengths)])
            meta["reward"] = [_first_number(values[a:b]) for a, b in zip(starts[:-1], starts[1:])]
        return meta


def _first_number(x: np.ndarray) -> float | None:
    finite = np.flatnonzero(np.isfinite(x))
    return float(x[finite[0]]) if finite.size else None


def _records(source: bytes | Path, extras: bool, tolerate_truncated: bool, notes: list[str],
             first_line: int = 1) -> _Records | None:
    """One file (its bytes, or its path) as records (None: no records); errors and notes name lines, the
    source's first line numbered `first_line` (a span of a larger file)."""
    end = _complete_part(source, tolerate_truncated, notes, first_line)
    stats = line_stats(source, end)  # one pass for the parser's block size and the line numbers
    table = _parse(source, end, extras, stats, first_line)
    if table.num_rows == 0:
        notes.append("no records")
        return None
    return _Records(table, _line_numbers(source, end, table.num_rows, stats, first_line), extras)


# ---------------------------------------------------------------------------------------------------------
# records of every file -> one Batch


def _padded(parts: list[np.ndarray], present: torch.Tensor, fill, dtype: torch.dtype) -> torch.Tensor:
    """(B, T) from each file's values end to end; `present` (B, T) marks each record's tokens."""
    out = torch.full(present.shape, fill, dtype=dtype)
    row = 0
    for part, rows in parts:
        block = present[row:row + rows]
        with warnings.catch_warnings():  # a read-only arrow buffer: only read from, never written to
            warnings.simplefilter("ignore")
            values = torch.from_numpy(np.ascontiguousarray(part))
        out[row:row + rows][block] = values.to(dtype)
        row += rows
    return out


def _batch(records: list[_Records]) -> Batch:
    n = torch.from_numpy(np.concatenate([r.n for r in records]))  # (B,) tokens per record
    T = int(n.max())
    present = torch.arange(T) < n[:, None]  # (B, T)
    pad = lambda field, fill, dtype: _padded([(getattr(r, field), len(r.n)) for r in records], present, fill, dtype)
    loss_mask = pad("mask", False, torch.bool)
    trainer = pad("trainer", 0.0, torch.float32)
    inference = pad("inference", 0.0, torch.float32)
    advantages = pad("advantages", 0.0, torch.float32).masked_fill_(~loss_mask, 0.0)  # (B, T)
    first = loss_mask.to(torch.uint8).argmax(1, keepdim=True)  # (B, 1) each record's first loss token
    per_record = advantages.gather(1, first).squeeze(1)  # (B,)
    if bool(((advantages == per_record[:, None]) | ~loss_mask).all()):
        advantages = per_record.masked_fill_(~loss_mask.any(1), 0.0)  # one advantage per rollout
    extras = {}
    for key, fill, dtype in (("entropy", float("nan"), torch.float32), ("token_ids", -1, torch.int64)):
        if key in records[0].extras:
            extras[key] = _padded([(r.extras[key], len(r.n)) for r in records], present, fill, dtype)
    meta = {k: [v for r in records for v in r.meta.get(k, [None] * len(r.n))] for k in _meta_keys(records)}
    return Batch(trainer, inference, advantages, loss_mask, meta, extras=extras)


def _meta_keys(records: list[_Records]) -> list[str]:
    keys: dict[str, None] = {}
    for r in records:
        keys.update(dict.fromkeys(r.meta))
    return list(keys)


def read_prime_rl_bytes(data: bytes, *, extras: bool = True) -> Batch:
    """One rank file's bytes as a Batch (load_batch's path for an upload); errors name the line."""
    records = _records(data, extras, tolerate_truncated=False, notes=[])
    if records is None:
        raise BatchFormatError("no records")
    return _batch([records])


def read_prime_rl_files(paths, *, extras: bool = True, tolerate_truncated: bool = True,
                        max_bytes: int | None = None, spans: list[LineSpan] | None = None) -> tuple[Batch, list[str]]:
    """One Batch from rank files, in the order given, and notes naming what was skipped (a truncated last
    line: a file still being written; an empty file). Errors name the file and the line. `spans`: the lines
    of each file to read (one LineSpan per path; prime-rl's first layout), else every line."""
    paths = [Path(p) for p in paths]
    if spans is not None and len(spans) != len(paths):
        raise ValueError(f"{len(spans)} spans for {len(paths)} files")
    sizes = [p.stat().st_size for p in paths] if spans is None else [s.end - s.start for s in spans]
    if max_bytes is not None and (total := sum(sizes)) > max_bytes:
        raise BatchFormatError(f"{paths[0].parent.name}: {size_text(total)} of rank files, over the "
                               f"{size_text(max_bytes)} limit ({LIMIT_HINT})")
    notes: list[str] = []
    records = []
    for i, p in enumerate(paths):
        file_notes: list[str] = []
        try:
            if spans is None:
                r = _records(p, extras, tolerate_truncated, file_notes)
            else:
                r = _records(spans[i].read(p), extras, tolerate_truncated, file_notes, spans[i].first_line)
        except BatchFormatError as e:
            raise BatchFormatError(f"{p.name}: {e}") from None
        except OSError as e:
            raise BatchFormatError(f"{p.name}: cannot be read ({e.strerror or e})") from None
        notes += [f"{p.name}: {n}" for n in file_notes]
        if r is not None:
            records.append(r)
    if not records:
        raise BatchFormatError(f"no records in {', '.join(p.name for p in paths) or 'no rank files'}")
    return _batch(records), notes


def read_prime_rl(path, *, extras: bool = True) -> Batch:
    """A prime-rl token export as one Batch: a rank file, or a step folder (every rank_R.jsonl in it, ranks
    in order, gaps allowed; a truncated last line is skipped with a warning)."""
    path = Path(path)
    if path.is_dir():
        files = rank_files(path)
        if not files:
            raise BatchFormatError(f"{path.name}: no rank_R.jsonl files (a prime-rl token export step folder)")
        batch, notes = read_prime_rl_files(files, extras=extras, tolerate_truncated=True)
    else:
        batch, notes = read_prime_rl_files([path], extras=extras, tolerate_truncated=False)
    for note in notes:
        warnings.warn(note, stacklevel=2)
    return batch
