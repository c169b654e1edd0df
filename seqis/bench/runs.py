"""Section `runs`: scanning a prime-rl export run against just parsing its JSONL, and the scan's peak memory.

Floor: pyarrow's JSON reader over the same files (every field, its threads on), the least any reader of
the export pays. Targets: the local engine's scan at most 2x the floor; the peak memory of a scanning
process below 3x the largest step's size plus the interpreter.
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

# a fresh interpreter: a scan of a one-step run (every lazy import and first-use cost paid), its RSS (the
# baseline), then the run's scan in this process, then the process's peak RSS
_MEMORY_PROBE = """
import json, resource, sys
from seqis.runs import scan
def rss_kb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() // 1024
scan(sys.argv[2], by="env_name", workers=1)
base = rss_kb()
scan(sys.argv[1], by="env_name", workers=1)
print(json.dumps({"base_kb": base, "peak_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""


def _probe(run: Path, warm: Path) -> dict:
    """Baseline and peak RSS (kB) of a fresh interpreter scanning `run` after a warm-up scan of `warm`."""
    out = subprocess.run([sys.executable, "-c", _MEMORY_PROBE, str(run), str(warm)], capture_output=True,
                         text=True, check=True)
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
        mem, mem_short = (_probe(run, warm) for run in (root, short))  # first: on a quiet process tree
        workers = default_workers()
        floor = timed(lambda: _parse_floor(files))
        local = timed(lambda: scan(root, by="env_name", workers=workers))
        single = timed(lambda: scan(root, by="env_name", workers=1))
    over_kb = mem["peak_kb"] - mem["base_kb"]
    print(f"\n## Scanning a run: {steps} steps x {ranks} ranks x {rollouts} sequences (<= {max_len} + 256 prompt "
          f"tokens), {total_mb:.0f} MB of JSONL; every estimator, by env_name; medians of {repeats}")
    print("floor: pyarrow.json.read_json of the same files (every field, its threads on)\n")
    print("| measure | seconds | x floor |")
    print("|---|---:|---:|")
    print(f"| parse floor (pyarrow) | {floor:.2f} | 1.0 |")
    print(f"| scan, local engine ({workers} processes) | {local:.2f} | {local / floor:.2f} |")
    print(f"| scan, one process | {single:.2f} | {single / floor:.2f} |")
    print(f"\npeak memory of a scanning process over its interpreter ({mem['base_kb'] / 1024:.0f} MB after "
          f"a one-step warm-up scan): {over_kb / 1024:.0f} MB = {over_kb * 1024 / step_bytes:.2f}x the largest "
          f"step's JSONL "
          f"({step_bytes / 2**20:.1f} MB), {over_kb * 1024 / batch_bytes:.1f}x that step as a Batch "
          f"({batch_bytes / 2**20:.1f} MB); each local worker holds one step at a time. The run's first two steps "
          f"alone: {(mem_short['peak_kb'] - mem_short['base_kb']) / 1024:.0f} MB over")
