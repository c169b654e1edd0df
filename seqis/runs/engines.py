"""Engines that run `scan_step` over many steps and stream the results back as they finish.

local   one process per core (spawned, each with one torch thread); at most two steps per worker in
        flight, so memory stays bounded by a few steps whatever the run's size. workers=1 runs in this
        process (no start-up cost: small runs, tests).
ray     the same function as Ray Data tasks (`ray[data]`, the optional extra): on the cluster named by
        RAY_ADDRESS (or an already initialised Ray), else a local Ray on `workers` CPUs. Workers read the
        step files by path, so a cluster needs the run on storage every node mounts, and seqis installed
        (or shipped with a runtime_env). Ray Data streams: a few steps per CPU in flight.

Both return the dicts `scan_step` returns, in completion order; the scan sorts them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from multiprocessing import get_context
from pathlib import Path

from ..io.prime_rl_lines import LineSpan
from .layout import StepFiles
from .step import ScanSettings, scan_step


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


def _task_row(files: StepFiles) -> dict:
    return {"step": files.step, "files": [str(p) for p in files.files], "stable": files.stable,
            "prime_rl": files.prime_rl, "spans": json.dumps(files.spans), "notes": json.dumps(files.notes)}


def _ray_scan_step(row: dict, estimators: list[str], by: str | None) -> dict:
    files = StepFiles(int(row["step"]), tuple(Path(p) for p in row["files"]), bool(row["stable"]),
                      bool(row["prime_rl"]), tuple(LineSpan(*s) for s in json.loads(row["spans"])),
                      tuple(json.loads(row["notes"])))
    return {"result": json.dumps(scan_step(files, ScanSettings(tuple(estimators), by)))}


def run_ray(tasks: list[StepFiles], settings: ScanSettings, workers: int | None = None) -> Iterator[dict]:
    try:
        import ray
        import ray.data
    except ImportError:
        raise ImportError('engine="ray" needs Ray Data: pip install "seqis[ray]" (or "ray[data]")') from None
    if not tasks:
        return
    if not ray.is_initialized():
        if os.environ.get("RAY_ADDRESS"):
            ray.init(log_to_driver=False)  # the cluster RAY_ADDRESS names
        else:
            ray.init(num_cpus=workers or default_workers(), include_dashboard=False, log_to_driver=False)
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    context.print_on_execution_start = False
    ds = ray.data.from_items([_task_row(t) for t in tasks], override_num_blocks=len(tasks))
    ds = ds.map(_ray_scan_step, fn_kwargs={"estimators": list(settings.estimators), "by": settings.by}, num_cpus=1)
    for row in ds.iter_rows():
        yield json.loads(row["result"])


ENGINES = {"local": run_local, "ray": run_ray}
