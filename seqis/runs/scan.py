"""`scan`: every step of a run through diagnostics, the estimators and the diagnosis, as one table.

    from seqis.runs import scan, read_scan
    df = scan("outputs/token_exports", estimators=["seq_tis", "mis_po"], by="env_name", out="scan.parquet")
    df.attrs["summary"]     # steps scanned, reused from the cache, failed (with file and line), lines skipped
    df = read_scan("scan.parquet")

One row per (step, group, estimator) (the columns: seqis.runs.step), worst first: the diagnosis's
severity (bad, warn, ok), then the per-token KL (kl_k3), then step, group and the estimators' order.

Streaming: steps are read and reduced to rows by the engine a few at a time (seqis.runs.engines), so
memory is bounded by a few steps whatever the run's size. Incremental: with `out=`, rows already in that
parquet are reused for every step whose files have the same names, sizes and modification times (and
the same estimators and `by`); only new or changed steps are read. Steps still being written (no STABLE
marker) are left out unless `include_unstable=True` (and never cached). A step that cannot be read is
reported (file and line) in the summary and warned about, and the scan goes on. A step whose batch has no
`by` column is scanned as one group (its rows have group None alone) and listed in the summary's
"ungrouped", with a note in its "notes". A correction that reads the sampler's head (score centering) has no rows
for a step whose batch has none (a prime-rl token export never has one): a note names it, the steps and the fields.

Live: `follow(path, out="scan.parquet", interval=5)` keeps a `Scanner` (each step's rows under its files'
fingerprint) and looks at the run again every `interval` seconds, reading only the steps that landed or changed
and rewriting the parquet whole after each; `python -m seqis scan PATH --out scan.parquet --follow` runs it
until SIGINT or SIGTERM. `scan(..., reuse=earlier_table)` reuses an in-memory table's rows as the parquet's
are (the Run page's Follow switch).
"""

from __future__ import annotations

import json
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import pandas as pd

from ..estimators import ESTIMATORS
from ..io import MAX_BYTES
from ..io.prime_rl import NO_HEAD
from ..registry import head_fields
from .engines import ENGINES
from .layout import NoSteps
from .run import load_run
from .step import ScanSettings

SEVERITY_RANK = {"bad": 0, "warn": 1, "ok": 2}
_META_KEY = b"seqis.scan"
_LAST = ("dropped", "severity", "finding", "findings", "fingerprint")  # after the metrics, in this order


def _known_names() -> set[str]:
    names = set(ESTIMATORS)
    try:
        from .. import PRESETS  # framework presets, where the registry has them
    except ImportError:
        return names
    return names | set(PRESETS)


def _cached(old: pd.DataFrame | None, settings: ScanSettings) -> dict[int, tuple[str, pd.DataFrame]]:
    """step -> (fingerprint, rows) from an earlier scan's table made with the same settings."""
    if old is None or old.attrs.get("settings") != settings.key() or "fingerprint" not in old:
        return {}
    return {int(step): (rows["fingerprint"].iloc[0], rows) for step, rows in old.groupby("step")}


def _read_cache(out: Path | None) -> pd.DataFrame | None:
    if out is None or not out.exists():
        return None
    try:
        return read_scan(out)
    except (OSError, ValueError):
        return None


def order_rows(df: pd.DataFrame, estimators: tuple[str, ...]) -> pd.DataFrame:
    """Worst first: severity, then kl_k3 (descending), then step, group and estimator order."""
    if df.empty:
        return df
    key = pd.DataFrame({
        "severity": df["severity"].map(SEVERITY_RANK).fillna(len(SEVERITY_RANK)),
        "kl": -df["kl_k3"],
        "step": df["step"],
        "group": df["group"].fillna(""),
        "estimator": df["estimator"].map({e: i for i, e in enumerate(estimators)}),
    })
    return df.loc[key.sort_values(list(key.columns), kind="stable").index].reset_index(drop=True)


