"""The Lessons page's frame: what every screen shares (its place in the URL, the prediction and its record, the
answer box, Back / Next, presenter mode's layout and keys). The screens themselves live in views/lessons.py,
ui/lesson_intro.py and ui/lesson_quiz.py; each draws its chart and controls and calls predict_row, answer, nav.

One numbering everywhere: `?step=N` counts from 1, as "Lesson N of M", the list of screens and every button do.
A prediction is stored at Reveal with the setting it was made at, graded there once, and locked.
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import streamlit as st

from .device import device
from .presets import Preset, open_preset
from .runtime.chart import chart
from .runtime.memo import ProgressSlot
from .state import bound, present

DEV = str(device())
STEP = "step"  # the query parameter: the screen shown, counted from 1 (as "Lesson N of M" counts)
REVEAL = "reveal"  # the query parameter: "1" while the screen shown is revealed (a link opens it revealed)
SCREENS: list[str] = []  # the screens' short names in order; views/lessons.py fills it on every run
REVEALED = "ls.revealed"  # session state: the screens whose answer is shown (indices into SCREENS)
VERDICTS = "ls.verdicts"  # session state: screen -> whether its prediction was right
PREDICTIONS = "ls.predictions"  # session state: screen -> its Prediction, stored at Reveal
NAV_SLOT = "ls._nav_slot"  # session state: where nav draws in presenter mode (above the answer, in the fold)
CAST_STEP = 2  # the estimators' cast, linked from every screen that names an estimator
PRESENT_CHART_SCALE = 1.85  # presenter mode's chart fonts on Lessons: 12 px ticks become 22 px, annotations >= 20
_keys = st.components.v2.component("seqis_lesson_keys", js=(Path(__file__).parent / "lesson_keys.js").read_text())


@dataclass(frozen=True)
class Prediction:
    """A prediction as Reveal found it: what was said, at which setting, and its grade there, never redone."""

    guess: object  # the prediction control's value (None: no prediction)
    said: str  # the guess in words ("60%")
    at: str  # the screen's setting in words ("s = 0.05")
    right: bool | None  # graded against the answer at that setting (None: no prediction)
    truth: str  # the answer at that setting in words ("94.5%"; "a tie: ...")


def key(n: int, knob: str) -> str:
    """Screen n's control `knob` as the URL names it: `ls.<step>.<knob>`, the step counted from 1."""
    return f"ls.{n + 1}.{knob}"


def control(n: int, widget, label: str, knob: str, default, options, **kwargs):
    """Screen n's control `knob`: `widget` over `options`, bound to the URL as `ls.<step>.<knob>` (a value the
    screen does not offer is ignored); None from a cleared segmented control gives the default."""
    options = tuple(options)
    value = bound(widget, label, key(n, knob), default, options=list(options), valid=lambda v: v in options, **kwargs)
    return default if value is None else value


def current_step() -> int:
    """The screen shown, as an index into SCREENS, from the URL's `?step=N` (N from 1), else this session's, else
    the first; kept in the URL. ?step=0 opens screen 1; `&reveal=1` opens the screen revealed."""
    raw = st.query_params.get(STEP)
    try:
        step = int(raw) if raw is not None else int(st.session_state.get("ls.step", 1))
    except ValueError:
        step = 1
    step = min(max(step, 1), len(SCREENS))
    st.session_state["ls.step"] = step
    st.query_params[STEP] = str(step)
    if st.query_params.get(REVEAL) == "1":
        reveal(step - 1)
    return step - 1


def go(step: int) -> None:
    """Open the screen `step` (from 1), unrevealed unless this session revealed it."""
    st.session_state["ls.step"] = step
    st.query_params[STEP] = str(step)
    if REVEAL in st.query_params:
        del st.query_params[REVEAL]


def revealed(n: int) -> bool:
    return n in st.session_state.get(REVEALED, set())


def reveal(n: int) -> None:
    st.session_state.setdefault(REVEALED, set()).add(n)


def predictions() -> dict[int, Prediction]:
    return st.session_state.setdefault(PREDICTIONS, {})


def head(n: int, title: str, body: str, *, names_estimators: bool = False) -> None:
    """"Lesson N of M", the list of screens (a click opens one), the question and its words. In presenter mode the
    words fold into an expander (the lecturer says them), so the chart, the controls and Back / Next fit 720 px;
    the keys (arrows, PageDown / PageUp, R) and the scroll to the top on a new screen come with every mode."""
    _keys(data=f"{n + 1}", key="ls.keys", height=0)
    row = st.container(horizontal=True, vertical_alignment="center", horizontal_alignment="distribute")
    row.caption(f"Lesson {n + 1} of {len(SCREENS)} · {SCREENS[n]}")
    with row.popover("Screens", icon=":material/list:", width="content"):
        for i, name in enumerate(SCREENS, 1):
            st.button(f"{i}. {name}", key=f"ls.goto.{i}", on_click=go, args=(i,), type="tertiary",
                      disabled=i == n + 1)
    st.title(title)
    with st.expander("The setup", expanded=False) if present() else nullcontext():
        st.markdown(body)
    if names_estimators and n + 1 != CAST_STEP:
        st.button(f"Who is who: the estimators' cast (screen {CAST_STEP})", key=f"ls.cast.{n + 1}", type="tertiary",
                  icon=":material/group:", on_click=go, args=(CAST_STEP,))


