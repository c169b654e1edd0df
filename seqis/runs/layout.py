"""Where a run's steps are: prime-rl's token export tree, or a folder of per-step dumps, found on disk.

prime-rl (`enable_token_export`) writes `<output_dir>/token_exports/step_N/rank_R.jsonl` (a multi-run
export: `<output_dir>/<run_id>/token_exports/step_N/...`) and touches `step_N/STABLE` once every rank has
flushed the step. A step folder without it is still being written. Exports from before prime-rl wrote the
marker (June 2026) have none anywhere: then every step folder counts as complete, and a half-written last
line is still skipped with a warning. prime-rl's very first layout, `token_exports/rank_R.jsonl` with every
step appended (May 2026), is cut into steps by each line's `step` (seqis.runs.flat).

A folder of dumps: files in any `load_batch` format whose name carries the step (`step_12.parquet`,
`global_step-12_rank_0.npz`), several files per step allowed; or step_N/ folders of such files.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass
from pathlib import Path

from ..io import FORMATS
from ..io.prime_rl import rank_files
from ..io.prime_rl_lines import LineSpan
from .flat import flat_steps

STEP_DIR = re.compile(r"^step_(\d+)$")
STEP_IN_NAME = re.compile(r"(?:^|[^a-z])step[_\-]?(\d+)", re.IGNORECASE)
STABLE = "STABLE"


class NoSteps(ValueError):
    """A folder that holds no steps (yet: a trainer that has not exported its first step)."""


@dataclass(frozen=True)
class StepFiles:
    """One step's files on disk, and whether the writer has finished it."""

    step: int
    files: tuple[Path, ...]
    stable: bool
    prime_rl: bool  # rank_R.jsonl token export files (else dumps that load_batch reads)
    spans: tuple[LineSpan, ...] = ()  # the step's lines of each file (prime-rl's first layout), else every line
    notes: tuple[str, ...] = ()  # what finding the step noticed (a step written twice)

    def fingerprint(self) -> str:
        """Names, sizes and modification times (a span: where its lines are, and a checksum of their first
        bytes): a rescan rereads the step when any of them changes."""
        parts = []
        for i, p in enumerate(self.files):
            if self.spans:
                span = self.spans[i]
                with open(p, "rb") as f:
                    f.seek(span.start)
                    head = f.read(min(span.end - span.start, 4096))
                parts.append(f"{p.name}@{span.start}-{span.end}:{zlib.crc32(head):08x}")
            else:
                st = p.stat()
                parts.append(f"{p.name}:{st.st_size}:{st.st_mtime_ns}")
        return f"{int(self.stable)}|" + ";".join(parts)

    def n_bytes(self) -> int:
        if self.spans:
            return sum(s.end - s.start for s in self.spans)
        return sum(p.stat().st_size for p in self.files)


def _loadable(p: Path) -> bool:
    return p.is_file() and p.suffix.lower() in FORMATS and not p.name.startswith(".")  # .hidden: being written


def _step_dirs(folder: Path) -> dict[int, Path]:
    return {int(m.group(1)): p for p in folder.iterdir() if (m := STEP_DIR.match(p.name)) and p.is_dir()}


def _export_root(path: Path, run_id: str | None) -> Path:
    """The folder that holds step_N/ folders or step-named dumps."""
    if run_id is not None:
        for candidate in (path / run_id / "token_exports", path / run_id):
            if candidate.is_dir():
                return _export_root(candidate, None)
        raise FileNotFoundError(f"{path}: no run '{run_id}' (looked for {path / run_id / 'token_exports'})")
    if _step_dirs(path) or rank_files(path) or any(STEP_IN_NAME.search(p.stem) for p in path.iterdir() if _loadable(p)):
        return path
    if (path / "token_exports").is_dir():
        return _export_root(path / "token_exports", None)
    runs = sorted(p.parent.name for p in path.glob("*/token_exports") if p.is_dir())
    if len(runs) == 1:
        return _export_root(path / runs[0] / "token_exports", None)
    if runs:
        raise ValueError(f"{path} holds several runs ({', '.join(runs)}): pass run_id=")
    raise NoSteps(f"{path}: no steps found (looked for step_N/ folders, rank_R.jsonl, token_exports/, "
                     f"<run_id>/token_exports/ and files named like step_12.parquet)")


def find_steps(path, run_id: str | None = None) -> list[StepFiles]:
    """Every step under `path` (complete or not), by step number."""
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: not a folder (a run is a folder of steps)")
    root = _export_root(path, run_id)
    dirs = _step_dirs(root)
    markers = any((d / STABLE).exists() for d in dirs.values())
    steps: dict[int, StepFiles] = {}
    for step, d in dirs.items():
        ranks = tuple(rank_files(d))
        files = ranks or tuple(sorted(p for p in d.iterdir() if _loadable(p)))
        if files:
            stable = (d / STABLE).exists() or not markers
            steps[step] = StepFiles(step, files, stable, prime_rl=bool(ranks))
    found: dict[int, StepFiles] = {}
    named: dict[int, list[Path]] = {}
    for p in root.iterdir():
        if _loadable(p) and (m := STEP_IN_NAME.search(p.stem)):
            named.setdefault(int(m.group(1)), []).append(p)
    for step, files in named.items():
        found[step] = StepFiles(step, tuple(sorted(files)), stable=True, prime_rl=False)
    for step, (files, spans, notes) in flat_steps(rank_files(root)).items():  # no markers in that layout
        if step in found:
            raise ValueError(f"{root}: step {step} is both in {files[0].name} and {found[step].files[0].name}")
        found[step] = StepFiles(step, tuple(files), stable=True, prime_rl=True, spans=tuple(spans), notes=tuple(notes))
    for step, files in found.items():
        if step in steps:
            raise ValueError(f"{root}: step {step} is both a step_{step}/ folder and {files.files[0].name}")
        steps[step] = files
    return [steps[s] for s in sorted(steps)]
