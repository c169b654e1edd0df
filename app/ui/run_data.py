"""The Run page's cached bridge: scans (of a run folder, a scan file on the server or an uploaded scan) as
DataFrames, and one step of a run handed to Explore and Diagnose. Every path here has passed ui/paths.py's rule
(the page's picker, or `served.confine` below for a path a scan recorded and a step opened).

Keys are small: a folder's path with the fingerprint of its files (names, sizes, modification times: a
new step changes it), a file's path and modification time, an upload's digest."""

from __future__ import annotations

import hashlib
import importlib.util
import io
import threading
from collections import OrderedDict
from dataclasses import dataclass

import pandas as pd
import streamlit as st

from seqis import SEED_ESTIMATORS
from seqis.io import ASSETS_DIR
from seqis.runs import incidents, load_run, read_scan, scan

from . import served
from .paths import Refused

EXAMPLE_RUN = ASSETS_DIR / "runs" / "prime_rl_example"
SEED_FOUR = tuple(SEED_ESTIMATORS)
IN_PROCESS_STEPS = 64  # runs with fewer steps are scanned in this process; larger ones by one process per core
ENGINES = {"local": "This server", "ray": "Ray"}
HAS_RAY = importlib.util.find_spec("ray") is not None


def fingerprint(path: str) -> str:
    """The run's files as one digest (stat calls only): it changes when a step is added or rewritten. A run
    whose files link out of the folders this server reads is refused (paths.Refused) before any is read."""
    r = load_run(path)
    steps = [r.files(s) for s in r.steps + r.unstable_steps]
    served.check_files([f for s in steps for f in s.files], path)
    text = "\n".join(s.fingerprint() for s in steps)
    return hashlib.sha256(text.encode()).hexdigest()


GROUP_VALUES = 32  # a column with more distinct values than this (or one per rollout) is not a grouping


@st.cache_data(max_entries=8, show_spinner=False)
def group_columns(path: str, digest: str) -> tuple[str, ...]:
    """The metadata columns a scan of the run may group by: those its first or last step carries with 2 to
    GROUP_VALUES distinct values, not one per rollout (env_name, rank; not the step, not a prompt id). `digest`:
    the run's fingerprint (a new step may bring a column)."""
    r = load_run(path)
    found: dict[str, None] = {}
    for step in dict.fromkeys(r.steps[:1] + r.steps[-1:]):
        try:
            batch, _ = r.read(step, extras=False)
        except (ValueError, OSError):  # an unreadable step: the scan reports it
            continue
        B = batch.shape[0]
        for name, values in batch.metadata.items():
            n = len(set(map(str, values)))
            if 1 < n <= GROUP_VALUES and n < B:
                found[name] = None
    return tuple(found)


_SCANS: OrderedDict = OrderedDict()  # (path, digest, estimators, by) -> DataFrame, the last few, shared
_SCANS_KEPT = 6
_LOCK = threading.Lock()


def scan_folder(path: str, digest: str, estimators: tuple[str, ...], by: str | None, progress=None,
                engine: str = "local") -> pd.DataFrame:
    """A run folder scanned in place (`digest`: its fingerprint, part of the key); progress(done, total, step)
    while it runs. Kept in a small LRU of its own: st.cache_data would replay the progress bar's updates.
    engine "ray": the cluster RAY_ADDRESS names, else a local Ray (seqis.runs.engines), kept apart in the key
    (the rows are the same; a user who picks Ray means to run it). A run that grew (a new digest) is scanned
    incrementally: the last scan of the same folder and settings lends its rows for every step whose files did not
    change (the Run page's Follow switch reads only new steps)."""
    key = (path, digest, estimators, by) + ((engine,) if engine != "local" else ())
    with _LOCK:
        if key in _SCANS:
            _SCANS.move_to_end(key)
            return _SCANS[key]
        earlier = next((df for k, df in reversed(_SCANS.items()) if k[0] == path and k[2:] == key[2:]), None)
    n_steps = len(load_run(path).steps) - (earlier["step"].nunique() if earlier is not None else 0)
    small = engine == "local" and n_steps < IN_PROCESS_STEPS
    df = scan(path, list(estimators), by=by, engine=engine, workers=1 if small else None, progress=progress,
              reuse=earlier)
    with _LOCK:
        _SCANS[key] = df
        while len(_SCANS) > _SCANS_KEPT:
            _SCANS.popitem(last=False)
    return df


