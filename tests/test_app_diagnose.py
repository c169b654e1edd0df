"""The Diagnose page through AppTest: each tiny-transformer fault shows its finding first with its chart and,
beside it, what its detector can see at the batch's size; the per-group table, the raw ratio tables and the worst
rollout; a recurrent LM's raw log-probs; the explorer's batch is diagnosed too."""


import pytest

pytest.importorskip("streamlit")
from pages import charts, open_view  # noqa: E402
from streamlit.testing.v1 import AppTest  # noqa: E402


def diagnose_page(**params) -> AppTest:
    return open_view("views/diagnose.py", timeout=300, **params)


def test_a_fault_is_named_first_with_its_chart_and_the_tables():
    at = diagnose_page(**{"dg.fault": "top-p 0.9 in the sampler"})
    assert at.title[0].value == "Diagnose"
    first = [m.value for m in at.markdown if "**" in m.value and "background" in m.value][0]
    assert "Sampler truncation" in first and "log_offset" in first
    drawn = charts(at)
    assert len(drawn) == 3  # the finding's histogram, what its detector can see, the worst rollout
    power = drawn[1]
    assert "What this detector can see" in power["layout"]["title"]["text"]
    names = {t["name"] for t in power["data"]}  # the faults sampler_truncation detects, and this batch's offset
    assert {"top-p", "top-k"} <= names and any(n.startswith("this batch: 0.02") for n in names)
    assert all(0 <= y <= 1 for t in power["data"] for y in t["y"])
    tokens, rollouts = at.dataframe[2].value, at.dataframe[3].value  # the corrections: tokens, then rollouts
    worst = at.dataframe[4].value
    assert {"position", "token_id", "trainer_logprob", "inference_logprob", "entropy"} <= set(worst.columns)
    assert {"seq_tis", "mis_po"} <= set(tokens.index) and list(tokens.index) == list(rollouts.index)
    assert {"tokens_masked", "tokens_truncated"} == set(tokens.columns)
    assert {"rollouts_masked", "rollouts_truncated"} <= set(rollouts.columns)
    at.selectbox(key="dg.by").set_value("group_id").run()
    assert not at.exception
    groups = at.dataframe[0].value  # drawn above the ratio tables
    assert len(groups) and set(groups["finding"]) >= {"sampler_truncation"}


@pytest.mark.parametrize("fault, kind", [("log-probs one position late", "Token misalignment"),
                                         ("kernel bug on one token", "Catastrophic tokens")])
@pytest.mark.slow  # make test runs it; the fast suite stays under two minutes
def test_other_faults_lead_with_their_finding(fault, kind):
    at = diagnose_page(**{"dg.fault": fault})
    first = [m.value for m in at.markdown if "background" in m.value][0]
    assert kind in first and "bad" in first


@pytest.mark.slow  # make test runs it; the fast suite stays under two minutes
def test_a_fault_opens_in_explore():
    at = diagnose_page(**{"dg.fault": "sampler at temperature 0.7"})
    at.button(key="dg.open.explore").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.title[0].value.startswith("Explore")
    assert any("tiny_lm" in c.value for c in at.caption)  # Explore names the batch it shows


def test_raw_logprobs_of_a_recurrent_lm_lead_with_their_detector_beside():
    at = diagnose_page(**{"dg.fault": "raw log-probs: drawn at temperature 0.8, reported raw (1k-token LM)"})
    first = [m.value for m in at.markdown if "background" in m.value][0]
    assert "Raw log-probs reported" in first and "entropy_gap" in first and "bad" in first
    assert any("lm_mixed1k" in c.value for c in at.caption)
    gap, power = charts(at)[:2]  # the tokens' -log pi - H beside what the detector can see
    assert "Raw log-probs" in gap["layout"]["title"]["text"]
    assert "What this detector can see" in power["layout"]["title"]["text"]


@pytest.mark.slow  # make test runs it; the fast suite stays under two minutes
def test_a_clean_sampler_says_what_the_tests_could_have_seen():
    at = diagnose_page(**{"dg.fault": "clean bf16 sampler"})
    grid = next(c for c in charts(at) if "What each test could have seen" in c["layout"]["title"]["text"])
    panels = {a["text"] for a in grid["layout"]["annotations"]}  # one panel per detector
    assert {"Truncation (top-p, top-k)", "Temperature", "Raw log-probs", "Policy lag"} <= panels
    assert all(0 <= y <= 1 for t in grid["data"] for y in t["y"]) and len(grid["data"]) >= 6
    seen = at.dataframe[0].value
    assert {"top-p", "temperature", "raw log-probs", "lag"} <= set(seen["fault"])
    assert {"sampler_truncation", "policy_lag"} <= set(seen["finding"])


def test_the_explorers_batch():
    at = diagnose_page(**{"dg.source": "batch"})
    cards = [m.value for m in at.markdown if "background" in m.value]
    assert cards and any("Precision noise" in c or "Healthy" in c for c in cards)


def test_the_temperature_chart_of_a_slope_no_temperature_gives():
    # a slope at or above 1 (tau = inf in the evidence): the chart says "not estimable", never "infx" (issue 43)
    import math

    import numpy as np
    import pandas as pd
    from ui.diagnose_charts import temperature_figure

    x = np.linspace(-4.0, -0.1, 40)
    points = pd.DataFrame({"trainer_logprob": x, "log_ratio": 1.3 * x + 0.5, "rollout": 0, "position": range(40)})
    fig = temperature_figure(points, {"slope": 1.3, "temperature": math.inf})
    said = str(fig.layout.title.to_plotly_json()) + " ".join(t.name or "" for t in fig.data)  # (title on two lines)
    assert "not estimable" in said and "no finite tau" in said and "inf" not in said.replace("finite", "")
    fig = temperature_figure(points, {"slope": 0.2, "temperature": 1.25})
    assert "1.25x the trainer's" in str(fig.layout.title.to_plotly_json())


def test_a_fault_only_one_environment_shows_is_the_first_card():
    # assets/tiny_lm_math_temperature0.7.parquet: only env = math samples at 0.7; the whole batch reads as noise
    at = diagnose_page(**{"dg.source": "batch", "ex.source": "asset",
                          "ex.asset": "tiny_lm_math_temperature0.7.parquet"})
    cards = [m.value for m in at.markdown if "background" in m.value]
    assert "Temperature mismatch" in cards[0] and "env = math" in cards[0] and "bad" in cards[0]
    assert any("Precision noise" in c for c in cards[1:])  # the whole batch's verdict follows
    assert "env" in at.selectbox(key="dg.by").options
    temperature = charts(at)[0]  # drawn from math's tokens
    assert "emperature" in temperature["layout"]["title"]["text"]
