"""The Run page through AppTest: the example run scanned in place, its incident listed and marked, an
uploaded scan and a folder scanned on the server read alike, a step carried to Explore, and the run scanned on
Ray with the same page and the same progress."""

import sys
from pathlib import Path

import pandas as pd
import pytest

pytest.importorskip("streamlit")
from pages import APP, charts, open_view  # noqa: E402
from streamlit.testing.v1 import AppTest  # noqa: E402

from seqis.runs import scan  # noqa: E402
from seqis.runs.example import write_prime_rl_run  # noqa: E402


def run_page(**params) -> AppTest:
    return open_view("views/run.py", **params)


def test_the_example_run_shows_its_incident_and_timelines():
    at = run_page()
    assert at.title[0].value.startswith("Run")
    table = at.dataframe[0].value
    assert (table.iloc[0]["step"], table.iloc[0]["group"]) == (5, "code")
    assert table.iloc[1]["group"] == "whole step"
    assert at.selectbox(key="run.step").value == 5  # the worst step is picked to open
    assert len(charts(at)) == 2  # 8 steps: too few for the early warning's chart
    assert at.button(key="run.incident.explore.py.5").label == "Explore"  # one click from the incident
    assert at.button(key="run.open.explore.py.5").label == "Open step 5 in Explore"


def test_opening_a_step_hands_its_batch_to_explore():
    at = run_page()
    at.button(key="run.open.explore.py.5").click().run()
    assert not at.exception, [e.value for e in at.exception]
    sys.path.insert(0, str(Path(APP).parent))
    from ui.state import BATCH_KEY

    src, payload = at.session_state[BATCH_KEY]
    assert src.name.endswith("step_5.jsonl") and payload.count(b"\n") == 12  # two ranks x six sequences


def test_a_scan_file_and_a_folder_on_the_server(tmp_path, monkeypatch):
    monkeypatch.setenv("SEQIS_DATA_ROOTS", str(tmp_path))  # the folder this server reads (test_app_paths.py)
    root = tmp_path / "outputs"
    write_prime_rl_run(root / "token_exports", steps=3, ranks=1, rollouts_per_rank=4, incident=(1, "code"))
    out = tmp_path / "scan.parquet"
    scan(root, ["seq_tis"], by="env_name", out=out, workers=1)
    at = run_page(**{"run.source": "file", "run.file": str(out)})
    assert at.dataframe[0].value.iloc[0]["step"] == 1
    labels = [b.label for b in at.button]  # the scan recorded its run folder: its steps open
    assert labels[-2:] == ["Open step 1 in Diagnose", "Open step 1 in Explore"]
    at = run_page(**{"run.source": "folder", "run.path": str(root), "run.estimators": "seq_tis,mis_po"})
    assert set(at.dataframe[0].value["step"]) == {1}
    at = run_page(**{"run.source": "folder", "run.path": str(tmp_path / "nowhere")})
    assert "no run folder by that name" in at.error[0].value


def test_the_timelines_mark_the_incident_and_keep_one_colour_per_group(tmp_path):
    sys.path.insert(0, str(Path(APP).parent))
    from ui.run_charts import WHOLE_STEP, dropped_timelines, mismatch_timeline

    from seqis.runs import incidents

    write_prime_rl_run(tmp_path, steps=4, ranks=1, rollouts_per_rank=6, envs=("a", "b"), incident=(2, "b"))
    df = scan(tmp_path, ["seq_tis", "mis_po"], by="env_name", workers=1)
    fig = mismatch_timeline(df, "kl_k3", incidents(df))
    lines = {t.name: t for t in fig.data}
    assert set(lines) == {"a", "b", WHOLE_STEP, "incident"}
    assert list(lines["incident"].x)[:1] == [2] and list(lines["b"].x) == [0, 1, 2, 3]
    assert fig.layout.yaxis.type == "log"
    drops = dropped_timelines(df, ["seq_tis", "mis_po"])
    colors = {t.name: t.line.color for t in drops.data}
    assert colors["a"] == lines["a"].line.color and len(drops.data) == 2 * 3
    assert all(0 <= y <= 1 for t in drops.data for y in t.y)
    # every correction picked (the random browser session did): a panel each, the gaps narrowed to fit
    many = pd.concat([df[df["estimator"] == "seq_tis"].assign(estimator=f"e{k}") for k in range(110)])
    tall = dropped_timelines(many, [f"e{k}" for k in range(110)])
    assert len(tall.layout.annotations) == 110 and len(tall.data) == 110 * 3
    tops = sorted(tall.layout[f"yaxis{k}" if k > 1 else "yaxis"].domain[1] for k in range(1, 111))
    assert all(b > a for a, b in zip(tops, tops[1:]))  # the panels in order, none squeezed to nothing


def test_opening_a_step_in_diagnose_shows_its_batch():
    at = run_page()
    at.button(key="run.incident.diagnose.py.5").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.radio(key="dg.source").value == "batch"


@pytest.mark.slow  # the session's local Ray (tests/conftest.py)
def test_a_run_scanned_on_ray_shows_the_same_page_with_its_progress(local_ray, monkeypatch):
    import streamlit as st

    shown = []  # every text the page's progress bar showed
    real = st.progress

    def progress(value, text=None):
        bar = real(value, text=text)
        update = bar.progress
        bar.progress = lambda v, text=None: (shown.append(text), update(v, text=text))[1]
        shown.append(text)
        return bar

    monkeypatch.setattr(st, "progress", progress)
    on_ray = run_page(**{"run.engine": "ray"})
    assert on_ray.radio(key="run.engine").value == "ray"
    assert shown[0] == "Scanning the run on Ray (its workers start first)..."
    assert [t.split(": ")[1] for t in shown[1:]] == [f"{k} of 8" for k in range(1, 9)]  # one update per step
    assert sorted(int(t.split(":")[0].split()[1]) for t in shown[1:]) == list(range(8))
    local = run_page()
    pd.testing.assert_frame_equal(on_ray.dataframe[0].value, local.dataframe[0].value)


