"""Bias & variance: the lab. On a toy with an exact gradient, each estimator's gradient error splits into
bias² and variance; sweep a knob, the toy's horizon or its sampler's lag, or the batch size.

Every setting lives in sidebar forms (nothing reruns the Monte Carlo until "Run") bound to the URL under
"bv."; results are memoised by their inputs (ui/lab_data.py through ui/runtime/memo.py), and a run shows a progress bar.
"""

import streamlit as st
from ui import lab_charts as charts
from ui import lab_data
from ui.clip_charts import mse_vs_clip
from ui.device import device
from ui.presets import arrival
from ui.runtime.chart import chart
from ui.runtime.memo import ProgressSlot
from ui.state import bound, set_view
from ui.widgets import knob_widgets

from seqis import ESTIMATORS, knobs
from seqis.registry import resolve

TOYS = {"bitchain": "bit chain (Huang)", "tabular": "tabular autoregressive"}
H_OPTIONS = [4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 256]
PROB_OPTIONS = [round(0.05 * i, 2) for i in range(1, 20)]
V_OPTIONS = [2, 3, 4]
T_OPTIONS = [1, 2, 3, 4, 5, 6]
MISMATCH_OPTIONS = [0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0]
REWARDS = ["random", "threshold", "additive"]
BIT_REWARDS = {"threshold": "threshold: 1[sum of bits ≥ k]", "additive": "additive: the sum of the bits"}
LAG_OPTIONS = [0, 1, 2, 4, 8, 12, 16, 24, 32]
B_OPTIONS = [8, 16, 32, 64, 128, 256, 512, 1024]
NB_OPTIONS = [50, 100, 200, 400, 800, 1600]
DEFAULT_ESTIMATORS = list(lab_data.DEFAULT_ESTIMATORS)  # the first view, computed in the background at start-up
DEFAULT_SWEEP = lab_data.DEFAULT_SWEEP


def one_of(options):
    return lambda v: v in options


st.title("Bias & variance")
st.markdown(
    "On a toy whose policy gradient is known exactly, an estimator's error over many batches splits into "
    "**bias²** (how far its mean is from the truth; more batches do not help) and **variance** (how much "
    "one batch's estimate scatters; falls like 1/batch size). Sequence IS is unbiased but its variance grows "
    "like (1 + χ²)^T; truncating, masking or correcting per token trades some of that variance for bias. "
    "Error bars are ±2 s.e. over the batches."
)
arrival("bv")

