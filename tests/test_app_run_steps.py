"""The Run page (issue 43): after switching runs the Step selector shows the new run's worst step, not the step the
run before had; a missing step is a gap in every timeline, not a line drawn across it; the early warning reads each
step against its own history and states its false-alarm rate on clean runs."""

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("streamlit")
from pages import APP, charts, open_view  # noqa: E402

from seqis.diagnosis import trend  # noqa: E402
from seqis.runs import scan  # noqa: E402
from seqis.runs.example import write_prime_rl_run  # noqa: E402

sys.path.insert(0, str(Path(APP).parent))


def test_switching_runs_resets_the_step_to_the_new_runs_worst(tmp_path, monkeypatch):
    monkeypatch.setenv("SEQIS_DATA_ROOTS", str(tmp_path))
    root = tmp_path / "outputs"
    write_prime_rl_run(root / "token_exports", steps=6, ranks=1, rollouts_per_rank=4, incident=(1, "code"))
    out = tmp_path / "scan.parquet"
    scan(root, ["seq_tis"], by="env_name", out=out, workers=1)
    at = open_view("views/run.py")  # the example run: its worst step is 5
    assert at.selectbox(key="run.step").value == 5
    at.selectbox(key="run.step").set_value(3).run()
    assert at.selectbox(key="run.step").value == 3
    at.radio(key="run.source").set_value("file").run()
    at.selectbox(key="run.file").set_value(str(out)).run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.selectbox(key="run.step").value == 1  # the new run's worst step, not the 3 picked in the example


def test_a_step_from_the_url_holds_on_a_first_look():
    at = open_view("views/run.py", **{"run.step": "2"})
    assert at.selectbox(key="run.step").value == 2


def _scan_rows(steps, groups=("a", "b")) -> pd.DataFrame:
    rows = [dict(step=s, group=g, estimator="seq_tis", kl_k3=1e-3 * (1 + 0.01 * s), dropped=0.1, reason="")
            for s in steps for g in (*groups, None)]
    return pd.DataFrame(rows)


def test_a_missing_step_is_a_gap_in_every_timeline():
    from ui.run_charts import dropped_timelines, early_warning, mismatch_timeline, step_grid

    df = _scan_rows([0, 1, 2, 4, 5])  # step 3 was not read
    assert step_grid(df) == [0, 1, 2, 3, 4, 5]
    assert step_grid(_scan_rows([0, 10, 20, 30])) == [0, 10, 20, 30]  # a stride: nothing missing
    for fig in (mismatch_timeline(df, "kl_k3"), dropped_timelines(df, ["seq_tis"]), early_warning(df, "kl_k3")[0]):
        for t in fig.data:
            if t.name == "alarm":
                continue
            x, y = list(t.x), list(t.y)
            assert x == [0, 1, 2, 3, 4, 5] and (y[3] is None or np.isnan(y[3])), (t.name, x, y)
            assert not t.connectgaps  # plotly breaks the line at the missing value
    one = _scan_rows([0, 1, 2, 3])
    one = one[~((one["step"] == 2) & (one["group"] == "b"))]  # group b missing at step 2 only
    b = next(t for t in mismatch_timeline(one, "kl_k3").data if t.name == "b")
    assert list(b.x) == [0, 1, 2, 3] and np.isnan(list(b.y)[2])


def test_the_trend_z_reads_each_step_against_the_steps_before_it():
    rng = np.random.default_rng(0)
    x = np.exp(0.1 * rng.standard_normal(40)) * 1e-3
    x[30] = 5e-3  # a five-fold jump
    z = trend.trend_z(x)
    assert np.isnan(z[: trend.MIN_HISTORY]).all() and np.isfinite(z[trend.MIN_HISTORY:]).all()
    # the reference from the formula at step 30: the 20 steps before it, median and 1.4826 MAD of the log
    past = np.log(x[10:30])
    med = np.median(past)
    assert z[30] == pytest.approx((np.log(x[30]) - med) / (1.4826 * np.median(np.abs(past - med))), rel=1e-12)
    assert trend.alarms(x)[30] and trend.alarms(x).sum() == 1
    assert trend.metric_z("abs_ratio_mean", 1 + x)[30] == pytest.approx(z[30])  # its excess over 1


def test_the_run_page_draws_the_early_warning_and_states_its_false_alarm_rate(tmp_path, monkeypatch):
    at = open_view("views/run.py")  # the example run: 8 steps, too few to read one against its history
    assert any(s.value == "Early warning" for s in at.subheader)
    said = " ".join(c.value for c in at.caption)
    assert f"about {trend.CLEAN_FALSE_ALARM:.1g} of the time" in said and "docs/diagnose.md" in said
    assert "This run has 8 steps: a step is read once 8 steps came before it." in said
    monkeypatch.setenv("SEQIS_DATA_ROOTS", str(tmp_path))
    root = tmp_path / "outputs"
    write_prime_rl_run(root / "token_exports", steps=12, ranks=1, rollouts_per_rank=4, incident=(10, "code"))
    out = tmp_path / "scan.parquet"
    scan(root, ["seq_tis"], by="env_name", out=out, workers=1)
    at = open_view("views/run.py", **{"run.source": "file", "run.file": str(out)})
    assert any("against its last 20 steps" in str(c.get("layout", {}).get("title", "")) for c in charts(at))
