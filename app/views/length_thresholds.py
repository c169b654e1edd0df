"""Length & thresholds: what a band or a clip does to rollouts as they grow.

Closed forms (seqis.theory.formulas) are lines, simulated batches run through the estimators (seqis.theory.acceptance)
are points. Sidebar: the noise scale s, the geometric band, MIS-PO's bands and the clip; every widget
is bound to the URL under "lt.".
"""

import streamlit as st
from ui import lab_charts as charts
from ui import lengths_data
from ui.device import device
from ui.presets import arrival
from ui.runtime.chart import chart
from ui.state import bound
from ui.widgets import knob_widgets

from seqis import ESTIMATORS
from seqis.theory import formulas as theory

# up to 1.5: a geometric band [a, b] cuts at the per-token KL -log a, s = sqrt(-2 log a) (Li's [0.5, 2]: 0.69 nats at
# s = 1.18), so the slider reaches past the cutoffs of the bands in use
S_OPTIONS = [0.005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.07, 0.08, 0.1, 0.12, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6,
             0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.3, 1.5]
N_OPTIONS = [250, 500, 1000, 2000, 4000]
L_OPTIONS = [1, 2, 3, 5, 7, 10, 15, 20, 30, 50]
R_OPTIONS = [1.0001, 1.0002, 1.0005, 1.001, 1.002, 1.005, 1.01, 1.02, 1.05]
C_OPTIONS = [1.5, 2.0, 3.0, 5.0, 10.0, 20.0, 100.0]

st.title("Length & thresholds")
st.markdown(
    "Under valid IS noise, every token's log-ratio is l ~ N(−s²/2, s²) (E[ρ] = 1, per-token KL s²/2). "
    "The **product** ratio w = exp(S) spreads like s√T, so any band on it rejects long rollouts; the "
    "**geometric** ratio exp(S/T) concentrates at exp(−s²/2), so a band on it becomes a per-token KL "
    "threshold that gets sharper with length. Lines are closed forms, points are simulated batches run "
    "through the estimators (±2 s.e.)."
)
arrival("lt")

# ---- sidebar: the view's state, bound to the URL
sb = st.sidebar
s = bound(sb.select_slider, "noise scale s", "lt.s", 0.05, options=S_OPTIONS, valid=lambda v: v in S_OPTIONS,
          help="Per-token log-ratio l ~ N(-s²/2, s²): per-token KL(mu||pi) = s²/2, chi² = e^(s²) - 1.")
sb.caption(f"per-token KL = s²/2 = {s * s / 2:.4g} nats")
with sb.expander("Geometric band (seq_mis, geo_mask)", expanded=True):
    geo_cfg, geo_err = knob_widgets(ESTIMATORS["seq_mis"].config, "lt.geo", container=st, exclude=("adv_tau",))
with sb.expander("MIS-PO bands (token, trajectory)", expanded=True):
    mispo_cfg, mispo_err = knob_widgets(ESTIMATORS["mis_po"].config, "lt.mispo", container=st, exclude=("adv_tau",))
with sb.expander("Clip C (seq_tis, seq_mis_product)", expanded=True):
    clip_cfg, clip_err = knob_widgets(ESTIMATORS["seq_tis"].config, "lt.clip", container=st, exclude=("adv_tau",))
with sb.expander("Simulation"):
    n = bound(st.select_slider, "rollouts per point", "lt.n", 1000, options=N_OPTIONS, valid=lambda v: v in N_OPTIONS)
    seed = bound(st.number_input, "seed", "lt.seed", 0, min_value=0, max_value=2**31 - 1, step=1)

errors = [e for e in (geo_err, mispo_err, clip_err) if e]
if errors:
    for e in errors:
        st.error(e)
    st.stop()

geo = (geo_cfg.geo_mask_low, geo_cfg.geo_mask_high)
traj = (mispo_cfg.geo_mask_low, mispo_cfg.geo_mask_high)
token = (mispo_cfg.token_mask_low, mispo_cfg.token_mask_high)
clip = clip_cfg.seq_clip
dev = str(device())