# ---- sidebar: the lab, in a form (nothing reruns until "Run")
with st.sidebar.form("bv.form"):
    st.markdown("**Toy**")
    toy = bound(st.selectbox, "toy", "bv.toy", "bitchain", options=list(TOYS), format_func=TOYS.get,
                valid=one_of(TOYS))
    if toy == "bitchain":
        H = bound(st.select_slider, "horizon H (tokens)", "bv.H", 64, options=H_OPTIONS, valid=one_of(H_OPTIONS))
        k = bound(st.number_input, "threshold k: reward 1[sum of bits ≥ k]", "bv.k", 40, min_value=0,
                  max_value=max(H_OPTIONS), step=1)
        p = bound(st.select_slider, "p = π(bit = 1), the trainer", "bv.p", 0.6, options=PROB_OPTIONS,
                  valid=one_of(PROB_OPTIONS))
        q = bound(st.select_slider, "q = μ(bit = 1), the sampler", "bv.q", 0.55, options=PROB_OPTIONS,
                  valid=one_of(PROB_OPTIONS), help="Ignored when the sampler lag K > 0.")
        bit_reward = bound(st.selectbox, "reward", "bv.bit_reward", "threshold", options=list(BIT_REWARDS),
                           format_func=BIT_REWARDS.get, valid=one_of(BIT_REWARDS),
                           help="threshold: couples the tokens (a token's reward depends on the others); additive: "
                                "every token is rewarded on its own, and token IS becomes unbiased.")
        toy_kw = dict(horizon=int(H), threshold=int(k), p=p, q=q, bit_reward=bit_reward)
    else:
        V = bound(st.select_slider, "vocabulary V", "bv.V", 3, options=V_OPTIONS, valid=one_of(V_OPTIONS))
        T = bound(st.select_slider, "horizon T", "bv.T", 4, options=T_OPTIONS, valid=one_of(T_OPTIONS))
        mismatch = bound(st.select_slider, "mismatch (per-state logit noise of μ)", "bv.mismatch", 0.5,
                         options=MISMATCH_OPTIONS, valid=one_of(MISMATCH_OPTIONS), help="Ignored when lag K > 0.")
        reward = bound(st.selectbox, "reward", "bv.reward", "random", options=REWARDS, valid=one_of(REWARDS),
                       help="random: a U(0,1) reward per sequence (couples every token); threshold / additive: "
                            "on the count of the last token.")
        toy_seed = bound(st.number_input, "toy seed", "bv.toy_seed", 0, min_value=0, max_value=10_000, step=1)
        toy_kw = dict(vocab=int(V), horizon=int(T), mismatch=mismatch, reward=reward, toy_seed=int(toy_seed))
    lag = bound(st.select_slider, "sampler lag K (updates stale; 0: use q / mismatch)", "bv.lag", 0,
                options=LAG_OPTIONS, valid=one_of(LAG_OPTIONS),
                help="K > 0: μ is π walked back K steps of gradient ascent (step 1) along the exact gradient.")
    st.markdown("**Monte Carlo**")
    B = bound(st.select_slider, "rollouts per batch", "bv.B", 128, options=B_OPTIONS, valid=one_of(B_OPTIONS))
    nb = bound(st.select_slider, "batches", "bv.nb", 200, options=NB_OPTIONS, valid=one_of(NB_OPTIONS))
    names = bound(st.multiselect, "estimators", "bv.est", DEFAULT_ESTIMATORS, options=list(ESTIMATORS),
                  valid=lambda v: all(n in ESTIMATORS for n in v))
    baseline = bound(st.checkbox, "GRPO-style baseline (reward − batch mean)", "bv.baseline", False)
    seed = bound(st.number_input, "seed", "bv.seed", 0, min_value=0, max_value=2**31 - 1, step=1)
    configs, errors = {}, []
    with st.expander("Estimator knobs"):
        for name in names:
            st.markdown(f"`{name}`")
            cfg, err = knob_widgets(ESTIMATORS[name].config, f"bv.knob.{name}", container=st, exclude=("adv_tau",))
            configs[name] = cfg
            if err:
                errors.append(f"{name}: {err}")
    st.form_submit_button("Run", type="primary", width="stretch", key="bv_run")

if not names:
    st.warning("Pick at least one estimator in the sidebar.")
    st.stop()
for e in errors:
    st.error(e)
if errors:
    st.stop()

toy_spec = lab_data.ToySpec(toy=toy, lag=int(lag), **toy_kw)
try:
    info = lab_data.chain_info(toy_spec)
except ValueError as e:
    st.error(f"This toy cannot be built: {e}")
    st.stop()
ests = tuple((name, configs[name]) for name in names)
mc = lab_data.MCSpec(batch_size=int(B), n_batches=int(nb), seed=int(seed), baseline=bool(baseline),
                     device=str(device()))
st.caption(f"`{info['repr']}` · {info['dim']} parameters · J = E_π[reward] = {info['value']:.4g} · "
           f"exact ‖∇J‖ = {info['true_norm']:.4g} · {B} rollouts per batch × {nb} batches from μ")

# ---- every estimator on the same rollouts
with ProgressSlot("Monte Carlo") as progress:
    res = lab_data.compare(toy_spec, ests, mc, progress=progress)
summary = res["summary"]
zero_mse = info["true_norm"] ** 2  # the MSE of an estimate that is always 0

# an estimator whose gradient is exactly 0 in every batch (it keeps tokens, but only ones with zero advantage)
silent = (summary["is_masked"] <= 0.99) & (summary["variance"] == 0) & (summary["relative_bias"] > 1 - 1e-9)
# bias vs variance, the page's point: whose error is mostly bias (more batches do not help), whose is variance
bias_excess = (summary["bias2"] - summary["noise_floor"]).clip(lower=0)  # bias² less what noise alone shows
biased = summary[(bias_excess > summary["variance"]) & ~silent]["estimator"].tolist()
shares = ", ".join(f"{row.estimator} **{b / row.mse:.0%}**" for row, b in zip(summary.itertuples(), bias_excess,
                                                                               strict=True) if row.mse > 0)
st.markdown(f"**Bias or variance?** The share of each estimator's MSE that is bias² (the rest is variance, which "
            f"more rollouts shrink; bias² does not shrink): {shares}.")
