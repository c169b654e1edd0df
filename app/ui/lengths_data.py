"""Length & thresholds' cached bridge: acceptance, KL-cutoff, catastrophic-token and drift panels.

Every function takes small hashable values (floats, band tuples, a seed, a device string) and returns pandas
DataFrames: batches simulated through the estimators (theory.acceptance) next to closed forms (theory.formulas),
labelled the way the charts show them. Caches are bounded (max_entries).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

from seqis import ESTIMATORS
from seqis.theory import acceptance
from seqis.theory import formulas as theory
from seqis.theory.closed_forms import closed_form

LENGTHS = (16, 64, 256, 1024, 4096)  # simulated points
T_GRID = tuple(int(t) for t in np.unique(np.round(np.geomspace(1, 8192, 97))))  # closed-form lines
KL_LENGTHS = (16, 256, 4096)
KL_POINTS = tuple(float(f"{k:.2g}") for k in np.geomspace(1e-4, 0.1, 8))
KL_GRID = tuple(float(k) for k in np.geomspace(5e-5, 0.2, 121))
CATASTROPHIC_LENGTHS = tuple(int(t) for t in np.unique(np.round(np.geomspace(1, 4096, 32))))
DRIFT_LENGTHS = (10, 100, 500, 1000, 2000, 5000)
TABLE_ROLES = ("product", "geo", "traj")  # the bands whose numbers the length table lists


def band_label(lo: float, hi: float) -> str:
    return f"[{lo:g}, {hi:g}]"


def length_labels(geo: tuple[float, float], traj: tuple[float, float], clip: float) -> dict[str, str]:
    """The series of the acceptance-vs-length chart, by role."""
    return {
        "geo": f"geometric band {band_label(*geo)}: seq_mis, geo_mask",
        "product": f"product band {band_label(*geo)}",
        "product_one_sided": f"seq_mis_product: w ≤ {clip:g}",
        "traj": f"mis_po trajectory band {band_label(*traj)}",
    }


def length_series(geo: tuple[float, float], traj: tuple[float, float], clip: float) -> list[tuple]:
    """The estimators the length panel simulates, as (label, name, cfg, moments): `moments` maps the applied
    weight's closed-form moments the moments chart shows (seqis.theory.closed_forms.ClosedForm fields) to their
    labels. Each one's acceptance is charted when its closed form has one (a rollout-level band)."""
    lab = length_labels(geo, traj, clip)
    spec = ESTIMATORS
    return [
        ("seq_tis", "seq_tis", spec["seq_tis"].config(seq_clip=clip),
         {"weight_mean": f"seq_tis mean E[min(w, {clip:g})]", "weight_var": f"seq_tis variance Var[min(w, {clip:g})]"}),
        (lab["geo"], "seq_mis", spec["seq_mis"].config(geo_mask_low=geo[0], geo_mask_high=geo[1]), {}),
        (lab["traj"], "mis_po", spec["mis_po"].config(geo_mask_low=traj[0], geo_mask_high=traj[1]), {}),
        (lab["product_one_sided"], "seq_mis_product", spec["seq_mis_product"].config(seq_clip=clip),
         {"weight_mean": f"seq_mis_product kept mass E[w·1(w ≤ {clip:g})]"}),
    ]