# ---- acceptance vs length
panel = lengths_data.length_panel(s, geo, traj, clip, n, int(seed), dev)
labels = lengths_data.length_labels(geo, traj, clip)
table = panel["table"]
last = table.iloc[-1]
cols = st.columns(4)
cols[0].metric(f"{labels['product']} keeps, T = {int(last['T'])}",
               f"{last[labels['product'] + ' (closed form)']:.1%}",
               help="Closed form; the simulated value is in the table below the chart.")
cols[1].metric(f"geometric band {lengths_data.band_label(*geo)} keeps, T = {int(last['T'])}",
               f"{last[labels['geo'] + ' (closed form)']:.1%}")
first = table.iloc[0]
cols[2].metric(f"mis_po trajectory band keeps, T = {int(first['T'])}",
               f"{first[labels['traj'] + ' (closed form)']:.1%}",
               help="Short rollouts' geometric ratio is noisy: a tight trajectory band rejects them more.")
cols[3].metric(f"ESS of w, T = {int(last['T'])}", f"{last['ESS of w']:.2g}",
               help="Normalised effective sample size of the untruncated sequence weights, e^(-T s²).")

order = [labels[k] for k in ("product", "product_one_sided", "geo", "traj")]
chart(
    charts.acceptance_vs_length(panel["acc_theory"], panel["acc_sim"], order=order,
                                title=f"Acceptance vs length, s = {s:g} (per-token KL {s * s / 2:.2g})"),
    key="lt.chart.acceptance",
)
st.caption(
    "Product bands (two-sided [a, b] on w; seq_mis_product's one-sided w ≤ C) accept fewer rollouts as T "
    "grows. Geometric bands tend to 1 when −s²/2 lies inside (log a, log b), else to 0. "
    "The mis_po trajectory band rejects short rollouts most. seq_mis_product's points are the estimator's "
    "own accepted mask; the two-sided product band has no registry estimator, so its points count "
    "a ≤ exp(S) ≤ b on the same simulated rollouts."
)
geo_cut = float(theory.mis_po_kl_cutoff(geo[0]))  # -log a: the per-token KL past which long rollouts are rejected
s_cut = float(theory.s_from_kl(geo_cut))
st.caption(
    f"The geometric band {lengths_data.band_label(*geo)} cuts at the per-token KL −log {geo[0]:g} = {geo_cut:.3g} "
    f"nats, s = {s_cut:.3g}. "
    + (f"**s = {s:g} is past it** (KL {s * s / 2:.3g}): the geometric band now rejects long rollouts, more the longer "
       "they are." if s * s / 2 > geo_cut else
       f"At s = {s:g} (KL {s * s / 2:.2g}) it keeps long rollouts: raise s past {s_cut:.3g} in the sidebar to see it "
       "cut.")
)
with st.expander("Numbers at the simulated lengths"):
    st.dataframe(table.set_index("T").style.format("{:.4g}"), width="stretch")

