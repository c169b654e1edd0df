"""The Training page through Streamlit's AppTest: the default run renders its curves and its ordering, a
link's query parameters restore a view, long runs wait for "Run", bad settings give an error, not a traceback.
Runs are small (set through the URL) to stay quick."""

import json
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from pages import charts  # noqa: E402
from streamlit.testing.v1 import AppTest  # noqa: E402

APP = str(Path(__file__).resolve().parent.parent / "app" / "streamlit_app.py")
SMALL = {"tr.H": "32", "tr.steps": "25", "tr.B": "32", "tr.seeds": "2"}


def open_page(**params) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=180)
    at.run()
    at.switch_page("views/training.py")
    for k, v in params.items():
        at.query_params[k] = v
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


@pytest.fixture(scope="module")
def default_page() -> AppTest:
    return open_page()


def test_default_run_shows_curves_for_every_estimator(default_page):
    at = default_page
    assert at.title[0].value == "Training under policy lag"
    assert not at.error, [e.value for e in at.error]
    curves, diag, sweeps = charts(at)
    published = [t for t in sweeps["data"] if t.get("xaxis") == "x"]  # Huang's horizon sweep, shown at once
    assert {t["name"] for t in published} == {"Sequence IS", "Token IS", "GeoMean IS"}
    assert any(b.label.startswith("Run our three sweeps") for b in at.button)
    names = {t["name"] for t in curves["data"] if t.get("showlegend", True) and "name" in t}
    assert names == {"Sequence IS", "Token IS", "GeoMean IS", "Sequence TIS 0-2"}
    final = at.dataframe[0].value.set_index("estimator")["final J (mean)"]
    assert final.between(0, 1).all()
    assert "‖g‖" in json.dumps(diag, ensure_ascii=False)


def test_url_restores_the_view_and_the_run(default_page):
    at = open_page(**SMALL, **{"tr.est": "seq_is,pg", "tr.K": "5", "tr.fault": "top-p", "tr.top_p": "0.9",
                                "tr.opt": "adam", "tr.lr": "0.05", "tr.baseline": "1"})
    assert at.select_slider(key="tr.H").value == 32 and at.select_slider(key="tr.K").value == 5
    assert at.multiselect(key="tr.est").value == ["seq_is", "pg"]
    assert at.selectbox(key="tr.fault").value == "top-p" and at.slider(key="tr.top_p").value == 0.9
    assert list(at.dataframe[0].value["estimator"]) == ["seq_is", "pg"]
    assert at.selectbox(key="tr.opt").value == "adam" and at.checkbox(key="tr.baseline").value
    caption = at.caption[0].value
    assert "H=32" in caption and "lag 5" in caption and "Adam" in caption and "batch mean" in caption


def test_tabular_toy_and_a_big_run_waits_for_run():
    at = open_page(**{"tr.toy": "tabular", "tr.steps": "25", "tr.seeds": "1", "tr.est": "seq_is,geo_is"})
    assert "TabularAR" in at.caption[0].value and len(at.dataframe[0].value) == 2
    big = open_page(**{"tr.H": "512", "tr.steps": "2000", "tr.B": "1024", "tr.seeds": "16"})
    assert any("press **Run**" in i.value for i in big.info) and not charts(big)


def test_a_precision_fault_on_the_tabular_toy_is_an_error_not_a_traceback():
    at = AppTest.from_file(APP, default_timeout=120)
    at.run()
    at.switch_page("views/training.py")
    for k, v in {"tr.toy": "tabular", "tr.fault": "bf16", "tr.steps": "25", "tr.seeds": "1"}.items():
        at.query_params[k] = v
    at.run()
    assert not at.exception
    assert any("top_p fault only" in e.value for e in at.error)


def test_sweep_small_multiples_put_ours_above_the_published_points():
    import sys

    import pandas as pd

    sys.path.insert(0, str(Path(APP).parent))
    from ui import training_charts

    from seqis.lab import huang2026

    pub = huang2026.frame()
    panels = {}
    for what, x in (("horizon", "horizon"), ("lag", "lag"), ("batch", "batch_size")):
        p = pub[(pub["figure"] == what) & (pub["batch_size"] >= (4096 if what == "lag" else 0))]
        ours = pd.DataFrame({"x": [1, 2], "estimator": "Sequence IS", "mean": [0.9, 0.8], "sem": [0.01, 0.02]})
        panels[what] = {"ours": ours, "published": p.rename(columns={x: "x"})}
    fig = training_charts.sweeps(panels)
    assert len(fig.layout.annotations) == 6  # three sweeps, ours and published
    top = [t for t in fig.data if t.xaxis == "x"]
    assert list(top[0].y) == [0.9, 0.8] and list(top[0].error_y.array) == [0.02, 0.04]
    seq_h = [t for t in fig.data if t.xaxis == "x4" and t.name == "Sequence IS"][0]
    assert list(seq_h.x) == [128, 256, 512, 1024] and seq_h.y[-1] == 0.7487
