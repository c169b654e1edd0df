"""The benchmark script runs and prints what the README quotes (its numbers are not checked: timing
belongs to `make bench`, not to tests on a shared machine)."""

import re

import pytest

from seqis import ESTIMATORS, PRESETS, SEED_ESTIMATORS
from seqis.bench import main, sections


def test_sections_are_found_in_order_and_named_after_their_files():
    found = sections()
    assert {"estimators", "lab", "large-gpu", "explore"} <= set(found)
    orders = [m.ORDER for m in found.values()]
    assert orders == sorted(orders)


def test_repeated_estimators_section_ends_with_a_median_and_range_per_row(capsys):
    main(["--only", "estimators", "--quick", "--repeat", "2", "--pause", "0", "--malloc", "both"])
    out = capsys.readouterr().out
    summaries = out.split("## Estimators over 2 runs")[1:]
    assert len(summaries) == 2  # one per allocator setting: glibc's defaults, then freed memory kept
    for summary in summaries:
        summary = summary.split("## Estimators:")[0]
        rows = {m.group(1): (float(m.group(2)), float(m.group(3)), float(m.group(4)))
                for m in re.finditer(r"^\| (.+?) \| [\d.]+ \| ([\d.]+) \| ([\d.]+)-([\d.]+) \|$", summary, re.M)}
        labels = [f"{n} (seed)" if n in SEED_ESTIMATORS else n for n in ESTIMATORS]
        assert set(labels) <= set(rows) and "all through run_many / the slowest single one" in rows
        for label, (median, low, high) in rows.items():
            assert 0 < low <= median <= high, label
    assert out.count(f"all {len(ESTIMATORS)} through run_many / slowest single") == 4  # one line per run
    assert out.count(f"all {len(ESTIMATORS)} + {len(PRESETS)} presets through run_many / slowest single") == 4
    compare = out.split("glibc malloc defaults against freed memory kept")[1]
    ratios = re.findall(r"^\| (.+?) \| [\d.]+ \| [\d.]+ \| ([\d.]+) \|$", compare, re.M)
    assert {label for label, _ in ratios} >= set(labels) and all(float(r) > 0 for _, r in ratios)


def test_training_section_prints_its_time_and_ratio(capsys):
    main(["--only", "train", "--quick"])
    out = capsys.readouterr().out
    pattern = r"^\| cpu \| 200 \| 32 \| ([\d.]+) \| [\d.]+ \| [\d,]+ \| ([\d.]+) \| ([\d.]+) \| (.+) \|$"
    (row,) = re.findall(pattern, out, re.M)
    seconds, floor, ratio = map(float, row[:3])
    assert seconds > 0 and floor > 0 and ratio == pytest.approx(seconds / floor, rel=0.1)
    assert all(0 <= float(v) <= 1 for v in row[3].split(", "))


def test_diagnose_section_prints_a_row_per_batch_with_its_findings(capsys):
    main(["--only", "diagnose", "--quick"])
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| ") and "x floor" not in line]
    assert len(rows) == 3
    assert "catastrophic_tokens (bad)" in rows[1] and "healthy (ok)" in rows[0]
    assert all(float(r.rstrip(" |").rsplit("|", 1)[1]) > 0 for r in rows)  # x floor
