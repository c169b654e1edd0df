"""`python scripts/bench_explore.py [--quick]`: the server's work for one Explore slider move, through the page's
public view functions (the app's side of the benchmark: the library never imports the app).

A slider move reruns the page: one bridge view (ui/explore_data.py `explore`) resolves each column's correction
once and builds every figure, table and snippet from it; the moved column's pieces are cache misses, the others
hits. This times that work in-process, against a floor: the same calls with every cache hit.
What a person waits for in a browser is scripts/bench_browser.py.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from pathlib import Path

APP = Path(__file__).resolve().parents[1] / "app"
SEQ_CLIPS = [2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 12.0, 15.0, 20.0, 25.0, 30.0, 40.0, 50.0, 60.0]


def view_functions():
    """The Explore page's cached bridge (app/ui/explore_data.py), or None when the app or streamlit is missing."""
    if not (APP / "ui" / "explore_data.py").exists():
        return None
    try:
        import streamlit  # noqa: F401
    except ImportError:
        return None
    if str(APP) not in sys.path:
        sys.path.insert(0, str(APP))
    from ui import explore_data

    for name in list(logging.root.manager.loggerDict):  # "no ScriptRunContext" warnings: the caches still work
        if name.startswith("streamlit"):
            logging.getLogger(name).setLevel(logging.ERROR)

    return explore_data


def slider_move(data, src, ests, name: str, cfg, rollout: int):
    """What the page computes after one column's knob moved to cfg: the view of the batch under the new pairs (each
    resolved once) and every figure, table and snippet it draws (ExploreView.first_screen: the longest rollout
    picked, as the page's first view)."""
    ests = tuple((n, cfg if n == name else c) for n, c in ests)
    data.explore(src, ests).first_screen()


def run(device: str, quick: bool) -> None:
    data = view_functions()
    if data is None:
        print("\n## Explore slider move (view functions): skipped (no app/ beside scripts/, or no streamlit)")
        return
    from seqis.estimators import ESTIMATORS, SEED_ESTIMATORS
    from seqis.samplers.scenarios import SCENARIOS

    print("\n## Explore slider move: the server's work (view functions, in-process), four seed estimators, "
          "256 rollouts x 4096")
    print("floor: the same calls where every cache hits\n")
    print("| lengths | slider move: median ms | p90 ms | floor ms | x floor |")
    print("|---|---:|---:|---:|---:|")
    values = SEQ_CLIPS[:5] if quick else SEQ_CLIPS
    for lengths in ("long_tail", "fixed"):
        src = data.Source("synthetic", "gaussian", SCENARIOS["gaussian"](n_rollouts=256, max_len=4096, lengths=lengths),
                          0)
        ests = tuple((n, ESTIMATORS[n].config()) for n in SEED_ESTIMATORS)
        bv = data.batch_view(src)
        rollout = int(bv.lengths.argmax())
        slider_move(data, src, ests, ests[0][0], ests[0][1], rollout)  # warm every path once
        moves, still = [], []
        for v in values:
            cfg = ESTIMATORS["seq_tis"].config(seq_clip=v)
            t0 = time.perf_counter()
            slider_move(data, src, ests, "seq_tis", cfg, rollout)
            moves.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            slider_move(data, src, ests, "seq_tis", cfg, rollout)
            still.append(time.perf_counter() - t0)
        med, floor = statistics.median(moves), statistics.median(still)
        p90 = sorted(moves)[max(0, int(0.9 * len(moves)) - 1)]
        print(f"| {lengths} | {med * 1e3:.0f} | {p90 * 1e3:.0f} | {floor * 1e3:.1f} | {med / floor:.0f} |")


if __name__ == "__main__":
    from seqis.bench._host import host_line

    ap = argparse.ArgumentParser(prog="python scripts/bench_explore.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer slider values, for a smoke run")
    args = ap.parse_args()
    print(f"# seqis explore benchmark; {host_line()}")
    run("cpu", args.quick)
