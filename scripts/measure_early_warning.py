"""The Run page's early warning (seqis.diagnosis.trend) on clean runs and on runs whose mismatch starts to grow.

Clean: each step a fresh batch at a fixed mismatch (the gaussian scenario, s = 0.04; the precision scenario, bf16):
what passes z counts as a false alarm. Rising: the same gaussian run whose s grows by `--rise` per step from step
100 on: how many steps after the rise starts the first alarm comes (and how far the per-token KL has grown by then).

    python scripts/measure_early_warning.py --runs 8 --steps 150
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from seqis import diagnostics
from seqis.diagnosis.trend import Z_ALARM, metric_z
from seqis.samplers.scenarios import make_batch

SHAPE = dict(n_rollouts=32, max_len=256)
METRICS = ("kl_k3", "abs_ratio_mean")
ZS = (3.0, 4.0, 5.0, 6.0)
SCENARIOS = {"gaussian s=0.04": dict(scenario="gaussian", s=0.04), "precision bf16": dict(scenario="precision")}


def run_series(kw: dict, steps: int, seed: int, rise: float = 0.0, start: int = 100) -> dict[str, np.ndarray]:
    out = {m: [] for m in METRICS}
    for t in range(steps):
        extra = dict(kw)
        if rise and t >= start:
            extra["s"] = kw["s"] * (1 + rise) ** (t - start + 1)
        d = diagnostics(make_batch(extra.pop("scenario"), seed=seed * 100_003 + t, **SHAPE, **extra))
        for m in METRICS:
            out[m].append(float(d[m]))
    return {m: np.array(v) for m, v in out.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=8)
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--rise", type=float, default=0.02, help="growth of s per step after step 100 (rising runs)")
    args = p.parse_args()
    t0 = time.time()
    print("clean runs: alarms per step (steps with a z), by threshold")
    print("| scenario | statistic | " + " | ".join(f"z > {z:g}" for z in ZS) + " | steps read |")
    print("|---|---|" + "---:|" * (len(ZS) + 1))
    for label, kw in SCENARIOS.items():
        series = [run_series(kw, args.steps, seed) for seed in range(args.runs)]
        for m in METRICS:
            zs = np.concatenate([metric_z(m, s[m]) for s in series])
            zs = zs[np.isfinite(zs)]
            rates = [f"{np.mean(zs > z):.2e} ({int(np.sum(zs > z))})" for z in ZS]
            print(f"| {label} | {m} | " + " | ".join(rates) + f" | {len(zs)} |")
    print(f"\nrising runs (gaussian, s x {1 + args.rise:g} per step from step 100): steps to the first alarm at "
          f"z > {Z_ALARM:g}")
    print("| statistic | median delay (steps) | range | KL at the alarm / KL before the rise |")
    print("|---|---:|---:|---:|")
    rising = [run_series(SCENARIOS["gaussian s=0.04"], 100 + 60, seed + 1000, rise=args.rise)
              for seed in range(args.runs)]
    for m in METRICS:
        delays, growth = [], []
        for s in rising:
            hit = np.nonzero(np.nan_to_num(metric_z(m, s[m]), nan=-np.inf) > Z_ALARM)[0]
            hit = hit[hit >= 100]
            if len(hit):
                delays.append(int(hit[0]) - 99)
                growth.append(s["kl_k3"][hit[0]] / np.median(s["kl_k3"][80:100]))
        if delays:
            print(f"| {m} | {np.median(delays):.0f} | {min(delays)}-{max(delays)} | {np.median(growth):.2f} "
                  f"({len(delays)} of {len(rising)} runs alarmed) |")
        else:
            print(f"| {m} | - | - | none of {len(rising)} runs alarmed |")
    print(f"\n{args.runs} runs x {args.steps} steps per clean scenario; {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
