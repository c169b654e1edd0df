"""Lessons: why trainer and sampler disagree, who the corrections are, and the five facts of LITERATURE.md, one idea
per screen, the question before the answer.

Eleven screens (`?step=N`, counted from 1 as the page counts; `&reveal=1` opens a screen revealed, for slides): why the
two policies differ and by how much, the estimators' cast, an opening one (one rollout's product weight and
geometric ratio as it grows), one per fact (a)-(e) with (a)'s realistic half (MIS-PO's band at a measured mismatch),
score centering under a constant reward, and a quiz. Each screen asks a question in its title, shows one chart
that withholds its answer, at most two controls, takes a prediction, and on "Reveal" draws the closed form beside
the simulation with the answer's number and a sentence on why, each following the setting shown. A prediction is
stored with the setting it was made at, graded there once and locked (ui/lesson_frame.py); a tie is named as a tie.
"Go deeper" opens the full page at the same settings. Every setting a screen offers is computed at start-up
(ui/lessons_data.py, warmed by ui/warm.py).
`?present=1` (presenter mode) hides the sidebar, folds each screen's words, puts Back / Next above the answer, and
grows the text (22 px and more) and the charts' text (20 px and more); keys: arrows, PageUp / PageDown, R.
"""

from __future__ import annotations

import streamlit as st
from ui import lesson_charts as charts
from ui import lesson_frame as frame
from ui import lesson_intro as intro
from ui import lesson_quiz as quiz
from ui import lesson_sc as sc
from ui import lessons_data as data
from ui.lab_data import INTERIOR_VIEW
from ui.lesson_frame import (
    DEV,
    and_,
    answer,
    computed,
    either,
    from_lesson,
    height,
    key,
    nav,
    nearest,
    predict_row,
    revealed,
    show,
)
from ui.state import bound, present
from ui.style import PRESENT_LESSON_CSS
from ui.widgets import fmt

LESSONS: list[tuple] = []  # (name, title, body, draw(n, chart slot), names estimators) per screen, in order


# ---------------------------------------------------------------------------------------------------------
# the screens


def screen(name: str, title: str, body: str, *, names_estimators: bool = True):
    """Register a screen: its name, its question (the title), its 60-120 words, the function that draws its
    chart into the slot it is given and everything under it (controls, prediction, answer, navigation), and
    whether it names estimators (then it links to the cast)."""
    def register(draw):
        LESSONS.append((name, title, body, draw, names_estimators))
        return draw
    return register


screen("Why they differ", intro.MISMATCH_TITLE, intro.MISMATCH_BODY, names_estimators=False)(intro.why_disagree)
screen("The cast", intro.CAST_TITLE, intro.CAST_BODY)(intro.cast)


@screen("Opening", "One rollout, T tokens: where does its weight w end up?",
        "Every token carries a log-ratio l_t = log π(y_t) − log μ(y_t) between the trainer π and the sampler μ. "
        "Here each l_t is drawn from N(−s²/2, s²): a valid importance-sampling model, with E_μ[π/μ] = 1 per token "
        "and a per-token KL of s²/2. The exact correction for the whole rollout is the product "
        "w = exp(Σ l_t); its geometric ratio exp(Σ l_t / T) is the average token's. The chart follows one rollout "
        "to 256 tokens, eleven more in grey; Reveal runs them to 4,096. E[w] = 1 at every length. What share of "
        "4,096-token rollouts end with w below 1?", names_estimators=False)
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
    nav(n, from_lesson(n, "lt", {"lt.s": s}, "the first chart: a band on w rejects long rollouts"),
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
    nav(n, from_lesson(n, "lt", {"lt.s": s}, "Acceptance vs length and the KL cutoff"), "Length & thresholds")


screen("(a) at a real mismatch", intro.REAL_TITLE, intro.REAL_BODY)(intro.realistic)


T_GUESSES = (2, 5, 15, 50, 150, 500)


@screen("(b) catastrophes", "One token 10 nats off: does a long rollout hide it?",
        "A numerical glitch can make one token catastrophically off: with l = −10, π gives it e^−10 of μ's "
        "probability. Every other token here is on-policy (l = 0). A geometric band sees the rollout's average, "
        "exp(−L/T); a token band (MIS-PO's [0.5, 2] on each token) sees the token itself. The markers are what each "
        "rule sees: the token band at every length, the geometric band up to 4 tokens (Reveal draws the rest and "
        "what the estimators decide). From which length on does the geometric band let the bad token's gradient "
        "through?")
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
           truth=f"T\\* = {d['t_star']:.3g}, nearest {either(near)}",
           text=f"Closed form: from **T\\* = L / −log a = {d['t_star']:.3g}** tokens on. Simulated through "
           f"geo_mask: dropped at T = {d['dropped_at']}, kept at T = {d['kept_at']} (the lengths run). MIS-PO's token "
           f"band {'keeps' if d['token_kept'] else 'drops'} it at every length.",
           why="The geometric ratio is exp(−L/T): the catastrophe is averaged over T tokens and passes the band once "
           "L/T < −log a. Long rollouts dilute catastrophes; only a token-level rule (a token band, verl's veto) sees "
           "the token itself.")
    nav(n, from_lesson(n, "lt", {"lt.L": int(L), "lt.geo.geo_mask_low": low}, "Catastrophic-token dilution"),
        "Length & thresholds")