def incidents(df: pd.DataFrame, n: int = 10, *, jump: float = 10.0) -> pd.DataFrame:
    """The worst (step, group) pairs of a scan, one row each (its first estimator's), worst first: those the
    diagnosis calls bad or warn; without a diagnosis (or beside it), those whose kl_k3 is over `jump` times
    their group's median over the run. Adds `reason`: the finding, or "kl_k3 N x the median"."""
    if df.empty:
        return df.assign(reason=pd.Series(dtype=str))
    pairs = df.drop_duplicates(["step", "group"]).copy()  # rows are worst first already
    group = pairs["group"].fillna("\x00")
    median = pairs.groupby(group)["kl_k3"].transform("median")
    times = pairs["kl_k3"] / median.where(median > 0)
    flagged = pairs["severity"].isin(["bad", "warn"]) | (times > jump)
    found = pairs[flagged].head(n)
    reason = [f"{sev}: {kind}" if isinstance(sev, str) and sev != "ok" else f"kl_k3 {t:.0f}x the median"
              for sev, kind, t in zip(found["severity"], found["finding"], times[flagged].head(n))]
    return found.assign(reason=reason).reset_index(drop=True)


class Scanner:
    """A run's scan kept up to date: each step's rows, reused while the step's files keep their fingerprint, so
    `update()` reads only steps that are new or changed (or were being written, or failed, and have changed
    since). `table()` is the scan of what is on disk now; a step that left the disk leaves the table."""

    def __init__(self, path, estimators=None, by: str | None = None, engine: str = "local", *,
                 include_unstable: bool = False, workers: int | None = None, run_id: str | None = None,
                 reuse: pd.DataFrame | None = None, max_bytes: int | None = MAX_BYTES):
        names = tuple(estimators) if estimators is not None else tuple(ESTIMATORS)
        unknown = [n for n in names if n not in _known_names()]
        if unknown:
            raise ValueError(f"unknown estimator {unknown[0]!r}; known: {', '.join(sorted(_known_names()))}")
        if engine not in ENGINES:
            raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
        self.path, self.run_id, self.engine, self.workers = path, run_id, engine, workers
        self.include_unstable = include_unstable
        self.settings = ScanSettings(names, by, max_bytes)
        self.rows: dict[int, tuple[str, pd.DataFrame]] = {}  # step -> (fingerprint, its rows)
        self._cache = _cached(reuse, self.settings)  # rows an earlier table offers, taken while unchanged
        self.reused: set[int] = set()  # steps whose rows came from it
        self.failed: dict[int, tuple[str, str]] = {}  # step -> (fingerprint, what went wrong)
        self.notes: dict[int, list[str]] = {}  # step -> lines skipped
        self.unstable: list[int] = []
        self.prime_rl = False  # the run is a prime-rl token export (no sampler head: score centering cannot run)
        self.run_path: str = str(path)
        self.scanned = 0  # steps read by this scanner
        self.seconds = 0.0

    def pending(self) -> list:
        """The run's steps read from disk anew; those that need reading (StepFiles), in step order."""
        run = load_run(self.path, self.run_id)
        self.run_path = str(run.path)
        self.unstable = [] if self.include_unstable else run.unstable_steps
        steps = [run.files(s) for s in run.steps + (run.unstable_steps if self.include_unstable else [])]
        self.prime_rl = any(f.prime_rl for f in steps)
        on_disk = {f.step for f in steps}
        for gone in set(self.rows) - on_disk:
            del self.rows[gone]
        for gone in set(self.failed) - on_disk:
            del self.failed[gone]
        todo = []
        for files in sorted(steps, key=lambda f: f.step):
            fingerprint = files.fingerprint()
            offered = self._cache.pop(files.step, None)
            if offered is not None and offered[0] == fingerprint:  # (a step being written was cached with none)
                self.rows[files.step] = offered
                self.reused.add(files.step)
            elif self.rows.get(files.step, ("",))[0] == fingerprint:
                pass  # read before, unchanged
            elif self.failed.get(files.step, ("",))[0] != fingerprint:
                todo.append(files)
        self._cache.clear()  # what was not taken now is stale
        return todo

    def update(self, todo=None) -> Iterator[dict]:
        """Read the pending steps (or `todo`) with the engine, keeping each one's rows as it finishes; yields the
        engine's result for each step (step, rows, notes, error) in completion order."""
        todo = self.pending() if todo is None else todo
        started = time.perf_counter()
        stable = {f.step: f.stable for f in todo}
        try:
            for result in ENGINES[self.engine](todo, self.settings, self.workers):
                step = result["step"]
                self.notes[step] = list(result["notes"])
                for note in result["notes"]:
                    warnings.warn(f"step {step}: {note}", stacklevel=2)
                if result["error"] is not None:
                    self.failed[step] = (result["fingerprint"], result["error"])
                    self.rows.pop(step, None)
                    self.reused.discard(step)
                    warnings.warn(result["error"], stacklevel=2)
                else:
                    self.failed.pop(step, None)
                    self.reused.discard(step)
                    self.scanned += 1
                    # a step being written is kept here under its fingerprint but written with none: never reused
                    kept = result["fingerprint"] if stable[step] else ""
                    rows = pd.DataFrame([{**row, "fingerprint": kept} for row in result["rows"]])
                    self.rows[step] = (result["fingerprint"], rows)
                yield result
        finally:
            self.seconds += time.perf_counter() - started

    def state(self) -> tuple:
        """What the table is made of: it changes when any step's rows, failure or being-written status does."""
        return (tuple((step, fp) for step, (fp, _) in sorted(self.rows.items())), tuple(sorted(self.failed.items())),
                tuple(self.unstable))

    def table(self) -> pd.DataFrame:
        """The scan of the steps held now, worst first, with its settings and summary in `.attrs`."""
        frames = [rows for step, (_, rows) in sorted(self.rows.items()) if not rows.empty]
        # no step read: an empty table with the columns read_scan asks for, so the file written reads back
        df = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["step", "group", "estimator",
                                                                                       "kl_k3"])
        last = [c for c in _LAST if c in df]
        df = order_rows(df[[c for c in df if c not in last] + last], self.settings.estimators)
        steps = set(self.rows) | set(self.failed)
        summary = {"steps": len(steps), "scanned": self.scanned, "cached": len(self.reused),
                   "failed": [error for _, (_, error) in sorted(self.failed.items())],
                   "skipped": [note for step in sorted(self.rows) for note in self.notes.get(step, [])],
                   "unstable_left_out": self.unstable, "seconds": self.seconds}
        summary["ungrouped"], summary["notes"] = _ungrouped(df, self.settings.by)
        summary["notes"] += _not_run(df, self.settings.estimators, self.prime_rl)
        df.attrs.update(settings=self.settings.key(), summary=summary, path=self.run_path)
        return df


