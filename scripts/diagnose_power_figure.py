"""docs/diagnose_power.png, the power bench's curves as a picture: `python scripts/diagnose_power_figure.py [TABLE]
[--out PNG]`.

Reads the power table (default assets/bench/diagnose_power.json, written by `python -m seqis.bench --only
diagnose-power`) and draws the Diagnose page's grid of every detector's detection rate against its fault's size,
at both simulated sizes (one draw solid, a quarter of it dotted), through kaleido and Debian's chromium. Simulates
nothing.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "app"))

from ui.diagnose_charts import power_grid_figure  # noqa: E402
from ui.png import to_png  # noqa: E402

from seqis.diagnosis import power as diagnose_power  # noqa: E402


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("table", nargs="?", default=str(diagnose_power.POWER_TABLE))
    ap.add_argument("--out", default=str(ROOT / "docs" / "diagnose_power.png"))
    args = ap.parse_args(argv)
    table = diagnose_power.load(args.table)
    if table is None:
        raise SystemExit(f"no power table at {args.table}: run {diagnose_power.COMMAND}")
    gens = ", ".join(table["generators"])
    # the sizes by name: a lag draw holds 4x the rollouts, so its "one draw" is larger than the others'
    sizes = [(label, diagnose_power.views(table, 0, size)) for size, label in (("whole", "one draw"),
                                                                               ("quarter", "a quarter of it"))]
    fig = power_grid_figure(sizes, f"What each detector can see: the share of batches where it names its fault, "
                            f"against the fault's size ({gens}; {table['seeds']} seeds, every batch a new draw)",
                            faults=list(table["faults"]))
    Path(args.out).write_bytes(to_png({"grid": fig}, width=1200, scale=1.5)["grid"])
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
