"""The benchmark script runs and prints what the README quotes (its numbers are not checked: timing
belongs to `make bench`, not to tests on a shared machine)."""

import re

from seqis import ESTIMATORS, SEED_ESTIMATORS
from seqis.bench import main


def test_repeated_estimators_section_ends_with_a_median_and_range_per_row(capsys):
    main(["--only", "estimators", "--quick", "--repeat", "2", "--pause", "0"])
    out = capsys.readouterr().out
    summary = out.split("## Estimators over 2 runs")[1]
    rows = {m.group(1): (float(m.group(2)), float(m.group(3)), float(m.group(4)))
            for m in re.finditer(r"^\| (.+?) \| [\d.]+ \| ([\d.]+) \| ([\d.]+)-([\d.]+) \|$", summary, re.M)}
    labels = [f"{n} (seed)" if n in SEED_ESTIMATORS else n for n in ESTIMATORS]
    assert set(labels) <= set(rows) and "all through run_many / the slowest single one" in rows
    for label, (median, low, high) in rows.items():
        assert 0 < low <= median <= high, label
    assert out.count("all 12 through run_many / slowest single") == 2  # one line per run