def scan(path, estimators=None, by: str | None = None, engine: str = "local", *, out=None,
         include_unstable: bool = False, workers: int | None = None, run_id: str | None = None,
         progress: Callable[[int, int, int], None] | None = None, reuse: pd.DataFrame | None = None,
         max_bytes: int | None = MAX_BYTES) -> pd.DataFrame:
    """Scan a run (see the module docstring). estimators: names or preset keys (None: every registry
    estimator); by: a metadata column to group by (env_name, rank, ...); engine: "local" or "ray";
    workers: processes (local) or CPUs of a local Ray (default: every core); progress(done, total, step)
    is called as each step finishes; reuse: an earlier scan's table whose rows serve unchanged steps (as the
    parquet at `out` does); max_bytes: the largest dump file read (load_batch's limit; a step over it fails)."""
    out = Path(out) if out is not None else None
    scanner = Scanner(path, estimators, by, engine, include_unstable=include_unstable, workers=workers,
                      run_id=run_id, reuse=reuse if reuse is not None else _read_cache(out), max_bytes=max_bytes)
    todo = scanner.pending()
    for done, result in enumerate(scanner.update(todo), start=1):
        if progress is not None:
            progress(done, len(todo), result["step"])
    df = scanner.table()
    if out is not None:
        write_scan(df, out)
    return df