REWARD_LABELS = {"threshold": "threshold: 1[sum ≥ 40]", "additive": "additive: the sum of the bits"}
BIAS_GUESSES = {"100% (unbiased)": 1.0, "about 85%": 0.85, "about 60%": 0.6, "about 30%": 0.3}


@screen("(c) token IS", "Token IS corrects every token. Is its gradient unbiased?",
        "Huang's chain: 64 independent bits, reward 1 if at least 40 are ones. The trainer π sets a bit to 1 with "
        "p = 0.6, the sampler μ with q = 0.55. Token IS multiplies each token's gradient by its own ratio "
        "ρ_t = π(a_t)/μ(a_t), as PPO does; sequence IS multiplies all of them by the product w. Each dot is one "
        "batch of 128 rollouts' mean gradient as a share of the exact one; the bars are their mean over 200 "
        "batches, ±2 standard errors. Token IS's waits for Reveal. What share does token IS get?")
def token_is(n: int, slot) -> None:
    reward = bound(st.segmented_control, "reward", key(n, "reward"), "threshold", options=list(REWARD_LABELS),
                   format_func=REWARD_LABELS.get, valid=lambda v: v in REWARD_LABELS)
    reward = reward or "threshold"
    d = computed("Monte Carlo", data.token_bias, reward)
    rows = d["rows"].set_index("estimator")
    show(slot, n, charts.token_bias(d["rows"], d["batches"], revealed=revealed(n), height=height(), reward=reward))
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
           f"{rows.loc['token_tis', 'ratio']:.1%} ± {2 * rows.loc['token_tis', 'ratio_se']:.1%}. Sequence IS: "
           f"{rows.loc['seq_is', 'ratio']:.1%} simulated, exactly 100%. Naive PG (no correction): "
           f"**{rows.loc['pg', 'exact']:.3g}x** the true gradient (simulated {rows.loc['pg', 'ratio']:.3g}x). "
           f"With the other reward token IS gets {d['contrast'][other]:.1%}.", why=why)
    nav(n, from_lesson(n, "bv", {"bv.bit_reward": reward}, "the caption under the three tiles"), "Bias & variance")


@screen("(d) the best clip", "Clip the sequence weight at C: where is the best C?",
        "Sequence TIS replaces w by min(w, C). A small C caps the variance but biases the gradient (the rewarded "
        "rollouts here have w > 1, and clipping shrinks them); a large C is unbiased but noisy. On a 16-bit chain "
        "(reward 1 if at least 11 ones, p = 0.55, q = 0.45) the points are bias² and variance over 200 batches at "
        "each clip. Li & Liu's rule of thumb is C\\* = √(2(1 + χ²)). Where is their sum, the MSE, lowest?")
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
        li = f"Li's C\\* lands within {abs(off - 1):.0%} of the best here, a good first guess"
    else:
        li = (f"Li's C\\* misses the best here by a factor {max(off, 1 / off):.1f} "
              f"({'above' if off > 1 else 'below'} it)")
    answer(n, guess=guess, said=f"C = {fmt(guess)}" if guess is not None else "", at=f"B = {B}", right=guess in near,
           truth=f"C = {th['best']:.3g}, nearest {either(near, fmt)}",
           text=f"The exact MSE is lowest at **C = {th['best']:.3g}** (simulated: {d['best_sim']:g}); Li's "
           f"C\\* = √(2(1 + χ²)) = **{th['star']:.3g}** with χ² = E_μ[w²] − 1 = {th['chi2']:.3g}, the whole "
           f"rollout's chi-square, not one token's. The MSE stays within {data.VALLEY:.0%} of its lowest from "
           f"C = {d['valley'][0]:.3g} to {d['valley'][1]:.3g} (shaded). Clipping at C\\* costs "
           + ", ".join(f"**{d['cost'][b]:+.0%}** MSE at B = {b}" for b in sorted(d['cost'])) + ".",
           why="Clipping trades bias for variance: the valley sits where a little more bias² costs what a little less "
           f"variance saves. Li's C\\* is derived for one rollout: it balances the bounds on one rollout's bias "
           f"O(T(1 + χ²)/C) and variance O(T²C²), so it does not see the batch size. {li}; the exact best moves "
           "with B, since the batch's variance falls like 1/B and bias² does not.")
    nav(n, from_lesson(n, "bv", {**INTERIOR_VIEW, "bv.B": int(B)}, "the sweep at the bottom"), "Bias & variance")


