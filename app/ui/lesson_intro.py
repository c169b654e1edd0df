"""The Lessons page's first two screens (why trainer and sampler disagree, and by how much; the estimators' cast)
and fact (a)'s realistic half (MIS-PO's band at a measured mismatch). Each draws its chart into the slot it is
given, then its controls, prediction, answer and Back / Next (ui/lesson_frame.py); the numbers come from
ui/lesson_intro_data.py, which asks the library.
"""

from __future__ import annotations

import streamlit as st

from . import lesson_charts as charts
from . import lesson_intro_data as data
from .lesson_frame import DEV, and_, answer, control, from_lesson, height, nav, predict_row, revealed, show

MISMATCH_TITLE = "Why do the trainer and the sampler disagree, and by how much?"
MISMATCH_BODY = (
    "RL samples rollouts with a fast inference engine μ and trains another copy of the policy, π. Both should be "
    "the same policy, but they disagree per token: the engine computes in bf16 or fp8 with its own kernels (fused "
    "attention, batch-dependent sums, MoE routing), it may change temperature or truncate (top-p), and under "
    "asynchronous RL its weights are some updates old. The chart shows per-token KL(μ || π) measured on real "
    "engines and the noise levels s the next screens use (KL = s²/2). Our tiny transformer samples in bf16 and is "
    "rescored in fp32: how large is its mismatch?")


def why_disagree(n: int, slot) -> None:
    dtype = control(n, st.segmented_control, "the sampler's number format (the trainer: fp32)", "dtype", "bf16",
                    data.MISMATCH_ASSETS)
    m = data.mismatch(dtype)
    show(slot, n, charts.mismatch(data.engines(), data.lesson_levels(), m if revealed(n) else None, dtype=dtype,
                                  height=height()))
    guess = predict_row(n, st.segmented_control, "Your prediction: its per-token KL, in nats",
                        options=[label for *_, label in data.KL_BINS])
    truth = data.kl_bin(m["kl"])
    eng = data.engines()
    lo, hi = eng["kl_low"].min(), eng["kl_high"].max()
    answer(n, guess=guess, said=f"“{guess}”", at=f"the {dtype} sampler", right=guess == truth,
           truth=f"{m['kl']:.2g} (“{truth}”)",
           text=f"The {dtype} sampler's per-token KL is **{m['kl']:.2g}** nats (k3 = mean(ρ − 1 − l) over "
           f"{m['tokens']:,} loss tokens of {m['rollouts']} rollouts), an s of "
           f"**{m['s']:.3g}** (the standard deviation of l: {m['sd']:.3g}); |l| has median {m['p50']:.2g} and 99th "
           f"percentile {m['p99']:.2g}. Real engines measure {lo:g} to {hi:g}: s = {eng['s_low'].min():.3g} to "
           f"{eng['s_high'].max():.3g}.",
           why=f"Here only rounding differs: one small model, 66 tokens, the same kernels. Real engines add their "
           "own kernels, large-logit rounding over 100k+ tokens, long contexts and lag, so they sit "
           f"{eng['kl_low'].min() / m['kl']:.0f}x or more above it. The lessons' s = 0.05 (KL 0.00125) sits inside "
           "the H20 and L20 range; s = 1.2 is far past any engine and only shows where a rule breaks.")
    nav(n, None, "")


CAST_TITLE = "Who is who: which correction does what to a rollout?"
CAST_BODY = (
    "Every correction multiplies each token's gradient by a weight built from the per-token ratios ρ_t = π/μ. "
    "Token IS uses ρ_t itself (TIS caps it at C); sequence IS uses the rollout's product w = Π ρ_t (TIS caps it, "
    "MIS drops rollouts with w > C); GeoMean IS uses the geometric ratio exp(S/T) as the weight, while the "
    "geometric mask only asks whether exp(S/T) is in a band and keeps weight 1; MIS-PO checks every token and "
    "exp(S/T); the veto drops a rollout with any ρ_t below 1e-4. The card shows each one's weights on three "
    "rollouts. What does GeoMean IS give the rollout with one low token?")