def follow(path, estimators=None, by: str | None = None, engine: str = "local", *, out, interval: float = 5.0,
           include_unstable: bool = False, workers: int | None = None, run_id: str | None = None,
           on_step: Callable[[dict], None] | None = None, stop: threading.Event | None = None,
           looks: int | None = None, max_bytes: int | None = MAX_BYTES) -> pd.DataFrame:
    """Scan the run as it grows, until `stop` is set (or after `looks` looks at it): every `interval` seconds the
    run is looked at again and its new or changed steps are read. `out` is rewritten whole (atomically: a reader
    never sees half a file) after each step read, at most once per `interval` while a look reads many steps
    (catching up), and at the end of every look that changed the table. on_step(result) is called for each step
    read (scan_step's dict: step, rows, notes, error). A look that finds no steps (none written yet, the folder
    away) changes nothing. max_bytes: as scan's. Returns the last table."""
    out = Path(out)
    stop = stop if stop is not None else threading.Event()
    scanner = Scanner(path, estimators, by, engine, include_unstable=include_unstable, workers=workers,
                      run_id=run_id, reuse=_read_cache(out), max_bytes=max_bytes)
    written, df, n = None, None, 0

    def write() -> None:
        nonlocal written, df, wrote_at
        df = scanner.table()
        write_scan(df, out)
        written, wrote_at = scanner.state(), time.monotonic()

    wrote_at = time.monotonic()
    while True:
        try:
            todo = scanner.pending()
        except (FileNotFoundError, NoSteps):  # no steps yet, or the folder is away for a moment: wait
            todo = None
        for done, result in enumerate(scanner.update(todo) if todo else (), start=1):
            if done == len(todo) or stop.is_set() or time.monotonic() - wrote_at >= interval:
                write()
            if on_step is not None:
                on_step(result)
            if stop.is_set():
                break
        if todo is not None and written != scanner.state():  # a step left or got its STABLE marker; the first look
            write()
        n += 1
        if stop.is_set() or (looks is not None and n >= looks) or stop.wait(interval):
            return df if df is not None else scanner.table()


def _ungrouped(df: pd.DataFrame, by: str | None) -> tuple[list[int], list[str]]:
    """The steps a `by` scan could not group (their batch lacks the column: whole-step rows alone), and a note.
    Read off the rows, so steps reused from the cache count too."""
    if by is None or df.empty:
        return [], []
    grouped = set(df.loc[df["group"].notna(), "step"])
    steps = sorted(int(s) for s in set(df["step"]) - grouped)
    if not steps:
        return [], []
    n = df["step"].nunique()
    return steps, [f"{len(steps)} of {n} steps have no metadata column {by!r}: each is scanned as one group "
                   f"(group None): steps {_steps_text(steps)}"]


def _steps_text(steps: list[int]) -> str:
    return ", ".join(map(str, steps[:20])) + (f", ... ({len(steps)} in all)" if len(steps) > 20 else "")


def _not_run(df: pd.DataFrame, estimators, prime_rl: bool) -> list[str]:
    """A note for the corrections asked for that some steps could not run (their batches lack the sampler's
    head, which score centering reads; step_rows leaves them out), naming the fields; one note per set of
    fields and steps. Read off the rows, so steps reused from the cache count too."""
    if df.empty:
        return []
    steps = set(df["step"])
    missing: dict[tuple, list[str]] = {}  # (fields, steps without rows) -> the corrections
    for x in estimators:
        fields = head_fields(x)
        lacking = tuple(sorted(int(s) for s in steps - set(df.loc[df["estimator"] == x, "step"])))
        if fields and lacking:
            missing.setdefault((fields, lacking), []).append(str(x))
    why = f"; {NO_HEAD}" if prime_rl else ""
    return [f"{', '.join(names)}: not run on {len(lacking)} of {len(steps)} steps (steps {_steps_text(list(lacking))})"
            f": their batches carry no {', '.join(fields)}, which score centering reads{why}"
            for (fields, lacking), names in missing.items()]


def write_scan(df: pd.DataFrame, path) -> None:
    """The scan as parquet; its settings and summary in the file's metadata (read_scan restores them)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pandas(df, preserve_index=False)
    meta = {**(table.schema.metadata or {}), _META_KEY: json.dumps(dict(df.attrs)).encode()}
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(table.replace_schema_metadata(meta), tmp)
    tmp.replace(path)  # a reader never sees half a file


def read_scan(source) -> pd.DataFrame:
    """A scan parquet (a path or a file-like), with its settings and summary in `.attrs`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(source)
    except (pa.ArrowException, OSError) as e:
        raise ValueError(f"not a scan parquet ({e})") from None
    raw = (table.schema.metadata or {}).get(_META_KEY)
    if raw is None:
        raise ValueError("not a seqis scan: the parquet has no seqis.scan metadata (write it with seqis.runs.scan)")
    df = table.replace_schema_metadata(None).to_pandas()
    df.attrs.update(json.loads(raw))
    missing = [c for c in ("step", "group", "estimator", "kl_k3") if c not in df]
    if missing:
        raise ValueError(f"not a seqis scan: no column {missing[0]!r}")
    return df
