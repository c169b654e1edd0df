"""Lessons: the five facts of LITERATURE.md, one idea per screen, the question before the answer.

Seven screens (`?step=N`, counted from 1 as the page counts; an old 0-based link's ?step=0 opens the first, and
`&reveal=1` opens a screen revealed, for slides): an opening one (one rollout's product weight and geometric ratio
as it grows), one per fact (a)-(e), and a self-check. Each screen asks a question in its title, shows one chart of a
simulation with at most two controls under it, takes a prediction, and on "Reveal" draws the closed form beside the
simulation with the answer's number and a sentence on why, each following the setting shown. A prediction is stored
with the setting it was made at, graded there once, at Reveal, and locked (the control disabled; moving a control
afterwards changes the chart and the numbers, never the verdict); a tie is named as a tie and any tied pick is
right. "Go deeper" opens the full page at the same settings. Every setting a screen offers is computed at start-up
(ui/lessons_data.py, warmed by ui/warm.py), so no screen waits.
`?present=1` (presenter mode) hides the sidebar and everything a screen does not name; charts' text grows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import streamlit as st
from ui import lesson_charts as charts
from ui import lessons_data as data
from ui.device import device
from ui.lab_data import INTERIOR_VIEW
from ui.presets import Preset, open_preset
from ui.runtime.chart import chart
from ui.runtime.memo import ProgressSlot
from ui.state import bound, present, switch_page
from ui.style import PRESENT_LESSON_CSS
from ui.widgets import fmt

DEV = str(device())
STEP = "step"  # the query parameter: the screen shown, counted from 1 (as "Lesson N of M" counts)
REVEAL = "reveal"  # the query parameter: "1" while the screen shown is revealed (a link opens it revealed)
LESSONS: list[tuple] = []  # (name, title, body, draw(n, chart slot)) per screen, in order: see `screen`
REVEALED = "ls.revealed"  # session state: the screens whose answer is shown (indices into LESSONS)
VERDICTS = "ls.verdicts"  # session state: screen -> whether its prediction was right
PREDICTIONS = "ls.predictions"  # session state: screen -> its Prediction, stored at Reveal


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


def current_step() -> int:
    """The screen shown, as an index into LESSONS, from the URL's `?step=N` (N from 1), else this session's, else
    the first; kept in the URL. ?step=0 (an old 0-based link to the first screen) opens screen 1; `&reveal=1` opens
    the screen revealed."""
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


def head(n: int, title: str, body: str) -> None:
    st.caption(f"Lesson {n + 1} of {len(SCREENS)} · {SCREENS[n]}")
    st.title(title)
    st.markdown(body)


def stage():
    """Where the chart goes and where everything under it goes: below it on a page, beside it in presenter mode
    (a projector's 720 px hold the question, the chart and its controls at once)."""
    if present():
        left, right = st.columns([3, 2], gap="medium")
        return left.empty(), right.container()
    return st.empty(), st.container()


def height() -> int:
    """The lesson charts' height: lower in presenter mode, where ui/runtime/chart.py grows it with the text."""
    return 340 if present() else 460


def computed(what: str, fn, *args):
    """fn(*args, device, progress=...) under a progress bar: a cache hit, once the start-up warm-up has run."""
    with ProgressSlot(what) as progress:
        return fn(*args, DEV, progress=progress)


def show(slot, n: int, figure) -> None:
    with slot:
        chart(figure, key=f"ls.chart.{n + 1}")


def predict_row(n: int, widget, label: str, **kwargs):
    """The prediction control and the Reveal button, side by side; returns the prediction (None until made). After
    Reveal the control is locked and shows the prediction stored then, wherever the screen's controls are now."""
    left, right = st.columns([3, 1], vertical_alignment="bottom") if not present() else (st.container(),) * 2
    name = f"ls.pred.{n + 1}"
    made = predictions().get(n)
    if made is not None:
        st.session_state[name] = made.guess
    with left:
        guess = widget(label, key=name, disabled=revealed(n), **kwargs)
    right.button("Reveal", key=f"ls.reveal.{n + 1}", type="primary", width="stretch", on_click=reveal, args=(n,),
                 disabled=revealed(n))
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
    """Back / Next, and Go deeper to the full page with the same settings."""
    back, nxt, deep = st.columns([1, 1, 2]) if not present() else (*st.columns(2), st.container())
    back.button("Back", key=f"ls.back.{n + 1}", on_click=go, args=(n,), disabled=n == 0, width="stretch",
                icon=":material/arrow_back:")
    nxt.button("Next", key=f"ls.next.{n + 1}", on_click=go, args=(n + 2,), disabled=n == len(SCREENS) - 1,
               width="stretch", type="primary" if revealed(n) else "secondary", icon=":material/arrow_forward:")
    if deeper is not None and deep.button(f"Go deeper: {deeper_label}", key=f"ls.deeper.{n + 1}", width="stretch",
                                          icon=":material/open_in_new:"):
        open_preset(deeper)


def _from_lesson(n: int, page: str, view: dict, look: str) -> Preset:
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


# ---------------------------------------------------------------------------------------------------------
# the screens


def screen(name: str, title: str, body: str):
    """Register a screen: its name, its question (the title), its 60-120 words, and the function that draws its
    chart into the slot it is given and everything under it (controls, prediction, answer, navigation)."""
    def register(draw):
        LESSONS.append((name, title, body, draw))
        return draw
    return register


@screen("Opening", "One rollout, T tokens: where does its weight w end up?",
        "Every token carries a log-ratio l_t = log π(y_t) − log μ(y_t) between the trainer π and the sampler μ. "
        "Here each l_t is drawn from N(−s²/2, s²): a valid importance-sampling model, with E_μ[π/μ] = 1 per token "
        "and a per-token KL of s²/2. The exact correction for the whole rollout is the product "
        "w = exp(Σ l_t); its geometric ratio exp(Σ l_t / T) is the average token's. The chart follows one rollout "
        "to 4,096 tokens, eleven more in grey. E[w] = 1 at every length. What share of 4,096-token rollouts end "
        "with w below 1?")
def opening(n: int, slot) -> None:
    c1, c2 = st.columns(2)
    s = bound(c1.select_slider, "noise s (per-token KL s²/2)", key(n, "s"), 0.05, options=list(data.OPEN_S),
              valid=lambda v: v in data.OPEN_S)
    r = bound(c2.select_slider, "which rollout", key(n, "rollout"), 0, options=list(data.OPEN_ROLLOUTS),
              valid=lambda v: v in data.OPEN_ROLLOUTS)
    d = data.opening(s, r, DEV)
    show(slot, n, charts.opening(d, revealed=revealed(n), height=height(), s=s))
    guess = predict_row(n, st.select_slider, "Your prediction: the share with w < 1 at T = 4,096",
                        options=[None, *range(0, 101, 5)], format_func=lambda v: "—" if v is None else f"{v}%")
    above = 1 - d["share"]  # the rollouts E[w] = 1 rests on
    few = "a rare few huge weights" if above < 0.1 else f"the {above:.0%} of rollouts with w > 1, a few of them huge"
    close = guess is not None and abs(guess / 100 - d["share"]) <= 0.1
    answer(n, guess=guess, said=f"{guess}%", at=f"s = {s:g}", right=close, truth=f"{d['share']:.1%}",
           text=f"**{d['share']:.1%}** of rollouts have w < 1 at T = 4,096: closed form Φ(s√T / 2) (the band "
           f"[0, 1] on w), simulated {d['share_sim']:.1%} ± {2 * d['share_se']:.1%} of {data.OPEN_SHARE_N:,}. "
           f"The median w is e^(−T s²/2) = {d['median']:.3g}.",
           why="log w is a sum of T terms with mean −s²/2: its median sinks like e^(−T s²/2) while its spread grows "
           f"like s√T, so E[w] = 1 survives only through {few}. The geometric ratio averages instead and settles at "
           "e^(−s²/2), whatever the length.")
    nav(n, _from_lesson(n, "lt", {"lt.s": s}, "the first chart: a band on w rejects long rollouts"),
        "Length & thresholds")


@screen("(a) bands", "A band on w, or on its geometric mean: which keeps long rollouts?",
        "Li & Liu keep a rollout when its ratio lies in [0.5, 2]. Put that band on the product w and it judges the "
        "noise of all T tokens at once; put it on the geometric ratio exp(S/T) and it judges the average token. "
        "The points are what the band on w keeps of simulated batches of 1,000 rollouts at each length; Reveal adds "
        "the geometric band's and both closed forms. Move the noise s: at s = 1.2 the per-token KL s²/2 is "
        "0.72 nats. At T = 4,096, how much does the geometric band keep?")
def bands(n: int, slot) -> None:
    s = bound(st.select_slider, "noise s (per-token KL s²/2)", key(n, "s"), 0.05, options=list(data.BAND_S),
              valid=lambda v: v in data.BAND_S)
    d = data.bands(s, DEV)
    show(slot, n, charts.bands(d, revealed=revealed(n), height=height(), s=s))
    options = ["most of them (over 80%)", "about half", "almost none (under 20%)"]
    guess = predict_row(n, st.segmented_control, "Your prediction: the geometric band keeps…", options=options)
    truth = options[0] if d["geo"] > 0.8 else options[2] if d["geo"] < 0.2 else options[1]
    answer(n, guess=guess, said=f"“{guess}”", at=f"s = {s:g}", right=guess == truth,
           truth=f"“{truth}” ({d['geo']:.1%})",
           text=f"At T = {d['T']:,} the geometric band keeps **{d['geo']:.1%}** (closed form; simulated "
           f"{d['geo_sim']:.1%}), the product band **{d['product']:.1%}** (simulated {d['product_sim']:.1%}).",
           why=f"exp(S/T) concentrates at e^(−s²/2) as T grows, so a geometric band is a per-token KL threshold: it "
           f"keeps long rollouts iff s²/2 < −log 0.5 = {d['cutoff_kl']:.2f} nats (s < {d['cutoff_s']:.2f}), sharper "
           f"the longer they are; s = {s:g} (KL {s * s / 2:.3g}) is {'below' if s < d['cutoff_s'] else 'past'} it. "
           "The product's log spreads like s√T and leaves any band.")
    nav(n, _from_lesson(n, "lt", {"lt.s": s}, "Acceptance vs length and the KL cutoff"), "Length & thresholds")


T_GUESSES = (2, 5, 15, 50, 150, 500)


@screen("(b) catastrophes", "One token 10 nats off: does a long rollout hide it?",
        "A numerical glitch can make one token catastrophically off: with l = −10, π gives it e^−10 of μ's "
        "probability. Every other token here is on-policy (l = 0). A geometric band sees the rollout's average, "
        "exp(−L/T); a token band (MIS-PO's [0.5, 2] on each token) sees the token itself. The markers are what each "
        "rule sees at each length (Reveal colours what the estimators decide). From which length on does the "
        "geometric band let the bad token's gradient through?")
def catastrophes(n: int, slot) -> None:
    c1, c2 = st.columns(2)
    L = bound(c1.select_slider, "the bad token's |l| = L", key(n, "L"), 10, options=list(data.CAT_L),
              valid=lambda v: v in data.CAT_L)
    low = bound(c2.select_slider, "geometric band's lower edge a (upper 2)", key(n, "a"), 0.5,
                options=list(data.CAT_LOW), valid=lambda v: v in data.CAT_LOW)
    d = data.catastrophic(float(L), low, DEV)
    show(slot, n, charts.catastrophic(d, revealed=revealed(n), height=height(), L=float(L), low=low))
    guess = predict_row(n, st.select_slider, "Your prediction: it passes from T =",
                        options=[None, *T_GUESSES], format_func=lambda v: "—" if v is None else f"{v}")
    near = nearest(T_GUESSES, d["t_star"])
    answer(n, guess=guess, said=f"T = {guess}", at=f"L = {L:g}, a = {low:g}", right=guess in near,
           truth=f"T* = {d['t_star']:.3g}, nearest {either(near)}",
           text=f"Closed form: from **T* = L / −log a = {d['t_star']:.3g}** tokens on. Simulated through "
           f"geo_mask: dropped at T = {d['dropped_at']}, kept at T = {d['kept_at']} (the lengths run). MIS-PO's token "
           f"band {'keeps' if d['token_kept'] else 'drops'} it at every length.",
           why="The geometric ratio is exp(−L/T): the catastrophe is averaged over T tokens and passes the band once "
           "L/T < −log a. Long rollouts dilute catastrophes; only a token-level rule (a token band, verl's veto) sees "
           "the token itself.")
    nav(n, _from_lesson(n, "lt", {"lt.L": int(L), "lt.geo.geo_mask_low": low}, "Catastrophic-token dilution"),
        "Length & thresholds")


REWARD_LABELS = {"threshold": "threshold: 1[sum ≥ 40]", "additive": "additive: the sum of the bits"}
BIAS_GUESSES = {"100% (unbiased)": 1.0, "about 85%": 0.85, "about 60%": 0.6, "about 30%": 0.3}


@screen("(c) token IS", "Token IS corrects every token. Is its gradient unbiased?",
        "Huang's chain: 64 independent bits, reward 1 if at least 40 are ones. The trainer π sets a bit to 1 with "
        "p = 0.6, the sampler μ with q = 0.55. Token IS multiplies each token's gradient by its own ratio "
        "ρ_t = π(a_t)/μ(a_t), as PPO does; sequence IS multiplies all of them by the product w. The bars are a "
        "mean gradient over 200 batches of 128 rollouts, as a share of the exact gradient; token IS's bar waits for "
        "Reveal. What share does token IS get?")
def token_is(n: int, slot) -> None:
    reward = bound(st.segmented_control, "reward", key(n, "reward"), "threshold", options=list(REWARD_LABELS),
                   format_func=REWARD_LABELS.get, valid=lambda v: v in REWARD_LABELS)
    reward = reward or "threshold"
    d = computed("Monte Carlo", data.token_bias, reward)
    rows = d["rows"].set_index("estimator")
    show(slot, n, charts.token_bias(d["rows"], revealed=revealed(n), height=height(), reward=reward))
    guess = predict_row(n, st.segmented_control, "Your prediction: token IS's mean gradient is",
                        options=list(BIAS_GUESSES))
    exact = rows.loc["token_tis", "exact"]
    gap = {k: abs(v - exact) for k, v in BIAS_GUESSES.items()}
    near = [k for k, v in gap.items() if v - min(gap.values()) <= 1e-9]  # more than one: a tie
    other = "additive" if reward == "threshold" else "threshold"
    if reward == "threshold":
        form = "closed form p(1 − p) P_μ(others = 39) over p(1 − p) P_π(others = 39)"
        why = ("ρ_t fixes token t's own probability, but the reward depends on the other 63 bits, and those still "
               "come from μ: token IS's mean uses P_μ(others = k − 1) where the truth has P_π. With an additive "
               "reward each token's reward is its own and the other tokens drop out: the bias needs a reward that "
               "couples tokens.")
    else:
        form = "closed form: each bit's reward term is its own bit, which ρ_t corrects exactly"
        why = ("With the sum of the bits each token's reward term is its own bit; the other 63 bits are independent "
               "of token t and its ρ_t-corrected score has mean zero under π, so they add nothing in expectation and "
               f"ρ_t's correction is the whole correction: {exact:.1%}. Token IS's bias needs a reward that couples "
               f"tokens, as 1[sum ≥ 40] does ({d['contrast']['threshold']:.1%}).")
    answer(n, guess=guess, said=f"“{guess}”", at=f"the {reward} reward", right=guess in near,
           truth=f"{exact:.1%} ({either(near, lambda k: f'“{k}”')})",
           text=f"Token IS gets **{exact:.1%}** of the true gradient ({form}); simulated "
           f"{rows.loc['token_tis', 'ratio']:.1%}. Sequence IS: {rows.loc['seq_is', 'ratio']:.1%} simulated, exactly "
           f"100%. With the other reward token IS gets {d['contrast'][other]:.1%}.", why=why)
    nav(n, _from_lesson(n, "bv", {"bv.bit_reward": reward}, "the caption under the three tiles"), "Bias & variance")


@screen("(d) the best clip", "Clip the sequence weight at C: where is the best C?",
        "Sequence TIS replaces w by min(w, C). A small C caps the variance but biases the gradient (the rewarded "
        "rollouts here have w > 1, and clipping shrinks them); a large C is unbiased but noisy. On a 16-bit chain "
        "(reward 1 if at least 11 ones, p = 0.55, q = 0.45) the points are bias² and variance over 200 batches at "
        "each clip. Li & Liu's rule of thumb is C* = √(2(1 + χ²)). Where is their sum, the MSE, lowest?")
def best_clip(n: int, slot) -> None:
    B = bound(st.select_slider, "rollouts per batch B", key(n, "B"), 128, options=list(data.CLIP_B),
              valid=lambda v: v in data.CLIP_B)
    d = computed("Sweeping the clip", data.clip_sweep, int(B))
    show(slot, n, charts.clip(d, revealed=revealed(n), height=height(), batch_size=int(B)))
    guess = predict_row(n, st.select_slider, "Your prediction: the best C", options=[None, *data.CLIP_GUESSES],
                        format_func=lambda v: "—" if v is None else fmt(v))
    th = d["theory"]
    near = nearest(data.CLIP_GUESSES, th["best"])
    off = th["star"] / th["best"]
    if 0.8 <= off <= 1.25:
        li = f"Li's C* balances their bounds and lands within {abs(off - 1):.0%} of the best here, a good first guess"
    else:
        li = (f"Li's C* balances their bounds but misses the best here by a factor {max(off, 1 / off):.1f} "
              f"({'above' if off > 1 else 'below'} it): it does not see the batch size")
    answer(n, guess=guess, said=f"C = {fmt(guess)}" if guess is not None else "", at=f"B = {B}", right=guess in near,
           truth=f"C = {th['best']:.3g}, nearest {either(near, fmt)}",
           text=f"The exact MSE is lowest at **C = {th['best']:.3g}** (simulated: {d['best_sim']:g}); Li's "
           f"C* = √(2(1 + χ²)) = **{th['star']:.3g}** with χ² = E_μ[w²] − 1 = {th['chi2']:.3g}, the whole "
           "rollout's chi-square, not one token's.",
           why="Clipping trades bias for variance: the valley sits where a little more bias² costs what a little less "
           f"variance saves. {li}; the exact best moves with the batch size, since variance falls like 1/B and "
           "bias² does not.")
    nav(n, _from_lesson(n, "bv", {**INTERIOR_VIEW, "bv.B": int(B)}, "the sweep at the bottom"), "Bias & variance")


@screen("(e) lag", "The sampler lags K updates: which correction is ahead after 300 updates?",
        "Asynchronous RL trains on rollouts from a policy several updates old. Here a policy over a 128-bit chain "
        "(reward 1 if at least 84 ones) starts near J = 0 and takes 300 SGD updates of 512 rollouts each, every "
        "batch drawn from the policy K updates stale, under four corrections: sequence IS, token IS, GeoMean IS and "
        "sequence TIS at C = 2. Curves are the exact success probability J over the first 100 updates; bands span two "
        "seeds. Which ends highest after all 300, at the lag you pick?")
def lag(n: int, slot) -> None:
    K = bound(st.select_slider, "lag K (updates stale)", key(n, "K"), 100, options=list(data.LAG_OPTIONS),
              valid=lambda v: v in data.LAG_OPTIONS)
    d = computed("Training", data.lag, int(K))
    show(slot, n, charts.lag(d, revealed=revealed(n), height=height(), lag=int(K)))
    guess = predict_row(n, st.segmented_control, "Your prediction: highest at the end",
                        options=list(data.LAG_ESTIMATORS))
    final, best = d["final"], d["best"]
    tie = len(best) > 1
    first = (f"**A {len(best)}-way tie**: {_and(best)} end level at lag {K}" if tie
             else f"**{best[0]}** ends highest at lag {K}")
    answer(n, guess=guess, said=f"“{guess}”", at=f"lag {K}", right=guess in best,
           truth=f"a {len(best)}-way tie ({_and(best)})" if tie else f"“{best[0]}”",
           text=f"{first}. Final J after {d['steps']} updates, sampled (infinite batch): "
           + ", ".join(f"{k} {v[0]:.2f} ({v[1]:.2f})" for k, v in final.items()) + ".", why=lag_why(int(K), d))
    nav(n, _from_lesson(n, "tr", {"tr.H": 128, "tr.f": 0.65, "tr.K": int(K), "tr.B": 512, "tr.lr": 10.0,
                                  "tr.seeds": 2}, "the learning curves and Huang's sweeps below them"), "Training")


def _and(words) -> str:
    words = list(words)
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def lag_why(K: int, d: dict) -> str:
    """Why, as the lag screen's runs show it at lag K: when each infinite-batch run reaches J = 1/2 against the
    same run with no lag (delayed or not, caught up or not by its last update), and whether a larger batch helps."""
    if len(d["best"]) == len(d["final"]):
        return ("With no lag the sampler is the trainer, so every ratio is 1: the four corrections compute the same "
                "gradient from the same rollouts and train alike. Any pick is right." if K == 0 else
                "The four end level: any pick is right.")
    half, end, last = data.LAG_HALF, d["end"], d["expected_steps"]
    seq, seq0 = d["reach"]["Sequence IS"]
    lines = [f"With infinite batches (dotted) sequence IS's expected gradient is the true one at any lag: it reaches "
             f"J = {half:g} at update {seq}" + (" as with no lag." if seq == seq0 else f" (no lag: {seq0}).")]
    late = []
    for label in data.LAG_ESTIMATORS[1:]:
        at, at0 = d["reach"][label]
        late.append(f"{label} reaches it at update {at}, {at - at0} later than with no lag (J = {end[label]:.2f} at "
                    f"update {last})" if at is not None else f"{label} not by update {last} (J = {end[label]:.2f})")
    caught = all(d["reach"][label][0] is not None for label in data.LAG_ESTIMATORS[1:])
    lines.append("The stale sampler bends the others' expected gradient and slows them: " + "; ".join(late) + ". "
                 + (f"Delayed, not stalled: each gets there within {last} updates." if caught
                    else f"Delayed, and not all get there within {last} updates."))
    helps = [k for k, (sampled, inf) in d["final"].items() if inf - sampled > 0.1]
    lines.append(f"A larger batch would help {_and(helps)} here (its infinite-batch run ends higher after "
                 f"{d['steps']} updates), but the delay itself is bias: the infinite-batch runs have it too."
                 if helps else "More rollouts would not remove the delay: it is bias, and the infinite-batch runs "
                 "have it too.")
    lines.append("Sequence IS pays in noise instead (its band), which truncation or a larger batch tames.")
    return " ".join(lines)


@screen("Self-check", "Five questions: can you answer them without the charts?",
        "One question per fact, one click each. A wrong answer links back to the screen that teaches it. The chart "
        "keeps score: the prediction you made on each screen, and your answer here. Press Reveal to see every "
        "answer with the number behind it, computed by the library just as the screens computed theirs. Then try "
        "the full pages: each screen's Go deeper opens one with the screen's settings.")
def self_check(n: int, slot) -> None:
    questions = data.self_check(DEV)
    picks = {}
    for q in questions:
        left, right = st.columns([3, 2], vertical_alignment="center")
        picks[q["fact"]] = left.segmented_control(f"({q['fact']}) {q['question']}", q["options"],
                                                  key=f"ls.check.{q['fact']}")
        pick = picks[q["fact"]]
        if pick is not None or revealed(n):
            ok = pick == q["answer"]
            mark = "✓ right" if ok else ("✗ not quite" if pick is not None else "the answer")
            right.markdown(f"**{mark}**: {q['answer']} ({q['why']})")
            if not ok:
                right.button(f"See screen {q['screen']}: {SCREENS[q['screen'] - 1]}", key=f"ls.back_to.{q['fact']}",
                             on_click=go, args=(q["screen"],))
    verdicts = st.session_state.get(VERDICTS, {})
    rows = [dict(fact=q["fact"], prediction=verdicts.get(q["screen"] - 1),
                 check=None if picks[q["fact"]] is None else picks[q["fact"]] == q["answer"]) for q in questions]
    show(slot, n, charts.scoreboard(rows, height=220 if present() else 260))
    st.button("Reveal", key=f"ls.reveal.{n + 1}", type="primary", on_click=reveal, args=(n,), disabled=revealed(n))
    if revealed(n):
        score = sum(r["check"] is True for r in rows)
        st.info(f"**Answers.** {score} of {len(rows)} right here. Each answer above comes with its number, from "
                "seqis.theory.formulas or the lab's exact values.", icon=":material/lightbulb:")
    back, _, deep = st.columns([1, 1, 2])
    back.button("Back", key=f"ls.back.{n + 1}", on_click=go, args=(n,), width="stretch", icon=":material/arrow_back:")
    if deep.button("Go deeper: every estimator on Learn", key=f"ls.deeper.{n + 1}", width="stretch",
                   icon=":material/open_in_new:"):
        switch_page("views/learn.py")


SCREENS = tuple(name for name, *_ in LESSONS)

if present():  # presenter mode: nothing but the screen
    st.html(PRESENT_LESSON_CSS)
n = current_step()
_, title, body, draw = LESSONS[n]
head(n, title, body)
chart_slot, panel = stage()
with panel:
    draw(n, chart_slot)
if revealed(n):  # a copied link reopens the screen as shown
    st.query_params[REVEAL] = "1"
elif REVEAL in st.query_params:
    del st.query_params[REVEAL]
if not present():
    st.sidebar.caption("Lessons: " + " · ".join(f"{i}. {name}" for i, name in enumerate(SCREENS, 1)) + ". Open "
                       "any with ?step=N (from 1), revealed with &reveal=1; ?present=1 for a projector.")