def cast(n: int, slot) -> None:
    L = control(n, st.select_slider, "the odd token's |l| = L (nats)", "L", 10, data.CAST_L)
    d = data.cast(float(L))
    show(slot, n, charts.cast(d["cells"], revealed=revealed(n), height=height() + 60))
    guess = predict_row(n, st.segmented_control, "Your prediction: GeoMean IS gives that rollout's tokens…",
                        options=list(data.GEO_CHOICES))
    answer(n, guess=guess, said=f"“{guess}”", at=f"L = {L}", right=guess == d["geo"], truth=f"“{d['geo']}”",
           text=f"GeoMean IS gives **{d['geo_text']}**: exp(S/T) = e^(−{L}/{data.CAST_T}) = {d['ratio']:.3g}, the "
           f"same weight on every token. The geometric mask reads the same ratio and gives {d['mask_text']}: it "
           "keeps or drops, it does not weigh.",
           why="The two share the geometric ratio but use it differently: GeoMean IS (Huang's training runs) scales "
           "the whole rollout by it; a geometric mask or band (Li's [0.5, 2], MIS-PO's [0.996, 1.001]) is a 0/1 "
           "filter on it. Neither sees the odd token itself: averaged over T tokens it barely moves exp(S/T). Only "
           "a token-level rule (MIS-PO's token band, the veto, token IS) treats that token apart.")
    nav(n, None, "")


REAL_TITLE = "At a real engine's mismatch, which rollouts does MIS-PO's tight band keep?"
REAL_BODY = (
    "Li's band [0.5, 2] bites only past a per-token KL of 0.69 nats, hundreds of times the mismatch engines show. "
    "Step 3.5 Flash's MIS-PO puts a much tighter band on the geometric ratio: [0.996, 1.001], a per-token KL cutoff "
    "of −log 0.996 = 0.004 nats, inside the measured range (shaded). The points are the share of simulated "
    "rollouts it keeps at 16 and 256 tokens as the per-token KL grows. Pick a KL: what share of 4,096-token "
    "rollouts does the band keep there?")


def realistic(n: int, slot) -> None:
    kl = control(n, st.select_slider, "per-token KL(μ || π) (nats)", "kl", 1e-3, data.REAL_KL,
                 format_func=lambda v: f"{v:g}")
    d = data.realistic(float(kl), DEV)
    show(slot, n, charts.realistic(d, revealed=revealed(n), shown=data.REAL_SHOWN, engines=data.engines(),
                                   height=height()))
    guess = predict_row(n, st.segmented_control, f"Your prediction: at T = {data.REAL_T:,} the band keeps…",
                        options=list(data.KEEP_BINS))
    keep = d["keep"]
    share = keep[data.REAL_T]
    truth = data.keep_bin(share)
    sim_kl, sim, se = d["keep_sim"]
    short = min(keep)
    answer(n, guess=guess, said=f"“{guess}”", at=f"KL = {kl:g}", right=guess == truth, truth=f"“{truth}” ({share:.1%})",
           text=f"At KL = {kl:g} (s = {d['s']:.3g}) the band keeps **{share:.1%}** of {data.REAL_T:,}-token rollouts "
           f"(closed form; simulated {sim:.1%} ± {2 * se:.1%} at KL {sim_kl:.2g}), "
           + ", ".join(f"{keep[T]:.1%} at T = {T:,}" for T in sorted(keep) if T != data.REAL_T) + ".",
           why=f"exp(S/T) settles at e^(−KL) with spread s/√T. Below the cutoff {d['cutoff']:.4f} long rollouts "
           "settle inside the band and pass; past it they settle outside and are dropped, the sharper the longer. "
           f"Short rollouts are noisier and leave a band this narrow by chance: at T = {short} only "
           f"{keep[short]:.1%} pass at this KL. At a realistic mismatch MIS-PO's threshold is what decides, and it "
           f"decides against {and_(['short rollouts'] + (['long ones too'] if kl > d['cutoff'] else []))}.")
    nav(n, from_lesson(n, "lt", {"lt.s": data.lt_s(kl)}, "the KL-cutoff chart"), "Length & thresholds")
