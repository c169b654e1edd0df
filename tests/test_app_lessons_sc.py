"""The Lessons screen on score centering ("With a constant reward, should the policy move?", issue 44 item 4):
its numbers against seqis.lab at every control value and against the drift's closed form r (q - p) and the
recursion logit += lr r (sigmoid(logit + b) - sigmoid(logit)) computed here in float64; the verdict kept at the
setting it was made at while both controls move; the answer withheld before Reveal; ?step=N&reveal=1 opens it
revealed.
"""

import json
import math

import pytest

pytest.importorskip("streamlit")
from pages import charts  # noqa: E402
from test_app_lessons import _values, answer, lesson, locked, move, predict, reveal  # noqa: E402
from ui import lesson_sc_data as sc  # noqa: E402

from seqis import lab  # noqa: E402
from seqis.lab.centering import CORRECTIONS  # noqa: E402

STEP = 10  # the screen's place on the page


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def _plain_path(b: float, steps: int) -> float:
    """Plain REINFORCE's P(1) after `steps` updates under a constant reward, from the recursion (float64)."""
    logit = math.log(sc.P0 / (1 - sc.P0))
    for _ in range(steps):
        logit += sc.LR * sc.REWARD * (_sigmoid(logit + b) - _sigmoid(logit))
    return _sigmoid(logit)


def _library(b: float, steps: int) -> dict:
    """The same numbers asked of seqis.lab here, not through the page's module."""
    named = {"none": CORRECTIONS["none"], "SC": CORRECTIONS["SC"]}
    path = lab.drift_path(named, p0=sc.P0, logit_bias=b, steps=steps, lr=sc.LR, reward=sc.REWARD)
    end = path[path["step"] == steps].set_index("correction")["p"]
    q0 = _sigmoid(math.log(sc.P0 / (1 - sc.P0)) + b)
    start = lab.sc_drift(named, p=sc.P0, q=q0, reward=sc.REWARD).set_index("correction")["drift"]
    return dict(plain=float(end["none"]), sc=float(end["SC"]), q0=q0, drift=float(start["none"]),
                sc_drift=float(start["SC"]))


def test_the_screen_states_the_librarys_numbers_at_every_setting():
    at = lesson(STEP, reveal="1")
    assert at.title[0].value == "With a constant reward, should the policy move?"
    for b in sc.SC_B:
        for steps in sc.SC_STEPS:
            move(at, f"ls.{STEP}.b", b)
            move(at, f"ls.{STEP}.N", steps)
            text, lib = answer(at), _library(b, steps)
            assert lib["drift"] == pytest.approx(lib["q0"] - sc.P0, abs=1e-12)  # r (q - p), r = 1
            assert lib["plain"] == pytest.approx(_plain_path(b, steps), abs=1e-12)
            assert abs(lib["sc"] - sc.P0) < 1e-12 and abs(lib["sc_drift"]) < 1e-13
            assert f"plain REINFORCE's P(1) is **{lib['plain']:.3g}**" in text, (b, steps)
            assert f"score centering's **{lib['sc']:.3g}**" in text and f"sampler's q is {lib['q0']:.3g}" in text
            assert f"r (q − p) = **{lib['drift']:+.3g}**" in text and f"SC's {abs(lib['sc_drift']):.0e}" in text
            if b == 0:  # the sampler is the trainer: nothing moves, and the why says so
                assert "**Both stay at 0.5.**" in text and "b = 0 the sampler is the trainer" in text
                assert lib["plain"] == pytest.approx(sc.P0, abs=1e-15)
            else:  # the drift toward the sampler's side, and where the walk heads
                assert "**REINFORCE to the sampler, SC stays.**" in text
                assert (lib["plain"] < sc.P0) == (b < 0)
                assert f"q − p = {lib['q0'] - sc.P0:+.3g}" in text
                assert f"nears {'0' if b < 0 else '1'}: {lib['plain']:.3g} after {steps} updates" in text
            # the chart draws the same exact paths
            (fig,) = charts(at)
            lines = {t["name"]: _values(t["y"]) for t in fig["data"] if t.get("mode") == "lines"}
            assert lines["plain REINFORCE: P(1), exact"][-1] == pytest.approx(lib["plain"], abs=1e-12)
            assert len(lines["score centering: P(1), exact"]) == steps + 1


def test_the_verdict_stays_at_the_setting_it_was_made_at_while_each_control_moves():
    at = predict(lesson(STEP), STEP, "both stay at 0.5", "segmented_control")
    text = answer(reveal(at))
    assert "You said “both stay at 0.5” at b = -1, 100 updates. Not what you predicted." in text
    for key, value in ((f"ls.{STEP}.b", 0.0), (f"ls.{STEP}.N", 10), (f"ls.{STEP}.b", 0.5)):
        move(at, key, value)  # at b = 0 "both stay" would be right: the verdict is not redone
        text = answer(at)
        assert "You said “both stay at 0.5” at b = -1, 100 updates (the answer there: “REINFORCE to the sampler, " \
               "SC stays”" in text
        assert "Not what you predicted." in text and locked(at, STEP, "segmented_control")
    b, steps = 0.5, 10
    assert f"the numbers above are at b = {b:g}, {steps} updates" in text
    assert f"**{_library(b, steps)['plain']:.3g}**" in text
    # right at b = 0, made there
    at = lesson(STEP, **{f"ls.{STEP}.b": "0.0"})
    at = predict(at, STEP, "both stay at 0.5", "segmented_control")
    assert "You said “both stay at 0.5” at b = 0, 100 updates. Your prediction was right." in answer(reveal(at))
    move(at, f"ls.{STEP}.b", -1.0)
    assert "Your prediction was right." in answer(at) and "(the answer there: “both stay at 0.5”" in answer(at)


def test_the_answer_is_withheld_before_reveal_and_a_link_opens_it_revealed():
    at = lesson(STEP)
    assert not [b for kind in (at.success, at.warning, at.info) for b in kind if "**Answer" in b.value]
    (fig,) = charts(at)
    assert not [t for t in fig["data"] if t.get("mode") == "lines"]  # only the two starting points
    assert "exact" not in json.dumps(fig["data"], ensure_ascii=False)
    at = lesson(STEP, reveal="1")
    assert "**Answer.**" in answer(at) and at.query_params["reveal"] == "1"
    (fig,) = charts(at)
    assert {t["name"] for t in fig["data"] if t.get("mode") == "lines"} >= {
        "plain REINFORCE: P(1), exact", "score centering: P(1), exact"}
