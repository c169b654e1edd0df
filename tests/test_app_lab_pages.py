"""The Length & thresholds and Bias & variance pages through Streamlit's AppTest: they render without an
exception, their sliders move the numbers they should, and a link's query parameters restore a view.

Bias & variance tests use a small lab (H = 16, 32-64 rollouts x 50 batches, set through the URL) to stay
quick; one renders the untouched first screen of each page.
"""

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from pages import bound_to_url, charts  # noqa: E402
from streamlit.testing.v1 import AppTest  # noqa: E402

APP = str(Path(__file__).resolve().parent.parent / "app" / "streamlit_app.py")
SMALL_LAB = {"bv.H": "16", "bv.k": "10", "bv.B": "32", "bv.nb": "50", "bv.est": "seq_is,seq_tis,pg"}


def open_page(page: str, **params) -> AppTest:
    """The app with `page` open and `params` in the URL (the frame runs the default page first)."""
    at = AppTest.from_file(APP, default_timeout=120)
    at.run()
    at.switch_page(page)
    for k, v in params.items():
        at.query_params[k] = v
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    return at


def metrics(at: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def metric_starting(at: AppTest, prefix: str) -> str:
    hits = [v for k, v in metrics(at).items() if k.startswith(prefix)]
    assert len(hits) == 1, (prefix, metrics(at))
    return hits[0]


def chart_text(at: AppTest) -> str:
    """Every plotly chart's JSON, unicode unescaped (titles, legends, annotations, hover text)."""
    return " ".join(json.dumps(c, ensure_ascii=False) for c in charts(at))


# ---------------------------------------------------------------------------------------------------------
# Length & thresholds


@pytest.fixture(scope="module")
def lt() -> AppTest:
    return open_page("views/length_thresholds.py")


def test_lt_first_screen_tells_the_story(lt):
    assert lt.title[0].value == "Length & thresholds"
    assert lt.select_slider(key="lt.s").value == 0.05
    # s = 0.05 (Li & Liu; Step 3.5 Flash): product band [0.5, 2] keeps 0.049 at T = 4096, mis_po's band 0.159 at T = 16
    assert metric_starting(lt, "product band [0.5, 2] keeps, T = 4096") == "4.9%"
    assert metric_starting(lt, "geometric band [0.5, 2] keeps, T = 4096") == "100.0%"
    assert metric_starting(lt, "mis_po trajectory band keeps, T = 16") == "15.9%"
    assert metric_starting(lt, "w = r^T crosses C = 5") == "T = 1610"
    assert len(charts(lt)) == 5  # acceptance, KL cutoff, moments, catastrophic, drift
    text = chart_text(lt)
    for label in ("product band [0.5, 2]", "seq_mis_product: w ≤ 2", "mis_po trajectory band [0.996, 1.001]",
                  "cutoff 0.0040", "geo T* = 14.4", "crosses C at T = 1610"):
        assert label in text, label


def test_lt_moving_s_changes_acceptance(lt):
    lt.select_slider(key="lt.s").set_value(0.1).run()
    assert not lt.exception
    assert metric_starting(lt, "product band [0.5, 2] keeps, T = 4096") == "0.1%"
    assert lt.session_state["lt.s"] == 0.1 and bound_to_url(lt.select_slider(key="lt.s"))  # the URL follows
    assert "Acceptance vs length, s = 0.1" in chart_text(lt)
    lt.select_slider(key="lt.s").set_value(0.05).run()
    assert metric_starting(lt, "product band [0.5, 2] keeps, T = 4096") == "4.9%"


def test_lt_moving_bands_and_clip(lt):
    lt.select_slider(key="lt.mispo.geo_mask_low").set_value(0.9).run()  # a wide trajectory band keeps short rollouts
    assert float(metric_starting(lt, "mis_po trajectory band keeps, T = 16").rstrip("%")) > 50
    assert "cutoff 0.1054" in chart_text(lt)  # -log 0.9
    lt.select_slider(key="lt.clip.seq_clip").set_value(10.0).run()
    assert "seq_mis_product: w ≤ 10" in chart_text(lt)
    lt.select_slider(key="lt.r").set_value(1.002).run()
    assert metric_starting(lt, "w = r^T crosses C = 5") == "T = 806"


def test_lt_query_params_restore_a_view():
    at = open_page("views/length_thresholds.py", **{"lt.s": "0.1", "lt.geo.geo_mask_low": "0.9", "lt.L": "20",
                                                    "lt.drift_C": "10.0"})
    assert at.select_slider(key="lt.s").value == 0.1
    assert at.select_slider(key="lt.geo.geo_mask_low").value == 0.9
    assert at.select_slider(key="lt.L").value == 20
    # -s^2/2 = -0.005 lies inside (log 0.9, log 2): the geometric band keeps every long rollout
    assert metric_starting(at, "geometric band [0.9, 2] keeps, T = 4096") == "100.0%"
    assert metric_starting(at, "w = r^T crosses C = 10") == "T = 2304"
    assert "geo T* = 190" in chart_text(at)  # L / -log 0.9 = 189.8


def test_lt_bad_url_values_fall_back_to_defaults():
    at = open_page("views/length_thresholds.py", **{"lt.s": "banana", "lt.L": "7.5"})
    assert at.select_slider(key="lt.s").value == 0.05
    assert at.select_slider(key="lt.L").value == 10


# ---------------------------------------------------------------------------------------------------------
# Bias & variance


def test_bv_first_screen_tells_the_story():
    at = open_page("views/bias_variance.py")
    assert at.title[0].value == "Bias & variance"
    assert at.multiselect(key="bv.est").value == ["seq_is", "seq_tis", "token_tis", "pg", "geo_mask"]
    assert len(charts(at)) == 4  # error bars, gradients, knob sweep, frontier
    table = at.table[0].value.set_index("estimator")
    # Huang's chain (H = 64, k = 40, p = 0.6, q = 0.55): naive PG is far more biased than token TIS, and
    # sequence IS is unbiased (its bias² sits within a few noise floors) but has the largest variance
    assert table.loc["pg", "rel. bias"] > table.loc["token_tis", "rel. bias"] > 0.2
    assert table.loc["seq_is", "bias²"] < 4 * table.loc["seq_is", "noise floor"]
    assert table["variance"].idxmax() == "seq_is"
    # the headline is bias against variance: each estimator's share of MSE that is bias², and those whose error is
    # mostly bias (no batch size removes it): naive PG among them, unbiased seq_is not
    excess = (table["bias²"] - table["noise floor"]).clip(lower=0)
    assert set(metric_starting(at, "bias² > variance").split(", ")) == set(table.index[excess > table["variance"]])
    assert "pg" in metric_starting(at, "bias² > variance") and "seq_is" not in metric_starting(at, "bias² > variance")
    line = next(m.value for m in at.markdown if m.value.startswith("**Bias or variance?**"))
    assert f"token_tis **{excess['token_tis'] / table.loc['token_tis', 'MSE']:.0%}**" in line
    contrast = " ".join(c.value for c in at.caption)
    assert "**56.7%** of the true one with the threshold reward and **100.0%** with the additive one" in contrast
    share = float(metric_starting(at, "seq_is (unbiased): share of its MSE from variance").rstrip("%")) / 100
    assert share == pytest.approx(table.loc["seq_is", "variance"] / table.loc["seq_is", "MSE"], abs=1e-3)
    text = chart_text(at)
    assert "seq_tis: bias², variance and MSE vs seq_clip" in text
    assert "Batch-size frontier" in text


def test_bv_says_when_an_estimator_keeps_tokens_but_learns_nothing():
    # Huang's chain (H = 64, k = 40): mis_po's default trajectory band [0.996, 1.001] admits only rollouts with
    # 36 or 37 ones (geometric log-ratio within [-0.004, 0.001]); all have reward 0, so its gradient is 0
    at = open_page("views/bias_variance.py", **{"bv.B": "32", "bv.nb": "50", "bv.est": "mis_po,seq_tis"})
    table = at.table[0].value.set_index("estimator")
    assert table.loc["mis_po", "variance"] == 0 and table.loc["mis_po", "dropped"] < 0.99
    warnings = [w.value for w in at.warning]
    assert any(w.startswith("mis_po keeps") and "exactly 0 in every batch" in w for w in warnings), warnings
    assert not any(w.startswith("seq_tis") for w in warnings)
    assert "mis_po" not in metric_starting(at, "bias² > variance")  # not the estimator that learns nothing


def test_bv_query_params_restore_a_view():
    at = open_page("views/bias_variance.py", **SMALL_LAB, **{"bv.p": "0.7", "bv.sweep": "sampler lag K"})
    assert at.select_slider(key="bv.H").value == 16
    assert at.select_slider(key="bv.p").value == 0.7
    assert list(at.table[0].value["estimator"]) == ["seq_is", "seq_tis", "pg"]
    assert "BitChain(H=16, k=10, p=0.7, q=0.55" in at.caption[0].value
    assert "bias², variance and MSE vs sampler lag K" in chart_text(at)


def test_bv_run_button_applies_the_form():
    at = open_page("views/bias_variance.py", **SMALL_LAB)
    before = at.table[0].value["MSE"].tolist()
    at.select_slider(key="bv.B").set_value(64)
    at.button(key="bv_run").click().run()  # the lab's widgets live in a form: "Run" applies them
    assert not at.exception
    assert "64 rollouts per batch" in at.caption[0].value
    after = at.table[0].value["MSE"].tolist()
    assert all(a < b for a, b in zip(after, before, strict=True))  # twice the batch: less variance
    assert at.session_state["bv.B"] == 64 and bound_to_url(at.select_slider(key="bv.B"))  # the URL follows


def test_bv_tabular_toy_shows_exact_expectations():
    at = open_page("views/bias_variance.py", **{"bv.toy": "tabular", "bv.B": "32", "bv.nb": "50",
                                                 "bv.est": "seq_is,token_tis,mis_po"})
    assert "TabularAR(V=3, T=4" in at.caption[0].value
    text = chart_text(at)
    # every estimator's exact expectation is drawn (enumeration of the 3^4 sequences)
    assert text.count("(exact mean)") == 3
    assert "MSE of answering 0: ‖∇J‖²" in text
    # mis_po's trajectory band [0.996, 1.001] rejects every short, mismatched rollout: a zero gradient
    assert any("mis_po drops 100%" in w.value for w in at.warning)


def test_bv_bad_toy_shows_an_error():
    at = AppTest.from_file(APP, default_timeout=120)
    at.run()
    at.switch_page("views/bias_variance.py")
    at.query_params.update({**SMALL_LAB, "bv.k": "40"})  # threshold above the horizon
    at.run()
    assert not at.exception
    assert any("threshold" in e.value for e in at.error)


def test_bv_opens_with_the_first_view_computed_at_start_up(monkeypatch):
    """The app computes Bias & variance's first view in the background (lab_data.default_run); the page then
    finds every Monte Carlo result it needs in the memo: no run starts when it opens."""
    sys.path.insert(0, str(Path(APP).parent))
    from ui import lab_data

    import seqis.lab

    lab_data.default_run("cpu")

    def refuse(*a, **k):
        raise AssertionError("the page ran a Monte Carlo that the start-up run should have computed")

    for name in ("monte_carlo_many", "sweep_knob", "sweep_batch_size"):
        monkeypatch.setattr(seqis.lab, name, refuse)
    at = open_page("views/bias_variance.py")
    assert at.title[0].value.startswith("Bias & variance")
    assert len(charts(at)) == 4


def test_memo_computes_a_key_once_while_another_caller_waits():
    import threading
    import time

    sys.path.insert(0, str(Path(APP).parent))
    from ui.runtime.memo import memo

    calls = []

    def slow():
        calls.append(1)
        time.sleep(0.3)
        return len(calls)

    key = ("test-memo-in-flight", time.time())
    results = []
    threads = [threading.Thread(target=lambda: results.append(memo(key, slow))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == [1] and results == [1, 1, 1]