# ---- KL cutoff and truncated moments
left, right = st.columns(2)
with left:
    kl = lengths_data.kl_panel(traj, max(n // 4, 100), int(seed), dev)
    chart(
        charts.kl_cutoff(kl["theory"], kl["sim"], cutoff_kl=kl["cutoff"], upper_kl=None, current_kl=s * s / 2,
                         title=f"mis_po trajectory band {lengths_data.band_label(*traj)} as a per-token KL cutoff"),
        key="lt.chart.kl",
    )
    st.caption(
        f"Long rollouts pass iff the per-token KL is below −log {traj[0]:g} = {kl['cutoff']:.4f} nats: "
        "the longer the rollout, the sharper the step. Measured engine mismatch is 5e-4 to 1e-2 per token "
        "(measured engine mismatch, H20 to L20 GPUs), on both sides of MIS-PO's cutoff."
    )
with right:
    chart(
        charts.lines_and_points(panel["mom_theory"], panel["mom_sim"], x="T", y="value", series="label", se="se",
                                colors=dict(zip(panel["mom_theory"]["label"].unique(), charts.MOMENT_COLORS)),
                                title=f"Truncated weights shrink long rollouts (s = {s:g}, C = {clip:g})",
                                x_title="rollout length T", y_title="moment of the applied weight"),
        key="lt.chart.moments",
    )
    st.caption(
        "E[w] = 1 for the untruncated weight at every length, but its variance e^(T s²) − 1 explodes. "
        "Clipping caps the variance and pays in mass: E[min(w, C)] and the kept mass of seq_mis_product fall "
        "towards 0, so truncation quietly shrinks long rollouts' gradients."
    )

# ---- catastrophic tokens
st.subheader("Catastrophic-token dilution")
L = bound(st.select_slider, "catastrophic log-ratio size L", "lt.L", 10, options=L_OPTIONS,
          valid=lambda v: v in L_OPTIONS, help="One token has l = −L (or +L); every other token is on-policy (l = 0).")
cat = lengths_data.catastrophic_panel(float(L), geo, token, traj, clip, dev)
chart(charts.catastrophic_strip(cat["df"], cat["thresholds"], L=float(L)), key="lt.chart.catastrophic")
t_star = cat["thresholds"]["down"][0][1]
st.caption(
    f"One token has l = ∓L, every other token is on-policy, so the rollout's geometric ratio is exp(∓L/T). "
    f"A geometric gate (geo_mask, seq_mis: band {lengths_data.band_label(*geo)}) lets the catastrophic token through "
    f"once T ≥ L / −log {geo[0]:g} = {t_star:.1f} (dashed lines: closed form): long rollouts dilute catastrophes. "
    f"A token band (mis_po: {lengths_data.band_label(*token)}) or a max criterion (max_mask, same band) catches it at "
    f"every length. seq_tis mutes a downward token (weight e^−L) but keeps an upward one at weight C = {clip:g}; "
    "seq_mis, once past its gate, applies the untruncated e^L to it."
)
with st.expander("Gradient coefficient on the catastrophic token"):
    st.dataframe(cat["table"].style.format("{:.3g}", subset=[c for c in cat["table"].columns if c.startswith("T")]),
                 width="stretch", hide_index=True)

# ---- drift
st.subheader("Deterministic drift (Li's table)")
dl, dr = st.columns([1, 1])
with dl:
    r = bound(st.select_slider, "per-token ratio r", "lt.r", 1.001, options=R_OPTIONS,
              valid=lambda v: v in R_OPTIONS,
              help="Every token has rho_t = r. Not a valid IS model: E_mu[rho] = r ≠ 1.")
with dr:
    C_drift = bound(st.select_slider, "clip C for the drift table", "lt.drift_C", 5.0, options=C_OPTIONS,
                    valid=lambda v: v in C_OPTIONS)
d = lengths_data.drift_panel(r, C_drift, geo, traj, dev)
dl, dr = st.columns([3, 2])
with dl:
    chart(charts.drift_curve(d["curve"], d["points"], C=C_drift, crossing=d["crossing"], r=r),
                    key="lt.chart.drift")
with dr:
    st.metric(f"w = r^T crosses C = {C_drift:g} at", f"T = {d['crossing']:.0f}", help="T = log C / log r")
    st.markdown(
        "The product ratio grows without bound while the geometric ratio stays exactly r at every length: a "
        "geometric gate passes every length or none, and seq_tis caps the weight at C past the crossing. "
        "Drift is Li's illustration, not a valid IS model (E_mu[rho] = r ≠ 1)."
    )
st.dataframe(d["table"].style.format("{:.4g}", subset=[c for c in d["table"].columns if c != "T"]),
             width="stretch", hide_index=True)
st.caption("Per length: w = r^T (closed form and as the estimators compute it), the geometric ratio, and each "
           "estimator's applied sequence weight (0: the rollout is dropped).")