@dataclass
class _Job:
    """A folder's scan running in a thread of its own for the Follow switch: where it is, or why it failed."""

    key: tuple  # scan_folder's key: (path, digest, estimators, by), then the engine unless local
    done: int = 0
    total: int = 0
    step: int | None = None
    error: str | None = None
    thread: threading.Thread | None = None

    def progress(self, done: int, total: int, step: int) -> None:
        self.done, self.total, self.step = done, total, step

    def work(self) -> None:
        try:
            scan_folder(*self.key[:4], progress=self.progress, engine=self.key[4] if len(self.key) > 4 else "local")
        except (ValueError, OSError, ImportError) as e:  # ImportError, OSError: also Ray's (no cluster, no worker)
            self.error = str(e)


_JOBS: dict[tuple, _Job] = {}  # (path, estimators, by, engine) -> its latest background scan


def scan_behind(path: str, estimators: tuple[str, ...], by: str | None,
                engine: str = "local") -> tuple[pd.DataFrame | None, str | None]:
    """A followed folder: its newest finished scan (None before the first) and a line on the scan running behind
    it (None when none runs). When the folder's files changed since that scan, a scan of it starts in a thread:
    a page that looks again every few seconds (a fragment on a timer) never interrupts a scan halfway (a rerun
    stops the script it interrupts; a thread runs on). A scan that failed is tried again once the files change."""
    digest = fingerprint(path)
    key = (path, digest, estimators, by) + ((engine,) if engine != "local" else ())
    with _LOCK:
        if key in _SCANS:
            _SCANS.move_to_end(key)
            return _SCANS[key], None
        latest = next((df for k, df in reversed(_SCANS.items()) if k[0] == path and k[2:] == key[2:]), None)
        job = _JOBS.get((path, estimators, by, engine))
        if job is not None and job.key == key and job.error is not None:
            return latest, f"The scan failed: {job.error}"
        if job is None or not job.thread.is_alive():
            job = _JOBS[(path, estimators, by, engine)] = _Job(key)
            job.thread = threading.Thread(target=job.work, name="seqis-follow-scan", daemon=True)
            job.thread.start()
    where = f": step {job.step}, {job.done} of {job.total}" if job.total else ""
    return latest, f"Reading the steps that landed{where}..."


@st.cache_data(max_entries=6, show_spinner=False)
def scan_file(path: str, mtime_ns: int) -> pd.DataFrame:
    """A scan parquet on the server (`mtime_ns` keys a rewritten file anew)."""
    return read_scan(path)


@st.cache_data(max_entries=4, show_spinner=False)
def scan_upload(digest: str, _payload: bytes) -> pd.DataFrame:
    """An uploaded scan parquet, named by the sha256 of its bytes."""
    return read_scan(io.BytesIO(_payload))


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@st.cache_data(max_entries=8, show_spinner=False)
def worst(df: pd.DataFrame, n: int = 12) -> pd.DataFrame:
    return incidents(df, n)


def run_folder_of(df: pd.DataFrame, given: str | None) -> str | None:
    """The run folder a scan's steps can be opened from: the one scanned, else the path the scan recorded (an
    uploaded scan's too), when it is a folder inside the ones this server reads."""
    for path in (given, df.attrs.get("path")):
        if path:
            try:
                return str(served.confine(str(path), "folder"))
            except Refused:
                continue
    return None


def hand_step_to_explore(run_path: str, step: int) -> str:
    """Make one step of the run the batch Explore (and Diagnose, which shows Explore's batch) opens with;
    returns its label. The step travels as a file payload (seqis.runs.Run.step_file), so the explorer's
    own loader, cache and label handle it like an upload; the user picked the page it opens on, so Explore
    does not send it on to Diagnose as it does a new upload."""
    from ui import explore_data
    from ui.state import first_look, hold_batch, set_view

    run = load_run(served.confine(run_path, "folder"))
    served.check_files(run.files(step).files, run_path)
    name, payload = run.step_file(step)
    src = explore_data.source_of_file(payload, name, kind="upload")
    hold_batch(src, payload)  # the shared batch
    first_look(src)  # marked seen
    set_view({"ex.source": "upload", "dg.source": "batch"})  # Explore and Diagnose: the held batch
    return src.label
