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
reported (file and line) in the summary and warned about, and the scan goes on.
"""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from ..estimators import ESTIMATORS
from .engines import ENGINES
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


def _cached(out: Path | None, settings: ScanSettings) -> dict[int, tuple[str, pd.DataFrame]]:
    """step -> (fingerprint, rows) from an earlier scan's parquet made with the same settings."""
    if out is None or not out.exists():
        return {}
    try:
        old = read_scan(out)
    except (OSError, ValueError):
        return {}
    if old.attrs.get("settings") != settings.key() or "fingerprint" not in old:
        return {}
    return {int(step): (rows["fingerprint"].iloc[0], rows) for step, rows in old.groupby("step")}


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


def scan(path, estimators=None, by: str | None = None, engine: str = "local", *, out=None,
         include_unstable: bool = False, workers: int | None = None, run_id: str | None = None,
         progress: Callable[[int, int, int], None] | None = None) -> pd.DataFrame:
    """Scan a run (see the module docstring). estimators: names or preset keys (None: every registry
    estimator); by: a metadata column to group by (env_name, rank, ...); engine: "local" or "ray";
    workers: processes (local) or CPUs of a local Ray (default: every core); progress(done, total, step)
    is called as each step finishes."""
    names = tuple(estimators) if estimators is not None else tuple(ESTIMATORS)
    unknown = [n for n in names if n not in _known_names()]
    if unknown:
        raise ValueError(f"unknown estimator {unknown[0]!r}; known: {', '.join(sorted(_known_names()))}")
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    settings = ScanSettings(names, by)
    run = load_run(path, run_id)
    steps = [run.files(s) for s in run.steps + (run.unstable_steps if include_unstable else [])]
    out = Path(out) if out is not None else None
    cache = _cached(out, settings)

    frames, todo = [], []
    for files in steps:
        hit = cache.get(files.step)
        if files.stable and hit is not None and hit[0] == files.fingerprint():
            frames.append(hit[1])
        else:
            todo.append(files)
    summary = {"steps": len(steps), "scanned": 0, "cached": len(frames), "failed": [], "skipped": [],
               "unstable_left_out": [] if include_unstable else run.unstable_steps, "seconds": 0.0}
    started = time.perf_counter()
    rows, stable = [], {f.step: f.stable for f in todo}
    for done, result in enumerate(ENGINES[engine](todo, settings, workers), start=1):
        summary["skipped"] += result["notes"]
        for note in result["notes"]:
            warnings.warn(f"step {result['step']}: {note}", stacklevel=2)
        if result["error"] is not None:
            summary["failed"].append(result["error"])
            warnings.warn(result["error"], stacklevel=2)
        else:
            summary["scanned"] += 1
            fingerprint = result["fingerprint"] if stable[result["step"]] else ""  # being written: never reused
            rows += [{**row, "fingerprint": fingerprint} for row in result["rows"]]
        if progress is not None:
            progress(done, len(todo), result["step"])
    summary["seconds"] = time.perf_counter() - started
    if rows:
        frames.append(pd.DataFrame(rows))
    df = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["step", "group", "estimator"])
    last = [c for c in _LAST if c in df]
    df = order_rows(df[[c for c in df if c not in last] + last], names)
    df.attrs.update(settings=settings.key(), summary=summary, path=str(run.path))
    if out is not None:
        write_scan(df, out)
    return df


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