def _looks_until(at: AppTest, text: str, tries: int = 120) -> AppTest:
    """Look again (a rerun, as the fragment's timer does) until a markdown line starts with `text`: while
    following, a folder is scanned in a thread behind the page."""
    import time

    for _ in range(tries):
        assert not at.exception, [e.value for e in at.exception]
        if any(m.value.startswith(text) for m in at.markdown):
            return at
        time.sleep(0.25)
        at.run()
    raise AssertionError(f"no '{text}' after {tries} looks: {[m.value for m in at.markdown]}")


def test_follow_rescans_a_growing_folder_marks_new_incidents_and_opens_the_latest_step(tmp_path, monkeypatch):
    import shutil

    monkeypatch.setenv("SEQIS_DATA_ROOTS", str(tmp_path))  # the folder this server reads (test_app_paths.py)

    from ui import run_data

    staged = tmp_path / "staged"
    write_prime_rl_run(staged, steps=4, ranks=1, rollouts_per_rank=4, incident=(3, "code"))
    run = tmp_path / "run"
    run.mkdir()
    for step in range(3):
        shutil.copytree(staged / f"step_{step}", run / f"step_{step}")
    at = run_page(**{"run.source": "folder", "run.path": str(run), "run.estimators": "seq_tis", "run.follow": "true"})
    assert at.toggle(key="run.follow").value
    assert [i.value for i in at.info][-1].startswith("Reading the steps that landed")  # behind the page
    _looks_until(at, "**Latest: step 2**")
    assert at.button(key="run.latest.diagnose.py.2").label == "Diagnose"  # the latest step: one click on
    assert not any("new" in m.value for m in at.markdown)  # what was there when Follow went on is not new
    shutil.copytree(staged / "step_3", run / "step_3")  # a step lands, with an incident
    _looks_until(at, "**Latest: step 3**")
    table = at.dataframe[0].value
    assert table.iloc[0]["step"] == 3 and table.iloc[0]["new"] == "new"  # marked: it landed while following
    assert set(table[table["step"] != 3]["new"]) <= {""}
    assert any(m.value.startswith("**Step 3**") and "red-badge[new]" in m.value for m in at.markdown)
    assert any("New incident: step 3" in t.value for t in at.toast)
    latest = next(df for k, df in reversed(run_data._SCANS.items()) if k[0] == str(run))
    assert (latest.attrs["summary"]["scanned"], latest.attrs["summary"]["cached"]) == (1, 3)  # only the new step
    at.button(key="run.latest.diagnose.py.3").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.radio(key="dg.source").value == "batch"  # Diagnose shows the latest step


def test_follow_is_off_for_an_upload():
    at = run_page(**{"run.source": "upload"})
    assert at.toggle(key="run.follow").disabled


def test_group_by_offers_only_the_columns_the_run_has(tmp_path, monkeypatch):
    monkeypatch.setenv("SEQIS_DATA_ROOTS", str(tmp_path))
    from seqis.io import save_batch
    from seqis.samplers.scenarios import make_batch

    verl = tmp_path / "verl"  # verl-style dumps: no env_name; data_source on the last step only
    verl.mkdir()
    for step in range(4):
        b = make_batch("gaussian", seed=step, n_rollouts=8, max_len=32)
        b.metadata.pop("group_id")
        if step == 3:
            b.metadata["data_source"] = ["gsm8k", "math"] * 4
        save_batch(b, verl / f"step_{step}.parquet")
    at = run_page(**{"run.source": "folder", "run.path": str(verl), "run.estimators": "seq_tis"})
    assert not at.exception, [e.value for e in at.exception]
    group_by = at.selectbox(key="run.by")
    assert group_by.options[0] == "none" and "data_source" in group_by.options and group_by.value == "none"
    assert not {"env_name", "step", "file"} & set(group_by.options)  # not in the run, or one value a step
    assert set(at.dataframe[0].value["step"]) <= {0, 1, 2, 3}
    group_by.set_value("data_source").run()
    assert not at.exception and not at.warning, [w.value for w in at.warning]
    assert any("3 of 4 steps have no metadata column 'data_source'" in i.value for i in at.info)
    bare = tmp_path / "bare"  # no metadata column with few values at all
    bare.mkdir()
    for step in range(2):
        b = make_batch("gaussian", seed=step, n_rollouts=8, max_len=32)
        save_batch(b.__class__(b.trainer_logprobs, b.inference_logprobs, b.advantages, b.loss_mask),
                   bare / f"step_{step}.parquet")
    at = run_page(**{"run.source": "folder", "run.path": str(bare), "run.estimators": "seq_tis"})
    assert not at.exception and "run.by" not in [w.key for w in at.selectbox]
    assert any("carry no metadata column with a few values" in c.value for c in at.caption)


def test_a_damaged_scan_file_is_refused_with_a_message(tmp_path, monkeypatch):
    monkeypatch.setenv("SEQIS_DATA_ROOTS", str(tmp_path))
    bad = tmp_path / "scan.parquet"  # found by the randomised browser session: a damaged upload raised
    bad.write_bytes(b"PAR1 not a parquet")
    at = run_page(**{"run.source": "file", "run.file": str(bad)})
    assert not at.exception, [e.value for e in at.exception]
    assert "not a scan parquet" in at.error[0].value
