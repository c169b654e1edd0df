"""The Lessons page's last screen: a quiz of "why" questions, one per screen before it. Each question is answered
once: Grade (the screen's Reveal) grades them all at the end and locks them, then a summary says which were right,
the reason with its number (computed by ui/lessons_data.quiz from the library), and links back to the screen that
teaches each one. The chart keeps score: each screen's prediction and its quiz answer.
"""

from __future__ import annotations

import streamlit as st

from . import lesson_charts as charts
from . import lessons_data as data
from .lesson_frame import DEV, SCREENS, VERDICTS, go, reveal, revealed, show
from .state import present

TITLE = "Quiz: can you say why, without the charts?"
BODY = ("One question per screen, each asking why rather than how much. Answer them all; each is answered once: "
        "Grade marks every answer at the end and locks it. Then each question shows the right answer, the reason "
        "with the number behind it (computed by the library, as the screens computed theirs), and a link back to "
        "the screen that teaches it. The chart keeps score: the prediction you made on each screen and your answer "
        "here. A wrong answer is a screen worth a second look.")
GRADED = "ls.quiz.graded"  # session state: the answers as Grade found them (question index -> option or None)


def step_of(name: str) -> int:
    """The step (from 1) of the screen with this name."""
    return SCREENS.index(name) + 1


def draw(n: int, slot) -> None:
    questions = data.quiz(DEV)
    graded = st.session_state.get(GRADED, {}) if revealed(n) else None  # a link's &reveal=1: every answer shown
    top = st.container()
    picks = {}
    for i, q in enumerate(questions):
        name = f"ls.quiz.{i + 1}"
        if graded is not None:
            st.session_state[name] = graded.get(i)
        picks[i] = st.radio(f"**{i + 1}.** {q['question']}", q["options"], index=None, key=name,
                            disabled=graded is not None)
        if graded is not None:
            result(i, q, picks[i])
    answered = sum(p is not None for p in picks.values())
    with top:
        score(n, questions, picks, graded, answered)
    verdicts = st.session_state.get(VERDICTS, {})
    rows = [dict(fact=str(step_of(q["screen"])), prediction=verdicts.get(step_of(q["screen"]) - 1),
                 check=None if graded is None or picks[i] is None else picks[i] == q["answer"])
            for i, q in enumerate(questions)]
    show(slot, n, charts.scoreboard(rows, height=240 if present() else 260))


def grade(n: int, picks: dict) -> None:
    st.session_state[GRADED] = dict(picks)
    reveal(n)


def score(n: int, questions: list[dict], picks: dict, graded: dict | None, answered: int) -> None:
    """Grade (with how many are answered) and Back, or once graded the score and the screens to see again."""
    left, right = st.columns([2, 1], vertical_alignment="center")
    if graded is None:
        left.caption(f"{answered} of {len(questions)} answered. Grade marks them all, once.")
        right.button("Grade", key=f"ls.reveal.{n + 1}", type="primary", width="stretch", on_click=grade,
                     args=(n, picks), help="Key: R")
    else:
        right_ = [i for i, q in enumerate(questions) if graded.get(i) == q["answer"]]
        again = [q["screen"] for i, q in enumerate(questions) if i not in right_]
        left.info(f"**Answers.** {len(right_)} of {len(questions)} right."
                  + (f" Worth a second look: {', '.join(f'screen {step_of(s)} ({s})' for s in again)}." if again
                     else " Every one."), icon=":material/lightbulb:")
    right.button("Back", key=f"ls.back.{n + 1}", on_click=go, args=(n,), width="stretch",
                 icon=":material/arrow_back:", help="Key: ← or PageUp")


def result(i: int, q: dict, pick) -> None:
    """One graded question: right or not, the answer and why, and the screen that teaches it."""
    ok = pick == q["answer"]
    mark = "✓ right" if ok else ("✗ not quite" if pick is not None else "not answered")
    st.markdown(f"**{mark}.** {q['answer'][0].upper() + q['answer'][1:]}: {q['why']}.")
    step = step_of(q["screen"])
    st.button(f"See screen {step}: {q['screen']}", key=f"ls.see.{i + 1}", on_click=go, args=(step,),
              type="secondary" if ok else "primary", icon=":material/replay:")
