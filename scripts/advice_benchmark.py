"""The advice held to a truth: on batches with known bad rollouts (seqis.diagnosis.truth_cases), how much of the bad
does the suggestion drop and how much of the good does it keep, compared over the seed four and over the full
registry (with the relevant presets). Prints the markdown table docs/diagnose.md carries.

    python scripts/advice_benchmark.py --seeds 8
"""

from __future__ import annotations

import argparse
import math
import time
from collections import Counter

from seqis import SEED_ESTIMATORS, run
from seqis.diagnosis.advice import advise
from seqis.diagnosis.summaries import effectively_kept
from seqis.diagnosis.truth_cases import CASES, make_case, score
from seqis.registry import entry

OVER = {"seed four": list(SEED_ESTIMATORS), "registry": None}
AT_DEFAULTS = "mis_po"  # a reference row: the case, its trajectory band at its defaults


def suggestion_score(case, estimators) -> tuple[dict[str, float], str]:
    a = advise(case.batch, estimators)
    _, default = entry(a.suggestion)
    kept = effectively_kept(run(a.suggestion, case.batch, type(default)(**a.knobs)))
    return score(kept, case), a.suggestion + (" (fitted)" if a.fitted else "")


def mean(xs) -> float:
    xs = [x for x in xs if not math.isnan(x)]
    return sum(xs) / len(xs) if xs else math.nan


def cell(x: float) -> str:
    return "-" if math.isnan(x) else f"{x:.3f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=8)
    args = p.parse_args()
    t0 = time.time()
    print("| case | compared | bad rollouts' tokens dropped | catastrophic tokens dropped | good rollouts' tokens kept "
          "| suggestions (seeds) |")
    print("|---|---|---:|---:|---:|---|")
    for name in (*CASES, "clean"):
        cases = [make_case(name, seed) for seed in range(args.seeds)]
        for over, estimators in OVER.items():
            rows = [suggestion_score(c, estimators) for c in cases]
            picks = Counter(s for _, s in rows).most_common()
            bad = cell(mean(r["bad_dropped"] for r, _ in rows)) if name != "clean" else "-"
            print(f"| {name} | {over} | {bad} | {cell(mean(r['tokens_dropped'] for r, _ in rows))} "
                  f"| {cell(mean(r['good_kept'] for r, _ in rows))} | {', '.join(f'{s} ({n})' for s, n in picks)} |")
        ref = [score(effectively_kept(run(AT_DEFAULTS, c.batch)), c) for c in cases]
        print(f"| {name} | {AT_DEFAULTS} at its defaults | "
              f"{cell(mean(r['bad_dropped'] for r in ref)) if name != 'clean' else '-'} | "
              f"{cell(mean(r['tokens_dropped'] for r in ref))} | {cell(mean(r['good_kept'] for r in ref))} | - |")
    print(f"\n{args.seeds} seeds per case; {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
