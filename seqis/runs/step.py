"""One step of a scan: read the step, then its diagnostics, each estimator's metrics and the diagnosis, per
group; the unit of work every engine runs (a plain function of plain data, so a process or a Ray worker
runs it as it is).

A row per (group, estimator): `group` None is the whole step, else a value of the `by` metadata column (as
a string); a step whose batch lacks that column has the whole-step rows alone. Columns: step, group,
estimator, every `diagnostics` key, every metric of the estimator, `dropped` (the fraction of loss tokens
whose gradient it drops, from its kept mask), and the diagnosis of that (step, group) by seqis.diagnosis.causes:
`severity` and `finding` (the worst finding's severity and kind) and `findings` (all of them as JSON: kind,
severity, message, evidence).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import torch

from ..io import MAX_BYTES
from ..registry import runnable
from .layout import StepFiles
from .monitor import summarise
from .run import read_step

SCAN_VERSION = 1  # bump when a row's meaning changes: cached rows of another version are recomputed


@dataclass(frozen=True)
class ScanSettings:
    """What a scan computes; rows cached under other settings are recomputed."""

    estimators: tuple[str, ...]
    by: str | None = None
    max_bytes: int | None = MAX_BYTES  # the largest dump file read; not in key(): it changes which steps read, not rows

    def key(self) -> str:
        return json.dumps({"version": SCAN_VERSION, "estimators": list(self.estimators), "by": self.by})


def _finding(f) -> dict:
    """A finding as plain JSON-able data."""
    return {"kind": f.kind, "severity": f.severity, "message": f.message,
            "evidence": {k: _plain(v) for k, v in f.evidence.items()}}


def _plain(v):
    """Evidence as JSON's plain values: tensors as numbers or lists, a non-finite float as its string, lists and
    dicts (a confidence interval, diagnose's test summary) element by element."""
    if isinstance(v, torch.Tensor):
        v = v.item() if v.numel() == 1 else v.tolist()
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    return v


def step_rows(batch, step: int, settings: ScanSettings) -> list[dict]:
    """The scan's rows for one step's batch (seqis.runs.monitor.summarise: the statistics a trainer logs, per group;
    a batch without the `by` column: its whole-step rows alone, which scan notes)."""
    by = settings.by if settings.by in batch.metadata else None
    rows = []
    names, _ = runnable(settings.estimators, batch)  # a step without the sampler's head has no score-centering rows
    for s in summarise(batch, names, by):
        n_tokens = int(s.batch.loss_mask.sum())
        found = [_finding(f) for f in s.findings]
        worst = found[0] if found else None
        for name in names:
            out = s.outputs[name]
            kept = int(out.masks["kept"].sum())
            rows.append({
                "step": step, "group": s.group, "estimator": name, **s.diagnostics, **out.scalars(),
                "dropped": 1.0 - kept / n_tokens if n_tokens else 0.0,
                "severity": worst["severity"] if worst else None,
                "finding": worst["kind"] if worst else None,
                "findings": json.dumps(found),
            })
    return rows


def scan_step(files: StepFiles, settings: ScanSettings) -> dict:
    """Read and scan one step with one thread (every engine alike, so results agree to the bit). A step
    that cannot be read comes back with its error (naming the file and line) instead of rows, and with
    `unreadable`: the first of its files this process cannot open, if any (a Ray worker on a node without the
    run's storage; the engine says which node)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        result = {"step": files.step, "fingerprint": "", "rows": [], "notes": [], "error": None, "unreadable": None}
        try:
            result["fingerprint"] = files.fingerprint()
            batch, result["notes"] = read_step(files, extras=False, max_bytes=settings.max_bytes)
            result["rows"] = step_rows(batch, files.step, settings)
        except (ValueError, OSError) as e:  # BatchFormatError is a ValueError
            result["error"] = f"step {files.step}: {e}"
            result["unreadable"] = next((str(p) for p in files.files if not can_open(p)), None)
        return result
    finally:
        torch.set_num_threads(threads)


def can_open(path) -> bool:
    """Whether this process can open the file for reading."""
    try:
        with open(path, "rb"):
            return True
    except OSError:
        return False
