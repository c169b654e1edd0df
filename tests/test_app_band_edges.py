"""Band edges agree on every page: a ratio equal to an edge is inside the band. Deterministic drift puts every
token's ratio at exactly 1.001, MIS-PO's upper trajectory edge, so S/T = log 1.001 on every rollout: Explore and
Length & thresholds must both say that mis_po keeps every rollout (float32 rounding once dropped 117 of 256)."""

from pathlib import Path

import pytest
from pages import charts  # noqa: E402

APP = str(Path(__file__).resolve().parent.parent / "app" / "streamlit_app.py")


def _apptest():
    pytest.importorskip("streamlit")
    from streamlit.testing.v1 import AppTest

    return AppTest


def test_explore_keeps_every_drift_rollout_at_mis_pos_edge():
    at = _apptest().from_file(APP, default_timeout=120)
    for k, v in {"ex.scenario": "drift", "ex.sc.drift.n_rollouts": "256", "ex.sc.drift.max_len": "4096",
                 "ex.sc.drift.ratio": "1.001", "ex.est": "mis_po"}.items():
        at.query_params[k] = v
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    effective = at.table[1].value  # the effective-batch table, estimators as columns
    assert float(str(effective.loc["rollouts accepted, share", "mis_po"])) == 1.0
    counts = charts(at)[0]["layout"]["title"]["subtitle"]["text"]  # under the name: accepted, clipped, rejected
    assert "256 accepted" in counts and "0 rejected" in counts


def test_length_thresholds_keeps_every_drift_length_at_mis_pos_edge():
    at = _apptest().from_file(APP, default_timeout=120)
    at.run()
    at.switch_page("views/length_thresholds.py")
    at.query_params["lt.r"] = "1.001"
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    table = next(d.value for d in at.dataframe if any(str(c).startswith("mis_po") for c in d.value.columns))
    mis_po = table[[c for c in table.columns if str(c).startswith("mis_po")][0]]
    assert (mis_po.astype(float) > 0).all(), table  # accepted at every length: its weight is not 0
