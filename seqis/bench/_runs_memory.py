"""The scan's peak memory, measured in a fresh interpreter: `python -m seqis.bench._runs_memory RUN WARM WORKERS`
prints one JSON line with each scanning process's resident-memory high-water mark over its own baseline.

Every process that does the work is measured the same way: after a warm-up scan of the small run WARM (every
lazy import and first-use cost paid), its resident set (VmRSS) is the baseline; the kernel's high-water mark
(VmHWM) is reset (writing 5 to /proc/self/clear_refs) and read after the work. With WORKERS > 1 the local
engine's forked workers each warm up on WARM's first step before their first real one and report their own
mark. `getrusage`'s ru_maxrss is not used: Linux carries a process's mark across exec, so a probe started
from a large parent (the bench, after writing the run) inherited the parent's size as its "peak".
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

from ..runs import engines, load_run, scan
from ..runs.step import scan_step

_worker: dict = {}  # this process's measure, when it is one of the local engine's workers


def _status_mb(key: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    raise KeyError(key)


def _start_measure() -> tuple[float, bool]:
    """This process's baseline (MB) and whether its high-water mark could be reset (else it counts from the
    process's start: an overestimate)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        reset = True
    except OSError:
        reset = False
    return _status_mb("VmRSS"), reset


def _measured_scan_step(files, settings):
    """scan_step in a local worker: warmed up and measured from its first task on."""
    if not _worker:
        scan_step(load_run(_worker_env("warm")).files(0), settings)
        _worker["base"], _worker["reset"] = _start_measure()
    result = scan_step(files, settings)
    with open(Path(_worker_env("out")) / f"{os.getpid()}.json", "w") as f:
        json.dump({"base_mb": _worker["base"], "peak_mb": _status_mb("VmHWM"), "reset": _worker["reset"]}, f)
    return result


def _worker_env(key: str) -> str:
    return os.environ[f"SEQIS_MEMORY_PROBE_{key.upper()}"]


def main(argv: list[str]) -> None:
    run, warm, workers = argv[0], argv[1], int(argv[2])
    scan(warm, by="env_name", workers=1)
    base, reset = _start_measure()
    with tempfile.TemporaryDirectory() as out:
        os.environ.update(SEQIS_MEMORY_PROBE_WARM=warm, SEQIS_MEMORY_PROBE_OUT=out)
        engines.scan_step = _measured_scan_step if workers > 1 else scan_step
        scan(run, by="env_name", workers=workers)
        procs = [{"role": "scan" if workers == 1 else "coordinator", "base_mb": base, "peak_mb": _status_mb("VmHWM"),
                  "reset": reset}]
        procs += [{"role": "worker", **json.loads(p.read_text())} for p in sorted(Path(out).glob("*.json"))]
    print(json.dumps([{**p, "over_mb": p["peak_mb"] - p["base_mb"]} for p in procs]))


if __name__ == "__main__":
    main(sys.argv[1:])