cols = st.columns(3)
cols[0].metric("bias² > variance: more rollouts will not fix", ", ".join(biased) if biased else "none",
               help="Estimators whose bias² (less its noise floor) exceeds their variance at this batch size: "
                    "their error is mostly bias, which no batch size removes.")
unbiased = [n for n in summary["estimator"] if resolve(n, configs[n]).unbiased]  # read from each composition
if unbiased:
    si = summary[summary["estimator"] == unbiased[0]].iloc[0]
    cols[1].metric(f"{unbiased[0]} (unbiased): share of its MSE from variance", f"{si['variance'] / si['mse']:.1%}")
worst = summary.loc[summary["relative_bias"].idxmax()]
cols[2].metric("largest relative bias ‖E g − ∇J‖ / ‖∇J‖", f"{worst['estimator']}: {worst['relative_bias']:.0%}")
contrast = lab_data.token_is_contrast(toy_spec)
if contrast is not None:
    st.caption(f"Token IS on this chain, exactly: its mean gradient is **{contrast['threshold']:.1%}** of the true one "
               f"with the threshold reward and **{contrast['additive']:.1%}** with the additive one. It reweights "
               "token t, but the other tokens still come from μ; a threshold makes token t's reward depend on them, "
               "a sum does not: the bias needs a reward that couples tokens.")
elif toy == "tabular" and reward == "additive":
    st.info("Token IS is still biased on this toy with an additive reward: here μ and π differ per state (the "
            "previous token), so the sampler also shifts which states are visited. Token IS corrects each token's "
            "probability given its state, not the distribution of states it reached, unlike on the bit chain, whose "
            "tokens are independent.")

left, right = st.columns(2)
with left:
    chart(charts.error_bars_summary(summary, zero_mse=zero_mse), key="bv.chart.summary")
with right:
    table = summary[["estimator", "bias2", "noise_floor", "variance", "mse", "relative_bias", "is_masked"]].rename(
        columns={"bias2": "bias²", "noise_floor": "noise floor", "mse": "MSE", "relative_bias": "rel. bias",
                 "is_masked": "dropped"})
    # a plain table: its columns take their text's width and its headers wrap, so all seven fit at 900 px (the
    # data grid hid "dropped" behind a scroll)
    st.table(table.style.format({"bias²": "{:.3g}", "noise floor": "{:.2g}", "variance": "{:.3g}",
                                 "MSE": "{:.3g}", "rel. bias": "{:.0%}", "dropped": "{:.0%}"}).hide(axis="index"))
    same = summary.groupby(["bias2", "variance"])["estimator"].apply(list)
    for group in same:
        if len(group) > 1:
            st.caption(f"{' and '.join(group)} give identical gradients here: "
                       f"{group[-1]}'s gate or clip never binds on this toy.")
    for row in summary[summary["is_masked"] > 0.99].itertuples():
        st.warning(f"{row.estimator} drops {row.is_masked:.0%} of the tokens: its estimate is about 0, so its MSE is "
                   f"just ‖∇J‖² = {zero_mse:.3g}, whatever its variance.")
    for row in summary[silent].itertuples():
        st.warning(f"{row.estimator} keeps {1 - row.is_masked:.0%} of the tokens, yet its gradient is exactly 0 in "
                   f"every batch: every rollout it keeps has zero advantage here (on the bit chain, zero reward), so "
                   f"it learns nothing on this toy. A wider band lets the rollouts that carry reward through.")
    st.caption(f"rel. bias = ‖E g − ∇J‖ / ‖∇J‖; dropped: share of tokens whose gradient the estimator drops. "
               f"bias² includes a noise floor of variance / {nb} batches: an unbiased estimator shows about that "
               f"much. Run took {res['seconds']:.2f} s on {mc.device}.")

chart(
    charts.gradient_vectors(info["true"], res["gradients"], exact=res["exact"],
                            labels=info["labels"] if toy == "tabular" else None,
                            x_title="position t (θ_t)" if toy == "bitchain" else
                            "parameter θ[t, previous token, token] (hover for its name)"),
    key="bv.chart.gradients",
)
st.caption("Bands: ±2 s.e. of the mean estimate. Dashed: the estimator's exact expectation where it is known "
           "(pg by Huang's closed form; every estimator by enumeration on small toys); its gap to the black line "
           "is the bias. " + ("On the bit chain every position has the same gradient." if toy == "bitchain" else ""))

