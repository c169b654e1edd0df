"""Engines that run `scan_step` over many steps and stream the results back as they finish.

local   one process per core (spawned, each with one torch thread); at most two steps per worker in
        flight, so memory stays bounded by a few steps whatever the run's size. workers=1 runs in this
        process (no start-up cost: small runs, tests).
ray     the same function as Ray Data tasks (`ray[data]`, the optional extra): on an already initialised
        Ray, else the cluster named by RAY_ADDRESS, else the cluster this machine is part of (`ray start`
        here, a KubeRay pod), else a local Ray on `workers` CPUs (connect). Workers read the
        step files by path, so a cluster needs the run on storage every node mounts at the same path, and
        seqis importable on every node (installed, or shipped with a runtime_env: docs/runs-on-a-cluster.md).
        The paths are absolute before a task leaves this process (a worker has a folder of its own). A step a
        worker cannot read comes back like any unreadable step, its line naming the file and the node (and
        whether this machine reads the file); when no worker read any step that this machine reads, the scan
        stops with one message (WorkersCannotRead), as it does when the workers cannot import seqis.
        Ray Data streams: a few steps per CPU in flight.

Both return the dicts `scan_step` returns, in completion order; the scan sorts them.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from contextlib import contextmanager
from multiprocessing import get_context
from pathlib import Path

from ..io import MAX_BYTES
from ..io.prime_rl_lines import LineSpan
from .layout import StepFiles
from .step import ScanSettings, can_open, scan_step


def default_workers() -> int:
    """Every core this process may use."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _context():
    """fork where the platform has it and CUDA is not initialised (a forked child cannot use the parent's
    CUDA context): workers start at once, the modules already imported; else spawn (fresh interpreters)."""
    import multiprocessing

    import torch

    if "fork" in multiprocessing.get_all_start_methods() and not torch.cuda.is_initialized():
        return get_context("fork")
    return get_context("spawn")


def run_local(tasks: list[StepFiles], settings: ScanSettings, workers: int | None = None) -> Iterator[dict]:
    workers = min(workers or default_workers(), len(tasks))
    if workers <= 1:
        for task in tasks:
            yield scan_step(task, settings)
        return
    with ProcessPoolExecutor(workers, mp_context=_context()) as pool:
        todo, running = iter(tasks), set()
        while True:
            for task in todo:
                running.add(pool.submit(scan_step, task, settings))
                if len(running) >= 2 * workers:
                    break
            if not running:
                return
            done, running = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                yield future.result()


SHARED_STORAGE = ("Ray's workers read the step files by path: the run must sit on storage every node mounts at the "
                  "same path (NFS, a shared volume; on KubeRay the same volume in every pod)")
SHIP_SEQIS = ("seqis must be importable on every node: install it in the nodes' image, or ship it with the job "
              "(ray.init(runtime_env={'py_modules': [seqis]}) before scan(..., engine='ray'); from the terminal: "
              "ray job submit --runtime-env-json '{\"py_modules\": [\"<the seqis package folder>\"]}' -- "
              "python -m seqis scan ...). See docs/runs-on-a-cluster.md")


class WorkersCannotRead(OSError):
    """No Ray worker could read any of the steps to scan, which this machine reads: one message for the whole run
    (the first worker's error as its example), not a line per step."""


def _task_row(files: StepFiles) -> dict:
    return {"step": files.step, "files": [str(p.absolute()) for p in files.files], "stable": files.stable,
            "prime_rl": files.prime_rl, "spans": json.dumps(files.spans), "notes": json.dumps(files.notes)}


def _node() -> str:
    """The Ray node this worker runs on, as its logs and `ray status` name it: id (first 8 hex) and address."""
    import ray

    return f"Ray node {ray.get_runtime_context().get_node_id()[:8]} ({ray.util.get_node_ip_address()})"


def _ray_scan_step(row: dict, estimators: list[str], by: str | None, max_bytes: int | None = MAX_BYTES) -> dict:
    files = StepFiles(int(row["step"]), tuple(Path(p) for p in row["files"]), bool(row["stable"]),
                      bool(row["prime_rl"]), tuple(LineSpan(*s) for s in json.loads(row["spans"])),
                      tuple(json.loads(row["notes"])))
    result = scan_step(files, ScanSettings(tuple(estimators), by, max_bytes))
    if result["unreadable"] is not None:
        result["error"] += f": {_node()} cannot open {result['unreadable']}"
    return {"result": json.dumps(result)}


def connect(workers: int | None = None) -> None:
    """Ray for a scan: the cluster RAY_ADDRESS names; else the one this machine is part of (`ray start` here, a
    KubeRay pod: Ray's own default); else a local Ray of its own on `workers` CPUs (default: every core)."""
    import ray

    quiet = {"log_to_driver": False, "logging_level": logging.WARNING}
    if os.environ.get("RAY_ADDRESS"):
        ray.init(**quiet)
        return
    try:
        ray.init(num_cpus=workers or default_workers(), include_dashboard=False, **quiet)
    except ValueError as e:  # Ray found this machine's cluster, which takes no CPU count
        if "existing cluster" not in str(e):
            raise
        ray.init(**quiet)


@contextmanager
def _ray_data_quiet() -> Iterator[None]:
    """Ray Data's own log lines held back (its progress notices would break the scan's progress bar; a failed
    task's traceback is logged before the error is raised, and the error is reported below)."""
    log = logging.getLogger("ray.data")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(level)


def run_ray(tasks: list[StepFiles], settings: ScanSettings, workers: int | None = None) -> Iterator[dict]:
    try:
        import ray
        import ray.data
    except ImportError:
        raise ImportError('engine="ray" needs Ray Data: pip install "seqis[ray]" (or "ray[data]")') from None
    if not tasks:
        return
    rows = [_task_row(t) for t in tasks]  # absolute paths: made here, before any task leaves this process
    if not ray.is_initialized():
        connect(workers)
    blind = []  # steps a worker could not read and this machine can: their errors as the worker gave them
    with _ray_data_quiet():
        context = ray.data.DataContext.get_current()
        context.enable_progress_bars = False
        context.print_on_execution_start = False
        ds = ray.data.from_items(rows, override_num_blocks=len(rows))
        ds = ds.map(_ray_scan_step, fn_kwargs={"estimators": list(settings.estimators), "by": settings.by,
                                               "max_bytes": settings.max_bytes}, num_cpus=1)
        try:
            for row in ds.iter_rows():
                result = json.loads(row["result"])
                if result["unreadable"] is not None and can_open(result["unreadable"]):
                    blind.append(result["error"])
                    result["error"] += f", which this machine reads. {SHARED_STORAGE}"
                yield result
        except ray.exceptions.RayError as e:  # any other error is raised as Ray gives it
            if "No module named 'seqis" in str(e):
                raise ImportError(f"the Ray workers cannot import seqis: {SHIP_SEQIS}") from None
            raise
    if len(blind) == len(tasks) > 1:  # (one step alone is its own line, which says as much)
        raise WorkersCannotRead(f"no Ray worker could read any of the {len(tasks)} steps to scan, which this "
                                f"machine reads (the first: {blind[0]}). {SHARED_STORAGE}. And {SHIP_SEQIS}.")


ENGINES = {"local": run_local, "ray": run_ray}