@screen("(e) lag", "The sampler lags K updates: which correction is ahead after 300 updates?",
        "Asynchronous RL trains on rollouts from a policy several updates old. Here a policy over a 128-bit chain "
        "(reward 1 if at least 84 ones) starts near J = 0 and takes 300 SGD updates of 512 rollouts each, every "
        "batch drawn from the policy K updates stale, under four corrections: sequence IS, token IS, GeoMean IS and "
        "sequence TIS at C = 2. Curves are the exact success probability J over the first 200 updates; bands "
        "span two seeds. Which ends highest after all 300, at the lag you pick?")
def lag(n: int, slot) -> None:
    K = bound(st.select_slider, "lag K (updates stale)", key(n, "K"), 100, options=list(data.LAG_OPTIONS),
              valid=lambda v: v in data.LAG_OPTIONS)
    d = computed("Training", data.lag, int(K))
    show(slot, n, charts.lag(d, revealed=revealed(n), height=height(), lag=int(K)))
    guess = predict_row(n, st.segmented_control, "Your prediction: highest at the end",
                        options=list(data.LAG_ESTIMATORS))
    final, best = d["final"], d["best"]
    tie = len(best) > 1
    first = (f"**A {len(best)}-way tie**: {and_(best)} end level at lag {K}" if tie
             else f"**{best[0]}** ends highest at lag {K}")
    answer(n, guess=guess, said=f"“{guess}”", at=f"lag {K}", right=guess in best,
           truth=f"a {len(best)}-way tie ({and_(best)})" if tie else f"“{best[0]}”",
           text=f"{first}. Final J after {d['steps']} updates, sampled (infinite batch): "
           + ", ".join(f"{k} {v[0]:.2f} ({v[1]:.2f})" for k, v in final.items()) + ".", why=lag_why(int(K), d))
    nav(n, from_lesson(n, "tr", {"tr.H": 128, "tr.f": 0.65, "tr.K": int(K), "tr.B": 512, "tr.lr": 10.0,
                                  "tr.seeds": 2}, "the learning curves and Huang's sweeps below them"), "Training")


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
    lines.append(f"A larger batch would help {and_(helps)} here (its infinite-batch run ends higher after "
                 f"{d['steps']} updates), but the delay itself is bias: the infinite-batch runs have it too."
                 if helps else "More rollouts would not remove the delay: it is bias, and the infinite-batch runs "
                 "have it too.")
    lines.append("Sequence IS pays in noise instead (its band), which truncation or a larger batch tames.")
    return " ".join(lines)


screen("Score centering", sc.TITLE, sc.BODY, names_estimators=False)(sc.draw)
screen("Quiz", quiz.TITLE, quiz.BODY, names_estimators=False)(quiz.draw)
frame.SCREENS[:] = [name for name, *_ in LESSONS]
SCREENS = tuple(frame.SCREENS)

if present():  # presenter mode: nothing but the screen
    st.html(PRESENT_LESSON_CSS)
n = frame.current_step()
_, title, body, draw, names = LESSONS[n]
frame.head(n, title, body, names_estimators=names)
chart_slot, panel = frame.stage()
with panel:
    draw(n, chart_slot)
if revealed(n):  # a copied link reopens the screen as shown
    st.query_params[frame.REVEAL] = "1"
elif frame.REVEAL in st.query_params:
    del st.query_params[frame.REVEAL]
if not present():
    st.sidebar.caption("Lessons: the list of screens is under “Screens” at the top right. Open any with ?step=N "
                       "(from 1), revealed with &reveal=1; ?present=1 for a projector (keys: → or PageDown next, "
                       "← or PageUp back, R reveal).")
