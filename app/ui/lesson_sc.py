"""The Lessons screen on score centering (issue 42 item 6, issue 44 item 4): with a constant reward, should the
policy move? Under a sampler that differs from the trainer plain REINFORCE drifts toward the sampler's side update
after update; score centering (SC) subtracts the sampler-expected score and stays. Exact on one bit, where the
sampler's head is the whole vocabulary (ui/lesson_sc_data.py asks seqis.lab). Drawn like every screen: its chart
into the slot it is given, then controls, prediction, answer and Back / Next (ui/lesson_frame.py).
"""

from __future__ import annotations

import plotly.graph_objects as go
import streamlit as st

from . import lesson_sc_data as data
from .lesson_frame import answer, control, height, nav, predict_row, revealed, show
from .style import titled

TITLE = "With a constant reward, should the policy move?"
BODY = (
    "Give every rollout the same reward r = 1: it says nothing about which token is better, so the policy should "
    "stay where it is. Here a policy over one bit starts at P(1) = 0.5, and its sampler is the policy with its "
    "logit shifted by b (an engine that rounds toward 0s, b < 0, or toward 1s). Plain REINFORCE steps along "
    "r · ∇log p(a) on the sampled bits; score centering subtracts the sampler-expected score first. The chart marks "
    "where the policy and its sampler start; Reveal draws P(1) update by update, exact. What do the two do?")
COLORS = {data.PLAIN: "#e4572e", data.SC: "#3b6fd8"}
SAMPLER = "#8c8c8c"


def chart(d: dict, *, b: float, steps: int, revealed: bool, height: int = 460) -> go.Figure:
    """The policy's and the sampler's start (step 0); revealed: P(1) after each update under plain REINFORCE and
    under SC (seqis.lab.drift_path, exact), and the sampler's q along REINFORCE's path, dotted."""
    fig = go.Figure()
    path = d["path"][d["path"]["step"] <= steps]
    if revealed:
        for label, color in COLORS.items():
            run = path[path["correction"] == label]
            fig.add_trace(go.Scatter(x=run["step"], y=run["p"], mode="lines", name=f"{label}: P(1), exact",
                                     line=dict(color=color, width=3),
                                     hovertemplate=f"{label}<br>update %{{x}}: P(1) = %{{y:.4g}}<extra></extra>"))
        plain = path[path["correction"] == data.PLAIN]
        fig.add_trace(go.Scatter(x=plain["step"], y=[data.sampler_q(p, b) for p in plain["p"]], mode="lines",
                                 name="the sampler's q along REINFORCE's run", line=dict(color=SAMPLER, dash="dot"),
                                 hovertemplate="update %{x}: q = %{y:.4g}<extra></extra>"))
    fig.add_trace(go.Scatter(x=[0], y=[data.P0], mode="markers", name=f"the policy's start: P(1) = {data.P0:g}",
                             marker=dict(color="#111111", size=12, symbol="circle")))
    fig.add_trace(go.Scatter(x=[0], y=[d["q0"]], mode="markers", name=f"the sampler's start: q = {d['q0']:.3g}",
                             marker=dict(color=SAMPLER, size=12, symbol="diamond")))
    fig.add_hline(y=data.P0, line=dict(color="#555", dash="dot", width=1))
    fig.update_xaxes(title="updates", range=[-0.5, steps + 0.5])
    fig.update_yaxes(title="P(1)", range=[0, 1])
    return titled(fig, f"A constant reward, sampler logit bias b = {b:g}", height=height)


def draw(n: int, slot) -> None:
    c1, c2 = st.columns(2)
    b = control(n, c1.select_slider, "the sampler's logit bias b", "b", -1.0, data.SC_B)
    steps = control(n, c2.select_slider, "updates shown", "N", 100, data.SC_STEPS)
    d = data.drift(float(b))
    show(slot, n, chart(d, b=float(b), steps=int(steps), revealed=revealed(n), height=height()))
    guess = predict_row(n, st.segmented_control, "Your prediction: under the constant reward…",
                        options=list(data.OUTCOMES))
    truth = data.outcome(d, int(steps))
    p = data.after(d, int(steps))
    answer(n, guess=guess, said=f"“{guess}”", at=f"b = {b:g}, {steps} updates", right=guess == truth,
           truth=f"“{truth}”", text=answer_text(d, b=float(b), steps=int(steps), p=p, truth=truth),
           why=why(d, b=float(b), steps=int(steps), p=p))
    nav(n, None, "")


def answer_text(d: dict, *, b: float, steps: int, p: dict, truth: str) -> str:
    start = d["start"]
    return (f"**{truth[0].upper() + truth[1:]}.** After {steps} updates plain REINFORCE's P(1) is "
            f"**{p[data.PLAIN]:.3g}**, score centering's **{p[data.SC]:.3g}** (from {data.P0:g}; exact, "
            f"`seqis.lab.drift_path`, r = {data.REWARD:g}, step size {data.LR:g}). At the start the sampler's q is "
            f"{d['q0']:.3g}: plain REINFORCE's expected gradient per update is r (q − p) = "
            f"**{start[data.PLAIN]:+.3g}**, SC's {abs(start[data.SC]):.0e}, zero to rounding (`seqis.lab.sc_drift`).")


def why(d: dict, *, b: float, steps: int, p: dict) -> str:
    """Why, at the setting shown: no drift where the sampler is the trainer; elsewhere the drift's sign, where the
    walk heads and what SC subtracts."""
    if abs(d["q0"] - data.P0) < data.STILL:
        return ("With b = 0 the sampler is the trainer (q = p): the sampled bit's score a − p has mean 0 under the "
                "policy itself, so a constant reward moves nothing, with or without SC. Shift the sampler (b ≠ 0) "
                "to see the drift.")
    side, end = ("below", "0") if d["q0"] < data.P0 else ("above", "1")
    return (f"A constant reward says nothing, but plain REINFORCE weighs the score a − p by bits the sampler drew, "
            f"whose mean is q − p = {d['q0'] - data.P0:+.3g}, not 0: each update pushes the logit to the sampler's "
            f"side. The sampler is always the policy shifted by b, so it stays {side} it and the walk never "
            "stops "
            f"(logit += lr r (σ(logit + b) − σ(logit))), slowing as P(1) nears {end}: {p[data.PLAIN]:.3g} after "
            f"{steps} updates. Score centering subtracts the sampler-expected score Σ_v q_v f(ρ_v) (v − p) over the "
            "head, here the whole two-token vocabulary, so its expectation is exactly 0 whatever the sampler: P(1) "
            f"stays at {p[data.SC]:.3g}. On a real vocabulary the head is the top-k and the tail is modelled, so "
            "the cancellation there is approximate.")
