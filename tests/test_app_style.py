"""The explorer's one palette: every registry estimator has a colour of its own, and any two colours of the
palette (estimators' and other series') are far apart in CIELAB, so two estimators never look alike on a chart;
a series named after an estimator takes its colour, the longest name that fits."""

import sys
from itertools import combinations
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "app"))
from ui.style import EXTRA, PALETTE, column_colors, estimator_color, series_color  # noqa: E402

from seqis import ESTIMATORS, PRESETS  # noqa: E402


def lab(hex_color: str) -> tuple[float, float, float]:
    """sRGB #rrggbb -> CIELAB (D65), from the formulas."""
    rgb = [int(hex_color.lstrip("#")[i:i + 2], 16) / 255 for i in (0, 2, 4)]
    lin = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in rgb]
    x = (0.4124 * lin[0] + 0.3576 * lin[1] + 0.1805 * lin[2]) / 0.95047
    y = 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]
    z = (0.0193 * lin[0] + 0.1192 * lin[1] + 0.9505 * lin[2]) / 1.08883
    f = [t ** (1 / 3) if t > (6 / 29) ** 3 else t / (3 * (6 / 29) ** 2) + 4 / 29 for t in (x, y, z)]
    return 116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])


def delta_e(a: str, b: str) -> float:
    return sum((p - q) ** 2 for p, q in zip(lab(a), lab(b))) ** 0.5


def test_every_estimator_has_its_own_colour():
    assert len(ESTIMATORS) <= len(PALETTE), "add colours to style.PALETTE: an estimator would share one"
    assert len({estimator_color(n) for n in ESTIMATORS}) == len(ESTIMATORS)


def test_any_two_colours_are_far_apart():
    close = [(a, b, round(delta_e(a, b), 1)) for a, b in combinations([*PALETTE, *EXTRA], 2) if delta_e(a, b) < 20]
    assert not close, close
    assert delta_e("#8e44ad", "#6B4C9A") < 20  # the two purples Length & thresholds had: the test would catch them


def test_a_series_takes_its_estimators_colour():
    assert series_color("seq_mis_product: w ≤ 2") == estimator_color("seq_mis_product")
    assert series_color("mis_po trajectory band [0.996, 1.001]") == estimator_color("mis_po")
    assert series_color("seq_tis") == estimator_color("seq_tis")
    assert series_color("true gradient", 0) == EXTRA[0]


def test_columns_of_presets_get_different_colours():
    names = ["seq_tis", *list(PRESETS)[:8]]
    colors = column_colors(names)
    assert len(set(colors.values())) == len(names) and colors["seq_tis"] == estimator_color("seq_tis")
