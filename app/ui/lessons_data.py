"""Lessons' cached bridge: every screen's simulation and its closed form, at the few fixed settings a screen offers.

Each screen's controls take a handful of values (the *_OPTIONS below), so `warm_all` computes every one of them at
start-up and every screen is a cache hit. Where a screen shows what a full page shows, it asks the same cached
bridge with that page's settings (lengths_data.length_panel, lab_data.compare, lab_data.knob_sweep,
training_data.run_training), so "Go deeper" finds the work done too. Arguments are small hashable values; results
are DataFrames and plain numbers, never tensors.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial

import numpy as np
import pandas as pd
import streamlit as st

from seqis import ESTIMATORS
from seqis.lab import huang2026
from seqis.lab.mean_field import train_expected
from seqis.theory import acceptance
from seqis.theory import formulas as theory

from . import lab_data, lengths_data, training_data
from .runtime.memo import memo

# ---- screen 1: one rollout's product weight and geometric ratio as it grows
OPEN_S = (0.02, 0.05, 0.1)
OPEN_ROLLOUTS = (0, 1, 2, 3, 4)  # which rollout the chart follows (a seed)
OPEN_T = 4096
OPEN_LENGTHS = tuple(int(t) for t in np.unique(np.round(np.geomspace(1, OPEN_T, 120))))
OPEN_PATHS = 12  # the followed rollout and 11 more in grey
OPEN_SHARE_N = 2000  # rollouts whose w at T = 4096 the share counts


@st.cache_data(max_entries=8, show_spinner=False)
def _share(s: float, device: str) -> tuple[float, float]:
    """The share of OPEN_SHARE_N simulated OPEN_T-token rollouts with w < 1, and its standard error."""
    ends = acceptance.running_ratios(OPEN_SHARE_N, (OPEN_T,), s, seed=0, device=device)
    share = float((ends["w"] < 1).mean())
    return share, math.sqrt(share * (1 - share) / OPEN_SHARE_N)


@st.cache_data(max_entries=32, show_spinner=False)
def opening(s: float, rollout: int, device: str) -> dict:
    """{"paths": rows rollout, T, w, geo (rollout 0 is the one followed), "theory": rows T, w_median, w_low, w_high,
    geo_low, geo_high (+-2 sd), "share": P(w < 1) at OPEN_T (closed form), "share_sim" and "share_se" (of
    OPEN_SHARE_N simulated rollouts), "median": e^(-T s^2 / 2)}."""
    paths = acceptance.running_ratios(OPEN_PATHS, OPEN_LENGTHS, s, seed=1000 + rollout, device=device)
    share_sim, share_se = _share(s, device)
    T = np.asarray(OPEN_LENGTHS, dtype=float)
    lines = pd.DataFrame({"T": T, "w_median": theory.seq_weight_quantile(T, s, 0.0),
                          "w_low": theory.seq_weight_quantile(T, s, -2.0),
                          "w_high": theory.seq_weight_quantile(T, s, 2.0),
                          "geo_low": theory.geo_ratio_quantile(T, s, -2.0),
                          "geo_high": theory.geo_ratio_quantile(T, s, 2.0)})
    return dict(paths=paths, theory=lines, share=float(theory.product_band_acceptance(OPEN_T, s, 0.0, 1.0)),
                share_sim=share_sim, share_se=share_se, median=float(theory.seq_weight_quantile(OPEN_T, s, 0.0)))


# ---- screen 2 (fact a): a band on the product ratio or on the geometric ratio; Length & thresholds' own panel
BAND_S = (0.05, 0.3, 0.8, 1.2)  # 1.2: past Li's band's cutoff, s = sqrt(-2 log 0.5) = 1.18
LT = dict(geo=(0.5, 2.0), traj=(0.996, 1.001), clip=2.0, n=1000, seed=0)  # Length & thresholds' first view


def bands(s: float, device: str) -> dict:
    """Acceptance vs length of Li's band [0.5, 2] on the product ratio and on the geometric ratio (Length &
    thresholds' panel at its defaults but s): {"theory", "sim"} rows label, T, accepted(_se), the labels by role
    ("product", "geo"), and at the longest length the closed form and simulated share each keeps."""
    panel = lengths_data.length_panel(s, LT["geo"], LT["traj"], LT["clip"], LT["n"], LT["seed"], device)
    labels = lengths_data.length_labels(LT["geo"], LT["traj"], LT["clip"])
    shown = [labels["product"], labels["geo"]]
    last = panel["table"].iloc[-1]
    return dict(theory=panel["acc_theory"][panel["acc_theory"]["label"].isin(shown)],
                sim=panel["acc_sim"][panel["acc_sim"]["label"].isin(shown)], labels=labels, T=int(last["T"]),
                product=float(last[labels["product"] + " (closed form)"]),
                geo=float(last[labels["geo"] + " (closed form)"]),
                product_sim=float(last[labels["product"] + " (simulated)"]),
                geo_sim=float(last[labels["geo"] + " (simulated)"]),
                cutoff_kl=float(theory.mis_po_kl_cutoff(LT["geo"][0])),
                cutoff_s=float(theory.s_from_kl(theory.mis_po_kl_cutoff(LT["geo"][0]))))


# ---- screen 3 (fact b): one catastrophic token; Length & thresholds' panel
CAT_L = (5, 10, 20)
CAT_LOW = (0.5, 0.9)  # the geometric band's lower edge (upper 2)
CAT_TOKEN = (0.5, 2.0)  # mis_po's token band
CAT_RULES = {"geo_mask": "geometric", "mis_po": "token"}  # the two rules the screen sets side by side, by role


def catastrophic(L: float, low: float, device: str) -> dict:
    """One token with l = -L among on-policy tokens: {"df": rows rule ("geometric": geo_mask, "token": mis_po; see
    CAT_RULES), T, weight, accepted (direction "down"), "t_star": L / -log low (closed form), "dropped_at" /
    "kept_at": the simulated lengths either side of it (the longest where the geometric gate drops the rollout,
    the shortest where it keeps it), "token_kept": whether the token band ever keeps the token's gradient}."""
    geo = (float(low), 2.0)
    panel = lengths_data.catastrophic_panel(float(L), geo, CAT_TOKEN, LT["traj"], LT["clip"], device)
    df = panel["df"].assign(rule=lambda d: d["estimator"].map(CAT_RULES))
    df = df[(df["direction"] == "down") & df["rule"].notna()]
    gate = df[df["rule"] == "geometric"]
    kept = gate[gate["accepted"].astype(bool)]["T"]
    dropped = gate[~gate["accepted"].astype(bool)]["T"]
    return dict(df=df, t_star=float(theory.catastrophic_min_length(float(L), low)),
                kept_at=int(kept.min()) if len(kept) else None,
                dropped_at=int(dropped.max()) if len(dropped) else None,
                token_kept=bool(df[df["rule"] == "token"]["weight"].gt(0).any()))


# ---- screen 4 (fact c): token IS on Huang's chain, threshold vs additive reward; Bias & variance's first run
REWARD_OPTIONS = tuple(theory.REWARDS)  # ("threshold", "additive")
SHOWN = ("token_tis", "seq_is", "pg")


def token_bias(reward: str, device: str, progress=None) -> dict:
    """Bias & variance's first run (its toy, estimators and Monte Carlo) with this reward: per shown estimator each
    batch's gradient over the true one (averaged over positions), their mean and its standard error (the spread of
    the per-batch values over √batches: the error of the plotted mean, which the per-position errors overstate),
    and the exact expectation where known. {"rows": estimator, ratio, ratio_se, exact; "batches": estimator ->
    (n_batches,) per-batch ratios; "toy", "contrast"}."""
    toy = lab_data.ToySpec(bit_reward=reward)
    ests = tuple((n, ESTIMATORS[n].config()) for n in lab_data.DEFAULT_ESTIMATORS)
    res = lab_data.compare(toy, ests, lab_data.MCSpec(device=device), progress=progress)
    true = np.asarray(lab_data.chain_info(toy)["true"])  # (D,)
    rows, batches = [], {}
    for name in SHOWN:
        per_batch = (res["batches"][name] / true).mean(axis=1)  # (n_batches,) each batch's mean ratio
        exact = res["exact"].get(name)
        batches[name] = per_batch
        rows.append(dict(estimator=name, ratio=float(per_batch.mean()),
                         ratio_se=float(per_batch.std(ddof=1) / math.sqrt(len(per_batch))),
                         exact=float((np.asarray(exact) / true).mean()) if exact is not None else math.nan))
    return dict(rows=pd.DataFrame(rows), batches=batches, toy=repr(toy.chain()),
                contrast=lab_data.token_is_contrast(toy))


# ---- screen 5 (fact d): the best clip, on the toy whose sequence-TIS MSE has an interior minimum
CLIP_B = (32, 128, 512)
CLIP_GUESSES = (0.5, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, math.inf)
CLIP_COST_B = (32, 512)  # the batch sizes at which the answer states what clipping at Li's C* costs
VALLEY = 0.05  # the flat valley: clips whose exact MSE is within 5% of the lowest


def clip_cost(batch_size: int) -> dict:
    """Li's C* against the exact best clip on the clip lesson's chain at this batch size: {"best", "star",
    "cost": MSE at C* over the lowest MSE, minus 1, "valley": (lo, hi) the clips within VALLEY of the lowest}."""
    toy, C = lab_data.INTERIOR_TOY, np.asarray(lab_data.CLIP_LINE)
    star = float(theory.seq_tis_best_clip(theory.bitchain_chi2(toy.horizon, toy.p, toy.q)))
    mse = sum(theory.bitchain_seq_tis_error(toy.horizon, toy.threshold, toy.p, toy.q, C, int(batch_size)))
    at_star = float(sum(theory.bitchain_seq_tis_error(toy.horizon, toy.threshold, toy.p, toy.q, np.asarray([star]),
                                                      int(batch_size)))[0])
    flat = C[mse <= (1 + VALLEY) * mse.min()]
    return dict(best=float(C[np.argmin(mse)]), star=star, cost=at_star / float(mse.min()) - 1,
                valley=(float(flat.min()), float(flat.max())))


def clip_sweep(batch_size: int, device: str, progress=None) -> dict:
    """seq_tis's bias², variance and MSE against its clip on lab_data.INTERIOR_TOY, 200 batches of `batch_size`
    (the sweep Bias & variance runs on that toy), and theory's: {"df", "theory" (lab_data.clip_theory),
    "best_sim", "cost": B -> what clipping at Li's C* costs in MSE (at CLIP_COST_B and this B), "valley": the
    clips within VALLEY of the lowest exact MSE at this B}."""
    toy, cfg = lab_data.INTERIOR_TOY, ESTIMATORS["seq_tis"].config()
    mc = lab_data.MCSpec(batch_size=int(batch_size), device=device)
    values = lab_data.knob_values("seq_tis", "seq_clip", cfg)
    df = lab_data.knob_sweep(toy, "seq_tis", cfg, "seq_clip", values, mc, progress=progress)
    finite = df[np.isfinite(df["value"].to_numpy(float))]
    costs = {B: clip_cost(B) for B in sorted({*CLIP_COST_B, int(batch_size)})}
    return dict(df=df, theory=lab_data.clip_theory(toy, "seq_tis", cfg, "seq_clip", mc),
                best_sim=float(finite.loc[finite["mse"].idxmin(), "value"]),
                cost={B: c["cost"] for B, c in costs.items()}, valley=costs[int(batch_size)]["valley"])


# ---- screen 6 (fact e): training under policy lag, sampled and in the infinite-batch limit
LAG_OPTIONS = (0, 50, 100)
LAG_ESTIMATORS = ("Sequence IS", "Token IS", "GeoMean IS", "Sequence TIS 0-2")
LAG_SPEC = training_data.TrainSpec(horizon=128, threshold_frac=0.65, estimators=LAG_ESTIMATORS, batch_size=512,
                                   lr=10.0, seeds=2)  # the lag sweep's chain (seqis.lab.train_sweeps), 300 updates
LAG_EXPECTED_STEPS = 500  # the infinite-batch runs go on past the sampled 300: token IS catches up by ~400 at lag 100
LAG_HALF = 0.5  # "reaches J = 0.5": the lag screen times each run's climb by it
LAG_TIE = 0.005  # final J that differ by less than this print alike (two decimals): a tie


def lag_spec(lag: int, device: str) -> training_data.TrainSpec:
    """The Training page's run at this lag (its settings: LAG_SPEC)."""
    return training_data.TrainSpec(**{**LAG_SPEC.settings(), "lag": int(lag), "device": device})


def lag_expected(device: str, lags: tuple[int, ...] = LAG_OPTIONS) -> pd.DataFrame:
    """Every lag's learning curves along the estimators' exact expected gradients (seqis.lab.train_expected: the
    infinite-batch limit): rows estimator, lag, update, J."""

    def compute():
        spec = lag_spec(0, device)
        ests = [huang2026.ESTIMATOR_OF[label] for label in LAG_ESTIMATORS]
        results = train_expected(spec.chain(), ests, steps=LAG_EXPECTED_STEPS, lr=spec.lr, lags=lags)
        frames = [pd.DataFrame({"estimator": label, "lag": res.lag, "update": np.arange(res.J.shape[-1]),
                                "J": res.J[i, 0]})
                  for res in results for i, label in enumerate(LAG_ESTIMATORS)]
        return pd.concat(frames, ignore_index=True)

    return memo(("lessons-lag-expected", device, LAG_SPEC, LAG_EXPECTED_STEPS, lags), compute)


def first_reach(curve: pd.DataFrame, level: float = LAG_HALF) -> int | None:
    """The first update at which a learning curve (rows update, J) reaches `level`; None if it never does."""
    up = curve[curve["J"] >= level]["update"]
    return int(up.min()) if len(up) else None


def lag(lag: int, device: str, progress=None) -> dict:
    """The sampled runs at this lag (Training's run, seeds' mean and range) and the infinite-batch curves:
    {"J": rows estimator, update, mean, low, high; "expected": rows estimator, update, J (to LAG_EXPECTED_STEPS);
    "final": estimator -> (sampled mean, infinite-batch) J after the sampled runs' last update; "best": the
    estimators whose sampled runs end highest (more than one: a tie, within LAG_TIE); "reach": estimator ->
    (first update its infinite-batch run reaches LAG_HALF at this lag, the same with no lag), None where it never
    does; "end": estimator -> infinite-batch J at LAG_EXPECTED_STEPS; "steps", "expected_steps"}."""
    res = training_data.run_training(lag_spec(lag, device), progress=progress)
    every = lag_expected(device)
    exp = every[every["lag"] == int(lag)]
    steps = int(res["J"]["update"].max())
    last = res["J"][res["J"]["update"] == steps].set_index("estimator")["mean"]
    exp_last = exp[exp["update"] == steps].set_index("estimator")["J"]
    exp_end = exp[exp["update"] == exp["update"].max()].set_index("estimator")["J"]
    final = {label: (float(last[label]), float(exp_last[label])) for label in LAG_ESTIMATORS}
    top = max(v[0] for v in final.values())
    unlagged = every[every["lag"] == 0]
    reach = {label: (first_reach(exp[exp["estimator"] == label]), first_reach(unlagged[unlagged["estimator"] == label]))
             for label in LAG_ESTIMATORS}
    return dict(J=res["J"], expected=exp, final=final, J0=res["J0"],
                best=[k for k, v in final.items() if top - v[0] < LAG_TIE], reach=reach,
                end={label: float(exp_end[label]) for label in LAG_ESTIMATORS}, steps=steps,
                expected_steps=int(exp["update"].max()))


# ---- the quiz: "why" questions, each answer's number computed


def _q(screen: str, question: str, right: str, wrong: tuple[str, ...], why: str, turn: int) -> dict:
    """A quiz question: its options with the right one at position `turn` (so it is not always first)."""
    options = list(wrong)
    options.insert(turn % (len(wrong) + 1), right)
    return dict(screen=screen, question=question, options=options, answer=right, why=why)


def quiz(device: str) -> list[dict]:
    """Nine "why" questions, one per screen before the quiz but the opening: {"screen" (its name on the page),
    "question", "options", "answer" (one of them), "why" (the reason with the number behind it, computed here)}."""
    from .lesson_intro_data import cast, mismatch
    from .lesson_sc_data import quiz_question

    kl = mismatch("bf16")["kl"]
    geo_w = cast(10.0)["ratio"]
    product, geo = (f(4096, 0.05, 0.5, 2.0) for f in (theory.product_band_acceptance, theory.geo_band_acceptance))
    s3 = float(theory.s_from_kl(1e-3))
    short, long_ = (float(theory.geo_band_acceptance(T, s3, 0.996, 1.001)) for T in (16, 4096))
    t_star = theory.catastrophic_min_length(10.0, 0.5)
    contrast = lab_data.token_is_contrast(lab_data.ToySpec())
    C, toy = np.asarray(lab_data.CLIP_LINE), lab_data.INTERIOR_TOY
    best = {B: float(C[np.argmin(sum(theory.bitchain_seq_tis_error(toy.horizon, toy.threshold, toy.p, toy.q, C, B)))])
            for B in CLIP_B}
    exp = lag_expected(device)
    reach = {(label, K): first_reach(exp[(exp["estimator"] == label) & (exp["lag"] == K)])
             for label in ("Sequence IS", "Token IS") for K in (0, 100)}
    return [
        _q("Why they differ", "The tiny transformer's bf16 sampler and fp32 trainer share their weights, with no lag, "
           "temperature or truncation. Why do they still disagree on a token's probability?",
           "bf16 rounds the sampler's weights and activations, so its logits come out slightly different",
           ("the sampler draws its tokens with another random seed", "the trainer has already taken an update"),
           f"rounding alone: a per-token KL of {kl:.2g} nats", 0),
        _q("The cast", "Why does GeoMean IS give a 200-token rollout with one token 10 nats low almost the weight "
           "of a clean one?",
           "its weight exp(S/T) averages the odd token's log-ratio over all 200 tokens",
           ("it clips every token's ratio at 2", "it drops the tokens outside [0.5, 2]"),
           f"e^(−10/200) = {geo_w:.3g} on every token", 1),
        _q("(a) bands", "Why does Li's band [0.5, 2] keep almost every 4,096-token rollout on the geometric ratio, "
           "and few on the product w?",
           "log w spreads like s√T, while exp(S/T) settles at e^(−s²/2)",
           ("long rollouts have smaller per-token log-ratios", "w is clipped at 2 before the band sees it"),
           f"at s = 0.05: geometric {geo:.1%}, product {product:.1%} (closed forms)", 2),
        _q("(a) at a real mismatch", "At a per-token KL of 0.001, why does MIS-PO's band [0.996, 1.001] keep "
           "16-token rollouts less often than 4,096-token ones?",
           "a short rollout's exp(S/T) is noisier (spread s/√T) and leaves a band this narrow by chance",
           ("short rollouts have a larger per-token KL", "the band widens with the rollout's length"),
           f"kept: {short:.1%} at T = 16, {long_:.1%} at T = 4,096 (closed form)", 0),
        _q("(b) catastrophes", "Why can a geometric band miss a token 10 nats off in a long rollout?",
           "it sees exp(−L/T): the token's log-ratio divided by the length",
           ("the bad token is left out of the loss mask", "a band checks only a rollout's first tokens"),
           f"with [0.5, 2] it passes from T\\* = 10 / log 2 = {t_star:.1f} tokens on", 1),
        _q("(c) token IS", "Why is token IS biased with the reward 1[sum ≥ 40] but exact with the sum of the bits?",
           "the threshold couples the tokens: token t's reward depends on the other bits, which still come from μ",
           ("its ratio ρ_t is clipped under the threshold reward", "the sum of the bits has a smaller variance"),
           f"{contrast['threshold']:.1%} of the true gradient against {contrast['additive']:.1%} (closed forms)", 2),
        _q("(d) the best clip", "Why does the best clip C grow with the batch size B?",
           "the batch's variance falls like 1/B, while the bias² a clip adds does not",
           ("larger batches hold larger weights", "Li's C* = √(2(1 + χ²)) grows with B"),
           "exact best " + ", ".join(f"{best[B]:.3g} at B = {B}" for B in CLIP_B) + "; Li's C\\* does not move", 0),
        _q("(e) lag", "With infinite batches, why does sequence IS climb as fast at lag 100 as with no lag?",
           "the product w corrects the whole rollout, so its expected gradient is the true one at any lag",
           ("it clips the stale rollouts' weights", "lag only adds noise, which infinite batches remove"),
           f"J = 0.5 at update {reach['Sequence IS', 100]} at lag 100 and {reach['Sequence IS', 0]} without; token "
           f"IS {reach['Token IS', 100]} against {reach['Token IS', 0]}: its delay is bias, not noise", 1),
        _q(**quiz_question()),
    ]


# ---- start-up


def warm_steps(device: str) -> list[Callable[[], object]]:
    """Every screen at every setting it offers, one call each (the launcher's background warm-up runs them one at
    a time, pausing while a page runs)."""
    from . import lesson_intro_data as intro
    from . import lesson_sc_data as sc

    steps: list[Callable[[], object]] = [partial(intro.mismatch, dtype) for dtype in intro.MISMATCH_ASSETS]
    steps += [partial(intro.cast, float(L)) for L in intro.CAST_L]
    steps += [partial(intro.realistic, kl, device) for kl in intro.REAL_KL]
    steps += [partial(opening, s, r, device) for s in OPEN_S for r in OPEN_ROLLOUTS]
    steps += [partial(bands, s, device) for s in BAND_S]
    steps += [partial(catastrophic, float(L), low, device) for L in CAT_L for low in CAT_LOW]
    steps += [partial(token_bias, r, device) for r in REWARD_OPTIONS]
    steps += [partial(clip_sweep, B, device) for B in CLIP_B]
    steps += [partial(lag, k, device) for k in LAG_OPTIONS]
    steps += [partial(sc.drift, b) for b in sc.SC_B]
    return steps + [partial(quiz, device)]


def warm_all(device: str) -> None:
    """Every screen at every setting it offers."""
    for step in warm_steps(device):
        step()
