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
    assert len(charts(at)) == 2
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