def stage():
    """Where the chart goes and where everything under it goes: below it on a page, beside it in presenter mode
    (a projector's 720 px hold the question, the chart and its controls at once)."""
    if present():
        left, right = st.columns([3, 2], gap="medium")
        return left.empty(), right.container()
    return st.empty(), st.container()


def height() -> int:
    """The lesson charts' height: lower in presenter mode, where ui/runtime/chart.py grows it with the text."""
    return 300 if present() else 460


def computed(what: str, fn, *args):
    """fn(*args, device, progress=...) under a progress bar: a cache hit, once the start-up warm-up has run."""
    with ProgressSlot(what) as progress:
        return fn(*args, DEV, progress=progress)


def show(slot, n: int, figure) -> None:
    with slot:
        chart(figure, key=f"ls.chart.{n + 1}", scale=PRESENT_CHART_SCALE if present() else None)


def predict_row(n: int, widget, label: str, **kwargs):
    """The prediction control and the Reveal button, side by side; returns the prediction (None until made). After
    Reveal the control is locked and shows the prediction stored then, wherever the screen's controls are now.
    In presenter mode Back / Next go right under it, above the answer."""
    left, right = st.columns([3, 1], vertical_alignment="bottom") if not present() else (st.container(),) * 2
    name = f"ls.pred.{n + 1}"
    made = predictions().get(n)
    if made is not None:
        st.session_state[name] = made.guess
    with left:
        guess = widget(label, key=name, disabled=revealed(n), **kwargs)
    right.button("Reveal", key=f"ls.reveal.{n + 1}", type="primary", width="stretch", on_click=reveal, args=(n,),
                 disabled=revealed(n), help="Key: R")
    st.session_state[NAV_SLOT] = st.container() if present() else None
    return guess


def answer(n: int, *, guess, said: str, at: str, right: bool, truth: str, text: str, why: str) -> None:
    """The revealed answer: its numbers (closed form beside simulation) at the setting shown, `at`, the verdict on
    the prediction, and why. The first run after Reveal stores the prediction with its setting and its grade there
    (`guess` in words: `said`; `right`: graded against `truth`, the answer at `at`); later runs quote that record,
    so moving a control afterwards changes the numbers, never the verdict."""
    if not revealed(n):
        return
    made = predictions().setdefault(n, Prediction(guess, said, at, None if guess is None else bool(right), truth))
    st.session_state.setdefault(VERDICTS, {})[n] = made.right
    box = st.success if made.right else st.warning if made.right is False else st.info
    box(f"**Answer.** {text} {verdict(made, at)}  \n**Why.** {why}", icon=":material/lightbulb:")


def verdict(made: Prediction, at: str) -> str:
    """"You said 60% at s = 0.05. Not what you predicted.", naming the answer there when the screen has moved on."""
    if made.right is None:
        return "You made no prediction."
    said = f"You said {made.said} at {made.at}"
    if made.at != at:
        said += f" (the answer there: {made.truth}; the numbers above are at {at})"
    return said + ". " + ("Your prediction was right." if made.right else "Not what you predicted.")


def nav(n: int, deeper: Preset | None, deeper_label: str) -> None:
    """Back / Next (keys: left / right arrow, PageUp / PageDown), and Go deeper to the full page with the same
    settings. In presenter mode they sit above the answer (predict_row keeps their place)."""
    slot = st.session_state.pop(NAV_SLOT, None)
    with slot if slot is not None else nullcontext():
        row = st.container(horizontal=True)
        back, nxt, deep = (row, row, row) if present() else st.columns([1, 1, 2])
        back.button("Back", key=f"ls.back.{n + 1}", on_click=go, args=(n,), disabled=n == 0, width="stretch",
                    icon=":material/arrow_back:", help="Key: ← or PageUp")
        nxt.button("Next", key=f"ls.next.{n + 1}", on_click=go, args=(n + 2,), disabled=n == len(SCREENS) - 1,
                   width="stretch", type="primary" if revealed(n) else "secondary", icon=":material/arrow_forward:",
                   help="Key: → or PageDown")
        if deeper is not None and not present() and deep.button(
                f"Go deeper: {deeper_label}", key=f"ls.deeper.{n + 1}", width="stretch", icon=":material/open_in_new:"):
            open_preset(deeper)


def from_lesson(n: int, page: str, view: dict, look: str) -> Preset:
    return Preset(f"From the lesson “{SCREENS[n]}”", "The same settings as the lesson's chart.", view, page, look)


def nearest(options, value: float) -> list:
    """The options closest to value in log space (clips and lengths are scales): more than one is a tie."""
    distance = {o: abs(math.log(float(o)) - math.log(value)) for o in options}
    best = min(distance.values())
    return [o for o in options if distance[o] - best <= 1e-9 * max(best, 1.0)]


def either(options, fmt_one=str) -> str:
    """Nearest options in words: "15", or "a tie: 5 or 15"."""
    words = [fmt_one(o) for o in options]
    return words[0] if len(words) == 1 else "a tie: " + " or ".join(words)


def and_(words) -> str:
    """["a", "b", "c"] -> "a, b and c"."""
    words = list(words)
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]
