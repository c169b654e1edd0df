"""The warm-up (app/ui/warm.py) computes exactly what the pages then ask for: after it, Explore's first view and
a Learn preset's view build no batch and run no estimator (a cache miss here would mean the warm-up computed a
different key than the page, its work wasted)."""

import sys

import pytest

pytest.importorskip("streamlit")
from pages import APP, charts, open_view  # noqa: E402

sys.path.insert(0, APP.rsplit("/", 1)[0])
from ui import explore_data, head_data, warm  # noqa: E402
from ui.presets import PRESETS, compare_first  # noqa: E402
from ui.state import dump  # noqa: E402

import seqis.samplers.scenarios  # noqa: E402


def _no_computing(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("the page computed something the warm-up should have computed")

    monkeypatch.setattr(seqis.samplers.scenarios, "make_batch", refuse)
    monkeypatch.setattr(explore_data, "run_many", refuse)
    monkeypatch.setattr(head_data, "_evaluate_centered", refuse)  # the head section's score centering


def test_the_first_view_is_computed_before_the_page_opens(monkeypatch):
    # before the server listens: its charts; the background's first step: its head section (below every chart)
    warm.first_view()
    warm.background_steps()[0]()
    _no_computing(monkeypatch)
    at = open_view("views/explore.py")
    assert not at.error
    assert len(charts(at)) == 7  # four rollout maps, the heatmap, coefficients, weights and effective batch


def test_a_learn_presets_view_is_computed_by_the_warm_up(monkeypatch):
    icepop = next(p for p in PRESETS["icepop"] if p.page == "ex")
    src, ests = warm.explore_inputs(icepop.view)
    assert src.name == "catastrophic" and src.config.max_len == 4096 and [n for n, _ in ests] == ["icepop", "mis_po"]
    warm.view(src, ests)
    _no_computing(monkeypatch)
    at = open_view("views/explore.py", **{k: dump(v) for k, v in icepop.view.items()})  # a link in the older form
    assert not at.error
    assert len(charts(at)) == 5


def test_streamlit_run_app_serves_an_app_that_warms_before_it_listens(monkeypatch):
    """`streamlit run app` looks in app/streamlit_app.py for an ASGI app and serves it: the st.App there, whose
    lifespan computes Explore's first screen before the server answers (without it a fresh server's first visitor
    waited for the imports, the batch and every figure)."""
    import asyncio
    from pathlib import Path

    from streamlit.web.server.app_discovery import discover_asgi_app

    found = discover_asgi_app(Path(APP))
    assert found.is_asgi_app and found.import_string == "streamlit_app:app"
    done = []
    monkeypatch.setattr(warm, "before_serving", lambda: done.append("first screen"))
    monkeypatch.setattr(warm, "start_background", lambda: done.append("background") or True)

    async def serve():
        async with warm.lifespan(None):
            done.append("serving")

    asyncio.run(serve())
    assert done == ["first screen", "background", "serving"]


def test_compares_first_view_is_computed_by_the_warm_up(monkeypatch):
    warm.compare_view()
    _no_computing(monkeypatch)
    at = open_view("views/compare.py")
    first = compare_first(explore_data.load_batch(warm.scenario(warm.FIRST_SCENARIO)).has_head)
    assert not at.error and len(charts(at)) == len(first) == 4  # a rollout map each; the first batch has a head


def test_the_background_warm_up_waits_while_a_page_runs(monkeypatch):
    """A page run and the warm-up share the interpreter's lock: no warm-up step starts while a page runs, nor
    within QUIET_S of its end; each starts once pages are quiet."""
    import threading
    import time

    monkeypatch.setattr(warm, "QUIET_S", 0.2)
    started = []
    steps = [lambda i=i: started.append((i, time.monotonic())) for i in range(3)]
    with warm.page_running():
        t = threading.Thread(target=warm.run_when_quiet, args=(steps,), kwargs={})
        t0 = time.monotonic()
        t.start()
        time.sleep(0.4)
        assert started == []  # the page is still running
        with warm.page_running():  # a second page, overlapping
            pass
        assert started == []
    ended = time.monotonic()
    t.join(timeout=10)
    assert [i for i, _ in started] == [0, 1, 2]
    assert started[0][1] - ended >= 0.2 - 0.01 and started[0][1] > t0


def test_a_fragments_rerun_holds_the_warm_up_as_a_page_run_does(monkeypatch):
    """A knob move reruns its column's fragment alone, not the page frame: warm.fragment counts those reruns as
    page runs (before, the warm-up took a page whose knobs were being moved for a quiet one and ran beside the
    moves). Every st.fragment of the pages is made by it."""
    import pathlib
    import re
    import time

    import streamlit

    made = {}
    monkeypatch.setattr(streamlit, "fragment", lambda fn, **kw: made.setdefault("fn", fn))
    inside = []
    rerun = warm.fragment(lambda x: inside.append((warm._pages, x)) or x)
    assert rerun is made["fn"]
    before = warm._last_page
    time.sleep(0.01)
    assert rerun(7) == 7  # a fragment's rerun: the page frame is not around it
    assert inside == [(1, 7)] and warm._pages == 0 and warm._last_page > before
    views = pathlib.Path(APP).parent / "views"
    bare = [f"{p.name}: {m.group(0)}" for p in views.glob("*.py")
            for m in re.finditer(r"st\.fragment\(", p.read_text())]
    assert not bare, bare  # a fragment made by st.fragment would let the warm-up run beside its reruns
    assert "warm.fragment(" in (views / "explore.py").read_text()


def test_the_background_steps_hold_every_scenario_and_compares_first_view(monkeypatch):
    """The warm-up's steps cover Explore's views, Compare's first view, the lab's default run and every Lessons
    screen: run through the gate, they leave Compare's first view computed."""
    from ui import lessons_data

    monkeypatch.setattr(lessons_data, "warm_steps", lambda device: [])
    monkeypatch.setattr(warm, "QUIET_S", 0.0)
    steps = warm.background_steps()
    assert warm.compare_view in steps
    assert len(steps) >= len(seqis.samplers.scenarios.SCENARIOS) + 2
    warm.run_when_quiet([warm.compare_view])
    _no_computing(monkeypatch)
    at = open_view("views/compare.py")
    first = compare_first(explore_data.load_batch(warm.scenario(warm.FIRST_SCENARIO)).has_head)
    assert not at.error and len(charts(at)) == len(first) == 4  # a rollout map each; the first batch has a head
