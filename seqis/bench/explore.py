"""Section `explore`: an Explore rerun after one slider move, in-process, against a rerun where nothing changed."""

from __future__ import annotations

import math
import statistics
import time

ORDER = 40


def run(device: str, quick: bool) -> None:
    """The explorer's Explore page through Streamlit's AppTest: the four seed estimators on a 256 x 4096
    synthetic batch, the wall time of a rerun after moving one slider (seq_tis's seq_clip to a value not
    seen before, so that estimator really recomputes), against a rerun where nothing changed. Target: a
    median of at most 300 ms on 2 CPU cores. Runs on the CPU or CUDA, whichever the app picks."""
    try:
        from streamlit.testing.v1 import AppTest
    except ImportError:
        print("\n## Explore rerun: skipped (streamlit is not installed: pip install -e '.[app]')")
        return
    from pathlib import Path

    app = Path(__file__).resolve().parent.parent / "app" / "streamlit_app.py"
    if not app.exists():
        print(f"\n## Explore rerun: skipped (no {app})")
        return
    values = [2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 12.0, 15.0, 20.0, 25.0, 30.0, 40.0, 50.0, 60.0]
    n = 5 if quick else len(values)
    print("\n## Explore rerun after moving one slider (AppTest), four seed estimators, 256 rollouts x 4096")
    print("floor: a rerun where nothing changed (every cache hit)\n")
    print("| lengths | loss tokens | slider move: median ms | p90 ms | floor ms | x floor |")
    print("|---|---:|---:|---:|---:|---:|")
    for lengths in ("long_tail", "fixed"):
        at = AppTest.from_file(str(app), default_timeout=300)
        at.query_params.update({"ex.sc.gaussian.n_rollouts": "256", "ex.sc.gaussian.max_len": "4096",
                                "ex.sc.gaussian.lengths": lengths})
        at.run()
        if at.exception:
            print(f"| {lengths} | the page raised: {at.exception[0].value} |")
            continue
        key = "ex.seq_tis.seq_clip"
        at.select_slider(key=key).set_value(values[-1]).run()  # warm every path once
        moves, still = [], []
        for v in values[:n]:
            t0 = time.perf_counter()
            at.select_slider(key=key).set_value(v).run()
            moves.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            at.run()
            still.append(time.perf_counter() - t0)
        tokens = int(str(at.dataframe[1].value.loc["tokens_kept", "seq_tis"]).replace(",", ""))
        med, floor = statistics.median(moves), statistics.median(still)
        p90 = sorted(moves)[max(0, math.ceil(0.9 * len(moves)) - 1)]
        print(f"| {lengths} | {tokens:,} | {med * 1e3:.0f} | {p90 * 1e3:.0f} | {floor * 1e3:.0f} | {med / floor:.1f} |")
