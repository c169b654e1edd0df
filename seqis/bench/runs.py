"""Section `runs`: scanning a prime-rl export run against just parsing its JSONL, and the scan's peak memory.

Floor: pyarrow's JSON reader over the same files (every field, its threads on), the least any reader of
the export pays. Targets: the local engine's scan at most 2x the floor; the peak memory of each scanning
process (the local engine's workers too) below 3x the largest step's size plus the interpreter, measured
by seqis.bench._runs_memory.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ORDER = 50


def _probe(run: Path, warm: Path, workers: int) -> list[dict]:
    """Each scanning process's peak resident memory over its own warmed-up baseline (MB), measured in a fresh
    interpreter by seqis.bench._runs_memory (the local engine's workers included)."""
    out = subprocess.run([sys.executable, "-m", "seqis.bench._runs_memory", str(run), str(warm), str(workers)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _parse_floor(files: list[Path]) -> None:
    import pyarrow.json as pj

    for f in files:
        pj.read_json(f)


def run(device: str, quick: bool) -> None:
    """A generated run (seqis.runs.example, the current schema, every field prime-rl writes): every registry
    estimator, grouped by environment, on the CPU (the scan's engines run on CPUs)."""
    from ..io.prime_rl import read_prime_rl_files
    from ..runs import load_run, scan
    from ..runs.engines import default_workers
    from ..runs.example import write_prime_rl_run

    steps, ranks, rollouts, max_len = (3, 2, 8, 512) if quick else (8, 2, 32, 2048)
    repeats = 1 if quick else 3
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "token_exports"
        write_prime_rl_run(root, steps=steps, ranks=ranks, rollouts_per_rank=rollouts, max_len=max_len,
                           prompt_len=256, envs=("math", "code", "chat"))
        warm = Path(tmp) / "warm"
        write_prime_rl_run(warm, steps=1, ranks=1, rollouts_per_rank=4, envs=("math", "code", "chat"))
        r = load_run(root)
        files = [p for s in r.steps for p in r.files(s).files]
        total_mb = sum(p.stat().st_size for p in files) / 2**20
        step_bytes = max(r.files(s).n_bytes() for s in r.steps)
        largest = max(r.steps, key=lambda s: r.files(s).n_bytes())
        batch, _ = read_prime_rl_files(r.files(largest).files, extras=False)
        batch_bytes = sum(x.element_size() * x.numel() for x in (batch.trainer_logprobs, batch.inference_logprobs,
                                                                   batch.advantages, batch.loss_mask))
        del batch

        def timed(fn) -> float:
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
            return statistics.median(times)

        short = Path(tmp) / "two_steps"  # the run's first two steps: memory must not grow with the run's length
        short.mkdir()
        for s in r.steps[:2]:
            (short / f"step_{s}").symlink_to(root / f"step_{s}")
        workers = default_workers()
        one = [_probe(root, warm, 1)[0]["over_mb"] for _ in range(repeats)]  # first: on a quiet process tree
        local = [_probe(root, warm, max(workers, 2)) for _ in range(repeats)]  # forked workers, always
        per_worker = [max(p["over_mb"] for p in procs if p["role"] == "worker") for procs in local]
        coordinator = [procs[0]["over_mb"] for procs in local]
        short_mb = statistics.median(_probe(short, warm, 1)[0]["over_mb"] for _ in range(repeats))
        floor = timed(lambda: _parse_floor(files))
        local_s = timed(lambda: scan(root, by="env_name", workers=workers))
        single = timed(lambda: scan(root, by="env_name", workers=1))
    step_mb = step_bytes / 2**20
    print(f"\n## Scanning a run: {steps} steps x {ranks} ranks x {rollouts} sequences (<= {max_len} + 256 prompt "
          f"tokens), {total_mb:.0f} MB of JSONL; every estimator, by env_name; medians of {repeats}")
    print("floor: pyarrow.json.read_json of the same files (every field, its threads on)\n")
    print("| measure | seconds | x floor |")
    print("|---|---:|---:|")
    print(f"| parse floor (pyarrow) | {floor:.2f} | 1.0 |")
    print(f"| scan, local engine ({workers} processes) | {local_s:.2f} | {local_s / floor:.2f} |")
    print(f"| scan, one process | {single:.2f} | {single / floor:.2f} |")
    print(f"\npeak resident memory of each scanning process over its warmed-up interpreter (VmHWM, reset after a "
          f"one-step warm-up scan; fresh interpreters), against the largest step's JSONL ({step_mb:.1f} MB; "
          f"{batch_bytes / 2**20:.1f} MB as a Batch); target < 3x\n")
    print("| process | MB over its interpreter (each run) | median | x step |")
    print("|---|---|---:|---:|")
    rows = (("one process (workers=1)", one), (f"local engine: the busiest of {max(workers, 2)} workers", per_worker),
            ("local engine: the coordinating process", coordinator))
    for name, values in rows:
        print(f"| {name} | {', '.join(f'{v:.0f}' for v in values)} | {statistics.median(values):.0f} | "
              f"{statistics.median(values) / step_mb:.2f} |")
    print(f"\nThe run's first two steps alone, one process: {short_mb:.0f} MB over (memory does not grow with the "
          f"run's length); each worker holds one step at a time.")
