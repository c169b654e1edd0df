"""The explorer prints numbers one way (four significant digits, thousands separators below a million, scientific
notation past it) and never shows a chi-square below 0: the estimate's noise is clipped and said."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "app"))
from ui.explore_data import shown_diagnostics  # noqa: E402
from ui.numbers import number  # noqa: E402

from seqis.diagnosis.causes import _threshold_clause, mismatch_stats  # noqa: E402


@pytest.mark.parametrize("value, text", [
    (4.328611316153718e41, "4.33e+41"), (193993.0, "193,993"), (1234.56, "1,235"), (2_500_000.0, "2.5e+06"),
    (0.0012543, "0.001254"), (-0.91731, "-0.9173"), (1.5e-05, "1.5e-05"), (256.0, "256"), (0.09375, "0.09375"),
    (float("nan"), ""), (None, ""), (float("inf"), "inf"), (3, "3"), (True, "True"),
])
def test_the_page_format(value, text):
    assert number(value) == text


def test_a_negative_chi_square_is_shown_as_zero_and_said():
    shown, notes = shown_diagnostics({"chi2_token": -1.15e-3, "chi2_seq": 4.3e41, "kl_k1": -2e-4})
    assert shown["chi2_token"] == 0.0 and shown["chi2_seq"] == 4.3e41 and shown["kl_k1"] == -2e-4  # a KL k1 may
    assert len(notes) == 1 and "chi2_token" in notes[0] and "-0.00115" in notes[0] and "noisy" in notes[0]


def test_diagnoses_message_never_prints_a_negative_chi_square():
    l = torch.tensor([0.01, -0.012, 0.0, 0.003, -0.002], dtype=torch.float64)  # mean rho^2 - 1 < 0 here
    stats = mismatch_stats(l)
    assert stats["chi2_token"] < 0
    clause = _threshold_clause(stats)
    assert "chi2 0 (the estimate came out at" in clause and "chi2 -" not in clause