@st.cache_data(max_entries=48, show_spinner="Simulating fixed-length batches…")
def length_panel(s: float, geo: tuple[float, float], traj: tuple[float, float], clip: float,
                 n_rollouts: int, seed: int, device: str) -> dict[str, pd.DataFrame]:
    """Acceptance vs length and truncated-weight moments vs length: closed forms (each estimator's, read from its
    composition by seqis.theory.closed_forms) and simulation. The two-sided product band has no estimator: its closed
    form is theory's and its points count a <= exp(S) <= b on the same rollouts.

    Returns {"acc_theory", "acc_sim", "mom_theory", "mom_sim", "table"}; long DataFrames with columns
    label, T, accepted(_se) (acceptance) or label, T, value(_se) (moments).
    """
    lab = length_labels(geo, traj, clip)
    series = length_series(geo, traj, clip)
    sim = acceptance.length_sweep([e[:3] for e in series], LENGTHS, s, n_rollouts=n_rollouts, seed=seed,
                                  device=device, product_band=geo)
    sim.loc[sim["label"] == "product band", "label"] = lab["product"]

    T, Ts = np.asarray(T_GRID, dtype=float), np.asarray(LENGTHS, dtype=float)
    lines = {label: closed_form(name, cfg, T, s) for label, name, cfg, _ in series}  # at T_GRID
    points = {label: closed_form(name, cfg, Ts, s) for label, name, cfg, _ in series}  # at LENGTHS
    accepting = [label for label, form in lines.items() if form.accepted is not None]
    acc_theory = pd.concat(
        [pd.DataFrame({"label": lab["product"], "T": T, "accepted": theory.product_band_acceptance(T, s, *geo)})]
        + [pd.DataFrame({"label": label, "T": T, "accepted": lines[label].accepted}) for label in accepting],
        ignore_index=True)
    acc_sim = sim[sim["label"].isin([*accepting, lab["product"]])][["label", "T", "accepted", "accepted_se"]]

    moments = [(label, field, text) for label, _, _, shown in series for field, text in shown.items()]
    mom_theory = pd.concat([pd.DataFrame({"label": text, "T": T, "value": getattr(lines[label], field)})
                            for label, field, text in moments], ignore_index=True)
    simulated = {label: sim[sim["label"] == label] for label, *_ in series}
    mom_sim = pd.concat([pd.DataFrame({"label": text, "T": simulated[label]["T"], "value": simulated[label][field],
                                       "se": simulated[label][f"{field}_se"]}) for label, field, text in moments],
                        ignore_index=True)

    # the numbers at the simulated lengths, closed form next to simulation: the product band, then the bands of
    # the estimators whose acceptance is charted
    table = pd.DataFrame({"T": list(LENGTHS)})
    closed = {lab["product"]: theory.product_band_acceptance(Ts, s, *geo),
              **{label: points[label].accepted for label in accepting}}
    for label in (lab[role] for role in TABLE_ROLES):
        pts = acc_sim[acc_sim["label"] == label].set_index("T")["accepted"]
        table[f"{label} (closed form)"] = closed[label]
        table[f"{label} (simulated)"] = [pts.get(t, np.nan) for t in LENGTHS]
    table["untruncated Var(w)"] = theory.seq_weight_variance(Ts, s)
    table["ESS of w"] = theory.ess_seq(Ts, s)
    return dict(acc_theory=acc_theory, acc_sim=acc_sim, mom_theory=mom_theory, mom_sim=mom_sim, table=table)


@st.cache_data(max_entries=16, show_spinner="Simulating MIS-PO's band over KL…")
def kl_panel(traj: tuple[float, float], n_rollouts: int, seed: int, device: str) -> dict[str, pd.DataFrame]:
    """MIS-PO's trajectory band as a per-token KL cutoff: acceptance vs KL = s^2/2 at several lengths.

    Returns {"theory", "sim"} with columns T, kl, accepted(_se), and {"cutoff"}: -log(geo_mask_low).
    """
    cfg = ESTIMATORS["mis_po"].config(geo_mask_low=traj[0], geo_mask_high=traj[1])
    sim = acceptance.kl_sweep([("mis_po", "mis_po", cfg)], KL_LENGTHS, KL_POINTS, n_rollouts=n_rollouts,
                              seed=seed, device=device)
    kl = np.asarray(KL_GRID)
    s = theory.s_from_kl(kl)
    th = pd.concat([pd.DataFrame({"T": T, "kl": kl, "accepted": theory.geo_band_acceptance(T, s, *traj)})
                    for T in KL_LENGTHS], ignore_index=True)
    return dict(theory=th, sim=sim[["T", "kl", "accepted", "accepted_se"]],
                cutoff=float(theory.mis_po_kl_cutoff(*traj)))


def catastrophic_labels(geo, token, traj, clip) -> dict[str, str]:
    """Short row labels (the bands are in the page's caption and the hover)."""
    return {"geo_mask": "geo_mask", "seq_mis": "seq_mis", "mis_po": "mis_po", "max_mask": "max_mask",
            "seq_tis": f"seq_tis (C = {clip:g})"}


