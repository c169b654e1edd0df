"""The numbers behind the Lessons screen on score centering (ui/lesson_sc.py): the policy under a constant reward
update by update, plain REINFORCE against score centering, with the sampler the policy shifted by a logit bias b.
Everything is exact (seqis.lab.drift_path and sc_drift on one bit, where the sampler's head is the whole
vocabulary); this module only asks the library and names the outcome.
"""

from __future__ import annotations

import math

import streamlit as st

from seqis import lab
from seqis.lab.centering import CORRECTIONS

SC_B = (-1.0, -0.5, 0.0, 0.5, 1.0)  # the sampler's logit bias b: q = sigmoid(logit p + b)
SC_STEPS = (10, 30, 100)  # the updates shown
P0, LR, REWARD = 0.5, 1.0, 1.0  # the policy's start P(1), the step size, the constant reward
PLAIN, SC = "plain REINFORCE", "score centering"
PAIR = {PLAIN: "none", SC: "SC"}  # the screen's labels -> seqis.lab.centering.CORRECTIONS' names
STILL = 1e-9  # |p - P0| below this: the policy did not move (SC's path stays within 1e-15)
OUTCOMES = ("both stay at 0.5", "REINFORCE to the sampler, SC stays", "REINFORCE away from it, SC stays",
            "both toward the sampler")  # short: a projector's column shows about 35 characters of an option


def sampler_q(p: float, b: float) -> float:
    """The sampler's P(1): the policy's logit shifted by b."""
    return 1.0 / (1.0 + math.exp(-(math.log(p / (1 - p)) + b)))


@st.cache_data(max_entries=8, show_spinner=False)
def drift(b: float) -> dict:
    """At logit bias b: the exact path of P(1) under each correction (seqis.lab.drift_path, max(SC_STEPS) updates;
    a shorter run is its prefix), the sampler's q at the start, and each correction's expected gradient per update
    there (seqis.lab.sc_drift: plain REINFORCE's is r (q - p), SC's 0)."""
    corrections = {label: CORRECTIONS[name] for label, name in PAIR.items()}
    path = lab.drift_path(corrections, p0=P0, logit_bias=float(b), steps=max(SC_STEPS), lr=LR, reward=REWARD)
    q0 = sampler_q(P0, float(b))
    start = lab.sc_drift(corrections, p=P0, q=q0, reward=REWARD).set_index("correction")["drift"]
    return dict(path=path, q0=q0, start={label: float(start[label]) for label in PAIR})


def after(d: dict, steps: int) -> dict[str, float]:
    """P(1) under each correction after `steps` updates."""
    path = d["path"][d["path"]["step"] == int(steps)]
    return {label: float(path.loc[path["correction"] == label, "p"].iloc[0]) for label in PAIR}


def outcome(d: dict, steps: int) -> str:
    """What the exact paths did after `steps` updates, in the prediction's words (or in words of its own where no
    option fits)."""
    p = after(d, steps)

    def way(label: str) -> str:
        delta = p[label] - P0
        if abs(delta) < STILL:
            return "stays"
        return "toward" if (delta > 0) == (d["q0"] > P0) else "away"

    plain, sc = way(PLAIN), way(SC)
    known = {("stays", "stays"): OUTCOMES[0], ("toward", "stays"): OUTCOMES[1], ("away", "stays"): OUTCOMES[2],
             ("toward", "toward"): OUTCOMES[3]}
    return known.get((plain, sc), f"REINFORCE {plain}, SC {sc}")


def quiz_question() -> dict:
    """The quiz's question on this screen, its reason with the numbers at b = -1 after 100 updates."""
    d = drift(-1.0)
    p = after(d, 100)
    return dict(screen="Score centering",
                question="With a constant reward and a sampler biased toward 0s, why does plain REINFORCE lower "
                "P(1) update after update while score centering leaves it?",
                right="under the sampler the score a − p has mean q − p, not 0; SC subtracts that expected score",
                wrong=("the constant reward turns negative after the baseline", "SC clips the ratio p / q at 2"),
                why=f"at p = 0.5, b = −1 the drift r (q − p) is {d['start'][PLAIN]:+.3g} per update, P(1) = "
                f"{p[PLAIN]:.3g} after 100 updates; SC's drift is {abs(d['start'][SC]):.0e} and P(1) stays "
                f"{p[SC]:.3g}", turn=2)
