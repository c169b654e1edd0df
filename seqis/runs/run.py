"""A training run on disk, step by step: `load_run(path)`, `r.steps`, `r.batch(step)`.

    from seqis.runs import load_run
    r = load_run("outputs/token_exports")   # prime-rl's export tree (or outputs/, or outputs/<run_id>/)
    r.steps                                 # complete steps, in order (prime-rl's STABLE marker written)
    r.unstable_steps                        # steps still being written: read only when asked
    batch = r.batch(r.steps[-1])            # every rank of the step as one Batch, with metadata and extras

A step's batch: a prime-rl step folder is read by seqis.io.prime_rl (every rank file, ranks in order); a
dump step is every file of the step through `load_batch`, rollouts concatenated in file-name order
(padded to the longest). A half-written last line of a rank file is skipped with a warning, never a crash.
"""

from __future__ import annotations

import tempfile
import warnings
from pathlib import Path

import torch

from ..core.types import Batch
from ..io import MAX_BYTES, load_batch, save_batch
from ..io.prime_rl import read_prime_rl_files
from .layout import StepFiles, find_steps


class Run:
    """The steps of one run; nothing is read until a batch is asked for. Its path, and so every step file's, is
    absolute (this process's folder joined in front of a relative one): a scan's tasks can run in other processes
    and on other machines, each with a folder of its own."""

    def __init__(self, path, run_id: str | None = None):
        self.path = Path(path).absolute()
        self.run_id = run_id
        self._steps = {s.step: s for s in find_steps(self.path, run_id)}

    @property
    def steps(self) -> list[int]:
        """Complete steps, in order."""
        return [s for s, f in self._steps.items() if f.stable]

    @property
    def unstable_steps(self) -> list[int]:
        """Steps whose writer has not finished (no STABLE marker yet)."""
        return [s for s, f in self._steps.items() if not f.stable]

    def files(self, step: int) -> StepFiles:
        if step not in self._steps:
            raise KeyError(f"{self.path}: no step {step} (steps {_span(list(self._steps))})")
        return self._steps[step]

    def read(self, step: int, *, extras: bool = True, max_bytes: int | None = MAX_BYTES) -> tuple[Batch, list[str]]:
        """The step's batch and notes on what was skipped (truncated last lines, empty files); max_bytes: the
        largest dump file to read (load_batch's)."""
        return read_step(self.files(step), extras=extras, max_bytes=max_bytes)

    def batch(self, step: int, *, extras: bool = True) -> Batch:
        """The step's rollouts as one Batch (a step still being written too: its partial lines skipped)."""
        batch, notes = self.read(step, extras=extras)
        for note in notes:
            warnings.warn(note, stacklevel=2)
        return batch

    def step_file(self, step: int) -> tuple[str, bytes]:
        """The step as one file's name and bytes that `load_batch` reads (to hand a step to a page that
        takes uploads): a prime-rl step's rank files, complete lines only, as one JSONL (extras and each
        record's rank kept); a dump step's file, or its files' rollouts as one parquet."""
        files = self.files(step)
        if files.prime_rl:
            parts = []
            for i, p in enumerate(files.files):
                data = files.spans[i].read(p) if files.spans else p.read_bytes()
                parts.append(data[: data.rfind(b"\n") + 1])  # a half-written last line stays behind
            return f"{self.path.name} step_{step}.jsonl", b"".join(parts)
        if len(files.files) == 1:
            return f"{self.path.name} {files.files[0].name}", files.files[0].read_bytes()
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / f"step_{step}.parquet"
            save_batch(self.batch(step), path)
            return f"{self.path.name} step_{step}.parquet", path.read_bytes()

    def __repr__(self) -> str:
        return f"Run({str(self.path)!r}, steps {_span(self.steps)}, {len(self.unstable_steps)} being written)"


def load_run(path, run_id: str | None = None) -> Run:
    """A run folder: prime-rl's token export tree or a folder of per-step dumps (see seqis.runs.layout)."""
    return Run(path, run_id)


def read_step(files: StepFiles, *, extras: bool = True, max_bytes: int | None = MAX_BYTES) -> tuple[Batch, list[str]]:
    """A step's batch and notes on what was skipped. Dumps get `step` (and `file`, when the step has several
    files) in their metadata unless they carry their own; each dump file is refused over max_bytes (load_batch's
    limit; prime-rl rank files have none)."""
    if files.prime_rl:
        batch, notes = read_prime_rl_files(files.files, extras=extras, tolerate_truncated=True,
                                           spans=list(files.spans) if files.spans else None)
        return batch, [*files.notes, *notes]
    parts = []
    for p in files.files:
        b = load_batch(p, max_bytes=max_bytes)
        labels = {"step": files.step, **({"file": p.name} if len(files.files) > 1 else {})}
        b.metadata.update({k: [v] * b.shape[0] for k, v in labels.items() if k not in b.metadata})
        parts.append(b)
    return concat(parts), []


def concat(batches: list[Batch]) -> Batch:
    """Rollouts of several batches as one, padded to the longest; metadata and extras kept (None / fill
    where a batch lacks a column)."""
    if len(batches) == 1:
        return batches[0]
    T = max(b.shape[1] for b in batches)
    pad = lambda x, fill: torch.nn.functional.pad(x, (0, T - x.shape[1]), value=fill) if x.dim() == 2 else x
    per_token = any(b.advantages.dim() == 2 for b in batches)
    adv = [b.advantages if not per_token or b.advantages.dim() == 2 else b.advantages[:, None].expand(b.shape)
           for b in batches]
    keys = list(dict.fromkeys(k for b in batches for k in b.metadata))
    metadata = {k: [v for b in batches for v in b.metadata.get(k, [None] * b.shape[0])] for k in keys}
    extras = {}
    for k in set.intersection(*(set(b.extras) for b in batches)):
        fill = -1 if not batches[0].extras[k].is_floating_point() else float("nan")
        extras[k] = torch.cat([pad(b.extras[k], fill) for b in batches])
    return Batch(
        torch.cat([pad(b.trainer_logprobs, 0.0) for b in batches]),
        torch.cat([pad(b.inference_logprobs, 0.0) for b in batches]),
        torch.cat([pad(a, 0.0) for a in adv]),
        torch.cat([pad(b.loss_mask, False) for b in batches]),
        metadata,
        extras=extras,
    )


def _span(steps: list[int]) -> str:
    return "none" if not steps else f"{steps[0]}..{steps[-1]} ({len(steps)})" if len(steps) > 1 else str(steps[0])
