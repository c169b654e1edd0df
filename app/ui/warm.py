"""Warm the explorer's caches before anyone asks, so that what a person clicks finds its work done.

`before_serving()` computes Explore's first screen (its batch, the four estimators, every figure and table), every
synthetic scenario's and example batch's first view and the views Learn's presets open: the launcher
(app/__main__.py) calls it before the server listens, so a switch to any of them is a cache hit. Then
`start_background()` computes Bias & variance's first run and every Lessons screen (and, under a bare `streamlit
run app`, the Explore views too) once per process in a low-priority thread, one step at a time while no page runs.
SEQIS_WARM=0 in the environment turns the background part off (the tests set it: they open pages, not speed).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from seqis.samplers.scenarios import SCENARIOS

from . import explore_data as data
from . import head_data, lab_data, lessons_data
from .device import device
from .presets import FIRST_BATCH, FIRST_ESTIMATORS, FIRST_SCENARIO, PREFIX, PRESETS, compare_first, key_estimators
from .st_private import quiet_threads

_started = threading.Lock()  # held for good once the background warm-up has started
THREAD = "seqis-warm-up"  # the warm-up's threads' names start with this


quiet_threads(THREAD)  # the warm-up has no page on purpose: no "missing ScriptRunContext" per cached call


def estimators(names: list[str], knobs: dict[str, dict[str, Any]] | None = None) -> data.Estimators:
    """(name, config) pairs as Explore's knob widgets make them: each entry's start values, then `knobs`."""
    out = []
    for name in names:
        start = data.start(name).config
        out.append((name, type(start)(**{**start.as_dict(), **(knobs or {}).get(name, {})})))
    return tuple(out)


def scenario(name: str, knobs: dict[str, Any] | None = None, seed: int = 0) -> data.Source:
    """A synthetic scenario's Source as Explore's batch knobs make it (the first scenario starts at FIRST_BATCH)."""
    start = FIRST_BATCH if name == FIRST_SCENARIO else {}
    return data.Source("synthetic", name, SCENARIOS[name](**{**start, **(knobs or {})}), seed)


def view(src: data.Source, ests: data.Estimators, payload: bytes | None = None, head: bool = True) -> None:
    """Every cached piece Explore draws for this batch and these estimators at their first view (the longest
    rollout picked, the first estimator's drops shaded, rollouts coloured by status); head: and its head section
    (score centering on the whole batch in float64: seconds the server does not wait for, but for the first view)."""
    data.explore(src, ests, payload).first_screen()
    if head:
        head_data.warm(data.load_batch(src, payload))


def first_view(head: bool = False) -> None:
    """Explore's first screen (head: and its head section, which comes after every chart on the page)."""
    view(scenario(FIRST_SCENARIO), estimators(FIRST_ESTIMATORS), head=head)


def before_serving() -> None:
    """What the launcher computes before the server listens (in a warm-up thread, waited for): Explore's first
    screen, then every scenario's and Learn preset's Explore view a click opens at first (a few seconds). Done in
    the background instead, this work holds the interpreter's lock while the first pages draw and slowed them (a new
    session's load 3.6 s -> 4.7 s in an interleaved A/B)."""
    t = threading.Thread(target=lambda: (first_view(), explore_views()), name=f"{THREAD}-first")
    t.start()
    t.join()


def explore_inputs(view: dict[str, Any]) -> tuple[data.Source, data.Estimators]:
    """The batch and the estimators Explore shows for a view of its widget keys (a Learn preset's), as its
    widgets build them."""
    names = view.get(key_estimators(), FIRST_ESTIMATORS)
    sc = view.get(f"{PREFIX}scenario", FIRST_SCENARIO)
    knobs: dict[str, dict[str, Any]] = {}
    for key, value in view.items():
        est, _, knob = key[len(PREFIX):].rpartition(".")
        if est in names:
            knobs.setdefault(est, {})[knob] = value
    batch = {key.rsplit(".", 1)[1]: value for key, value in view.items() if key.startswith(f"{PREFIX}sc.{sc}.")}
    return scenario(sc, batch, view.get(f"{PREFIX}seed", 0)), estimators(names, knobs)


def explore_view_steps(examples: bool = True) -> list[Callable[[], None]]:
    """Each scenario's first view, the views Learn's presets open and (examples=True, the background's) each
    example file's and every head section, one call each. An example's first view shows the advice (as any file's
    does), whose comparison over the registry takes seconds: the server does not wait for those before it
    listens, nor for the head sections past the first view's."""
    first = estimators(FIRST_ESTIMATORS)
    steps = [partial(view, scenario(name), first, head=examples) for name in SCENARIOS]
    for presets in PRESETS.values():
        steps += [partial(view, *explore_inputs(preset.view), head=examples) for preset in presets]
    if examples:
        steps += [partial(_asset_view, name, path, first) for name, path in sorted(data.assets().items())]
    return steps


def _asset_view(name: str, path, ests: data.Estimators) -> None:
    raw = path.read_bytes()
    try:
        view(data.source_of_file(raw, name, kind="asset"), ests, raw)
    except (ValueError, OSError, ImportError):  # a broken asset shows its error when picked
        pass


def explore_views() -> None:
    """Each scenario's first view and the views Learn's presets open (the examples' come in the background)."""
    for step in explore_view_steps(examples=False):
        step()


def compare_view() -> None:
    """Compare's first view: three frameworks' presets on Explore's first batch, their maps, configs and tables."""
    src = scenario(FIRST_SCENARIO)
    v = data.explore(src, estimators(compare_first(data.load_batch(src).has_head)))
    for c in v.corrections:
        v.rollout_map(c.name)
        v.export(c.name, v.frameworks(c.name)[0])
    v.disagreement()
    v.tables()
    head_data.warm(data.load_batch(v.src), page="compare")


def background_steps() -> list[Callable[[], object]]:
    """Explore's first view's head section, its other views (cache hits after `before_serving`, but for their head
    sections and the examples), Compare's first view, Bias & variance's first run, and every Lessons screen at every
    setting it offers (the lag lesson's training runs included): one cached call each."""
    return [partial(first_view, head=True), *explore_view_steps(), compare_view,
            partial(lab_data.default_run, str(device())),
            *lessons_data.warm_steps(str(device()))]


# A page run and the warm-up share one interpreter lock: warm-up work during a page's run slowed the page (a new
# session's load 3.6 s -> 4.7 s in an interleaved A/B), and the Lessons' 10-40 s of it overlapped every first
# load after a start. So the warm-up starts a step only when no page has run for QUIET_S. A page's run ends before
# the browser has drawn it (1-3 s of plotly on a first load), and warm-up work then still takes a core and the
# lock from the next page: with 3 s, five first loads in a row took 4.1 s each against 2.8 s with no warm-up.
# 10 s is longer than a person's pauses while working the knobs, shorter than reading a page. A step already
# running when a click comes still overlaps it (the lag lesson's training runs take seconds each: they come last).
QUIET_S = 10.0
_pages = 0  # page runs in progress
# time.monotonic() when the latest page run ended; at the start, as if one just had: the first visitor, who
# usually comes within seconds of `make run`, comes before the warm-up
_last_page = time.monotonic()
_pages_lock = threading.Lock()


@contextlib.contextmanager
def page_running():
    """Around a page's run (app/streamlit_app.py): the background warm-up waits while any page runs."""
    global _pages, _last_page
    with _pages_lock:
        _pages += 1
    try:
        yield
    finally:
        with _pages_lock:
            _pages -= 1
            _last_page = time.monotonic()


def fragment(fn: Callable, **kwargs) -> Callable:
    """st.fragment(fn, **kwargs) whose reruns count as page runs here: a fragment's rerun (an Explore knob move, a
    followed run's refresh) runs fn alone, not the page frame, and the warm-up took a page whose knobs were being
    moved for a quiet one (its steps ran beside the moves: a slider move ~20 ms slower in the browser bench)."""
    import streamlit as st

    @functools.wraps(fn)
    def counted(*args, **kw):
        with page_running():
            return fn(*args, **kw)

    return st.fragment(counted, **kwargs)


def wait_for_quiet(quiet_s: float | None = None, poll_s: float = 0.05) -> None:
    """Return once no page runs and none has for quiet_s (QUIET_S)."""
    quiet_s = QUIET_S if quiet_s is None else quiet_s
    while True:
        with _pages_lock:
            idle = _pages == 0 and time.monotonic() - _last_page >= quiet_s
        if idle:
            return
        time.sleep(poll_s)


def run_when_quiet(steps: list[Callable[[], object]]) -> None:
    """Each step in turn, each started only while no page runs."""
    for step in steps:
        wait_for_quiet()
        step()


def _low_priority(work) -> None:
    try:  # this thread only (Linux: a thread is a task with its own nice value); the threads it starts inherit it
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except (AttributeError, OSError):
        pass
    work()


def start_background() -> bool:
    """Run `background_steps` in a low-priority daemon thread, each when no page runs, once per process (unless
    SEQIS_WARM=0); True if this call started it."""
    if os.environ.get("SEQIS_WARM", "1") == "0" or not _started.acquire(blocking=False):
        return False
    work = lambda: run_when_quiet(background_steps())
    threading.Thread(target=_low_priority, args=(work,), name=THREAD, daemon=True).start()
    return True


@contextlib.asynccontextmanager
async def lifespan(app):
    """The server's start (app/streamlit_app.py's st.App, which `streamlit run app` serves): Explore's first screen
    and the views a first click opens, computed before the server listens (in a thread: the event loop stays free),
    then the rest in the background."""
    await asyncio.to_thread(before_serving)
    start_background()
    from .runtime import chart  # noqa: F401  (plotly.js into app/static before the first page asks for it)

    yield