@st.cache_data(max_entries=32, show_spinner=False)
def catastrophic_panel(L: float, geo: tuple[float, float], token: tuple[float, float], traj: tuple[float, float],
                       clip: float, device: str) -> dict:
    """One catastrophic token (l = -L or +L) among on-policy tokens, at each length, through the gates.

    Returns {"df": per (estimator, direction, T) rows, "thresholds": direction -> [(text, T*)],
    "table": the coefficient on the catastrophic token at a few lengths}.
    """
    spec = ESTIMATORS
    lab = catastrophic_labels(geo, token, traj, clip)
    ests = [
        (lab["geo_mask"], "geo_mask", spec["geo_mask"].config(geo_mask_low=geo[0], geo_mask_high=geo[1])),
        (lab["seq_mis"], "seq_mis", spec["seq_mis"].config(geo_mask_low=geo[0], geo_mask_high=geo[1])),
        (lab["mis_po"], "mis_po", spec["mis_po"].config(token_mask_low=token[0], token_mask_high=token[1],
                                                         geo_mask_low=traj[0], geo_mask_high=traj[1])),
        (lab["max_mask"], "max_mask", spec["max_mask"].config(token_mask_low=token[0], token_mask_high=token[1])),
        (lab["seq_tis"], "seq_tis", spec["seq_tis"].config(seq_clip=clip)),
    ]
    df = acceptance.catastrophic(ests, CATASTROPHIC_LENGTHS, L, device=device)
    t_geo_down = theory.catastrophic_min_length(L, geo[0])
    t_traj_down = theory.catastrophic_min_length(L, traj[0])
    # an upward token passes an upper bound b iff L / T <= log b: the same formula with 1 / b
    t_geo_up = theory.catastrophic_min_length(L, 1 / geo[1])
    t_traj_up = theory.catastrophic_min_length(L, 1 / traj[1])
    thresholds = {
        "down": [(f"geo T* = {t_geo_down:.3g}", t_geo_down), (f"mis_po traj T* = {t_traj_down:.0f}", t_traj_down)],
        "up": [(f"geo T* = {t_geo_up:.3g}", t_geo_up), (f"mis_po traj T* = {t_traj_up:.0f}", t_traj_up)],
    }
    at = (8, 16, 64, 1024, 4096)
    picked = acceptance.catastrophic(ests, at, L, device=device)
    table = picked.pivot_table(index=["direction", "label"], columns="T", values="weight", sort=False)
    table.columns = [f"T = {T}" for T in table.columns]
    return dict(df=df, thresholds=thresholds, table=table.reset_index())


@st.cache_data(max_entries=32, show_spinner=False)
def drift_panel(r: float, C: float, geo: tuple[float, float], traj: tuple[float, float], device: str) -> dict:
    """Deterministic drift rho_t = r: closed-form w = r^T, the estimators' weights and gates at a few
    lengths, and the length at which w crosses C."""
    spec = ESTIMATORS
    ests = [
        (f"seq_tis (C = {C:g})", "seq_tis", spec["seq_tis"].config(seq_clip=C)),
        (f"seq_mis {band_label(*geo)}", "seq_mis", spec["seq_mis"].config(geo_mask_low=geo[0], geo_mask_high=geo[1])),
        (f"mis_po {band_label(*traj)}", "mis_po", spec["mis_po"].config(geo_mask_low=traj[0], geo_mask_high=traj[1])),
    ]
    sim = acceptance.drift(ests, DRIFT_LENGTHS, r, device=device)
    T = np.asarray(T_GRID + (10_000,), dtype=float)
    curve = pd.DataFrame({"T": T, "w": theory.drift_weight(r, T)})
    table = pd.DataFrame({"T": sim["T"], "r^T (closed form)": theory.drift_weight(r, sim["T"].to_numpy(float)),
                          "w (estimators)": sim["w"], "exp(S/T)": sim["geo"]})
    for label, _, _ in ests:
        table[label] = np.where(sim[f"{label} accepted"], sim[f"{label} weight"], 0.0)
    return dict(curve=curve, points=sim[["T", "w"]], table=table, crossing=float(theory.drift_crossing(r, C)))