# ---- sweeps
st.subheader("Sweep")
chain_sweeps = [s for s in lab_data.CHAIN_SWEEPS if toy == "bitchain" or s != "horizon H"]
options = lab_data.sweepable_knobs(names) + chain_sweeps
default_sweep = DEFAULT_SWEEP if DEFAULT_SWEEP in options else options[0]
with st.form("bv.sweep_form", border=False):
    c1, c2 = st.columns([4, 1], vertical_alignment="bottom")
    with c1:
        target = bound(st.selectbox, "sweep a knob of one estimator, or a property of the toy", "bv.sweep",
                       default_sweep, options=options, valid=one_of(options))
    with c2:
        st.form_submit_button("Run sweep", width="stretch", key="bv_run_sweep")

if target in lab_data.CHAIN_SWEEPS:
    what, values = lab_data.CHAIN_SWEEPS[target]
    with ProgressSlot(f"Sweeping {target}") as progress:
        df = lab_data.chain_sweep(toy_spec, ests, what, values, mc, progress=progress)
    chart(charts.sweep_by_estimator(df, x_title=target, log_x=what == "horizon"), key="bv.chart.sweep")
    st.caption("Each point is a fresh toy (horizon: the threshold scaled with it; lag: μ is π that many updates "
               "stale), every estimator on the same rollouts.")
else:
    name, knob = target.split(" · ")
    values = lab_data.knob_values(name, knob, configs[name])
    with ProgressSlot(f"Sweeping {target}") as progress:
        df = lab_data.knob_sweep(toy_spec, name, configs[name], knob, values, mc, progress=progress)
    field = next(f for f in knobs(ESTIMATORS[name].config) if f.name == knob)
    clip = lab_data.clip_theory(toy_spec, name, configs[name], knob, mc) if lab_data.is_clip(field) else None
    if lab_data.is_clip(field):
        chart(mse_vs_clip(df, knob=knob, estimator=name, theory=clip, reference=summary[["estimator", "mse"]]),
              key="bv.chart.sweep")
    else:
        chart(charts.bias_variance_sweep(df, knob=knob, estimator=name, log_x=bool(field.metadata["log"]),
                                         reference=summary[["estimator", "mse"]]), key="bv.chart.sweep")
    st.caption(f"{name} with {knob} at each value (its other knobs as in the sidebar), on the same rollouts. "
               "Dotted lines: the other estimators' MSE at the sidebar's setting.")
    if clip is not None:
        finite = df[df["value"] < float("inf")]
        best_c, best_mse = finite.loc[finite["mse"].idxmin(), ["value", "mse"]]
        exact = f" (exact: {clip['best']:.3g})" if clip["best"] is not None else ""
        weak = best_mse > 0.7 * zero_mse  # barely better than an estimate that is always 0
        st.caption(f"Lowest simulated MSE at {knob} = **{best_c:g}**{exact}; Li's C* = √(2(1+χ²)) = "
                   f"**{clip['star']:.3g}** with χ² = E_μ[w²] − 1 = {clip['chi2']:.3g}, the whole rollout's "
                   "(not one token's). C* balances bounds, not this toy's exact error, and the best clip moves with "
                   "the batch size: variance falls like 1/B, bias² does not."
                   + (f" Here the best MSE, {best_mse:.3g}, is barely below ‖∇J‖² = {zero_mse:.3g}, the MSE of "
                      "answering 0: at this batch size variance dominates and clipping hard just shrinks the "
                      "gradient." if weak else ""))
        if weak:
            st.button("Open a toy whose best clip is interior (H = 16, k = 11, p = 0.55, q = 0.45)",
                      key="bv_interior", on_click=set_view, args=(lab_data.INTERIOR_VIEW,))

# ---- batch-size frontier
st.subheader("Batch-size frontier")
frontier_batches = lab_data.frontier_batches(nb)
with ProgressSlot("Batch-size frontier") as progress:
    fr = lab_data.frontier(toy_spec, ests, frontier_batches, mc, progress=progress)
chart(charts.batch_size_frontier(fr["points"], fr["lines"], zero_mse=zero_mse), key="bv.chart.frontier")
st.caption(
    f"{frontier_batches} batches of {max(lab_data.FRONTIER_SIZES)} rollouts, regrouped into batches of each size "
    "(points, ±2 s.e.). Lines: MSE(B) = bias² + Var(1)/B through the smallest size, extended. A biased "
    "estimator's MSE levels off at its bias²; an unbiased one keeps falling and wins at large enough batches."
)
