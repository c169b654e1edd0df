"""Cached bridges for the Length & thresholds and Bias & variance pages.

Every function takes small hashable values (floats, names, frozen configs, seeds, a device string) and
returns pandas DataFrames: simulations from seqis.acceptance / seqis.lab next to closed forms from
seqis.theory, labelled the way the charts show them. Caches are bounded (max_entries).

The lab's Monte Carlo runs can take seconds, and st.cache_data cannot drive a progress bar on a miss
while replaying nothing on a hit; they go through `memo`, a small LRU held in st.cache_resource, so a
page passes its st.progress callback on a miss and gets the stored result instantly on a hit.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass

import numpy as np
import pandas as pd
import streamlit as st
import torch

from seqis import ESTIMATORS, Config, acceptance, knobs, lab, theory

# ---------------------------------------------------------------------------------------------------------
# Length & thresholds

LENGTHS = (16, 64, 256, 1024, 4096)  # simulated points
T_GRID = tuple(int(t) for t in np.unique(np.round(np.geomspace(1, 8192, 97))))  # closed-form lines
KL_LENGTHS = (16, 256, 4096)
KL_POINTS = tuple(float(f"{k:.2g}") for k in np.geomspace(1e-4, 0.1, 8))
KL_GRID = tuple(float(k) for k in np.geomspace(5e-5, 0.2, 121))
CATASTROPHIC_LENGTHS = tuple(int(t) for t in np.unique(np.round(np.geomspace(1, 4096, 32))))
DRIFT_LENGTHS = (10, 100, 500, 1000, 2000, 5000)


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


@st.cache_data(max_entries=48, show_spinner="Simulating fixed-length batches…")
def length_panel(s: float, geo: tuple[float, float], traj: tuple[float, float], clip: float,
                 n_rollouts: int, seed: int, device: str) -> dict[str, pd.DataFrame]:
    """Acceptance vs length and truncated-weight moments vs length: closed forms and simulation.

    Returns {"acc_theory", "acc_sim", "mom_theory", "mom_sim", "table"}; long DataFrames with columns
    label, T, accepted(_se) (acceptance) or label, T, value(_se) (moments).
    """
    lab = length_labels(geo, traj, clip)
    spec = ESTIMATORS
    ests = [
        (lab["geo"], "seq_mis", spec["seq_mis"].config(geo_mask_low=geo[0], geo_mask_high=geo[1])),
        (lab["traj"], "mis_po", spec["mis_po"].config(geo_mask_low=traj[0], geo_mask_high=traj[1])),
        (lab["product_one_sided"], "seq_mis_product", spec["seq_mis_product"].config(seq_clip=clip)),
        ("seq_tis", "seq_tis", spec["seq_tis"].config(seq_clip=clip)),
    ]
    sim = acceptance.length_sweep(ests, LENGTHS, s, n_rollouts=n_rollouts, seed=seed, device=device,
                                  product_band=geo)
    sim.loc[sim["label"] == "product band", "label"] = lab["product"]

    T = np.asarray(T_GRID, dtype=float)
    acc_theory = pd.concat([
        pd.DataFrame({"label": lab["geo"], "T": T, "accepted": theory.geo_band_acceptance(T, s, *geo)}),
        pd.DataFrame({"label": lab["product"], "T": T, "accepted": theory.product_band_acceptance(T, s, *geo)}),
        pd.DataFrame({"label": lab["product_one_sided"], "T": T,
                      "accepted": theory.product_band_acceptance(T, s, 0.0, clip)}),
        pd.DataFrame({"label": lab["traj"], "T": T, "accepted": theory.geo_band_acceptance(T, s, *traj)}),
    ], ignore_index=True)
    acc_sim = sim[sim["label"] != "seq_tis"][["label", "T", "accepted", "accepted_se"]]

    tis_mean, tis_var = theory.seq_tis_moments(T, s, clip)
    mom_labels = (f"seq_tis mean E[min(w, {clip:g})]", f"seq_tis variance Var[min(w, {clip:g})]",
                  f"seq_mis_product kept mass E[w·1(w ≤ {clip:g})]")
    mom_theory = pd.concat([
        pd.DataFrame({"label": mom_labels[0], "T": T, "value": tis_mean}),
        pd.DataFrame({"label": mom_labels[1], "T": T, "value": tis_var}),
        pd.DataFrame({"label": mom_labels[2], "T": T, "value": theory.seq_mis_product_mean(T, s, clip)}),
    ], ignore_index=True)
    tis = sim[sim["estimator"] == "seq_tis"]
    prod = sim[sim["estimator"] == "seq_mis_product"]
    mom_sim = pd.concat([
        pd.DataFrame({"label": mom_labels[0], "T": tis["T"], "value": tis["weight_mean"], "se": tis["weight_mean_se"]}),
        pd.DataFrame({"label": mom_labels[1], "T": tis["T"], "value": tis["weight_var"], "se": tis["weight_var_se"]}),
        pd.DataFrame({"label": mom_labels[2], "T": prod["T"], "value": prod["weight_mean"],
                      "se": prod["weight_mean_se"]}),
    ], ignore_index=True)

    # the numbers at the simulated lengths, closed form next to simulation
    Ts = np.asarray(LENGTHS, dtype=float)
    table = pd.DataFrame({"T": list(LENGTHS)})
    for role, fn in (("product", lambda: theory.product_band_acceptance(Ts, s, *geo)),
                     ("geo", lambda: theory.geo_band_acceptance(Ts, s, *geo)),
                     ("traj", lambda: theory.geo_band_acceptance(Ts, s, *traj))):
        pts = acc_sim[acc_sim["label"] == lab[role]].set_index("T")["accepted"]
        table[f"{lab[role]} (closed form)"] = fn()
        table[f"{lab[role]} (simulated)"] = [pts.get(t, np.nan) for t in LENGTHS]
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


# ---------------------------------------------------------------------------------------------------------
# memo: a bounded LRU for long runs that report progress


@st.cache_resource
def _memo_store() -> tuple[OrderedDict, threading.Lock]:
    return OrderedDict(), threading.Lock()


def memo(key: Hashable, compute: Callable[[], object], *, max_entries: int = 32):
    """compute() once per key (held in an LRU of max_entries shared by every session). Treat the result
    as read-only: it is shared."""
    store, lock = _memo_store()
    with lock:
        if key in store:
            store.move_to_end(key)
            return store[key]
    value = compute()
    with lock:
        store[key] = value
        store.move_to_end(key)
        while len(store) > max_entries:
            store.popitem(last=False)
    return value


class ProgressSlot:
    """A progress callback for the lab (fraction, message) that draws an st.progress bar in a placeholder
    on its first call, so a cached result shows no bar; `with` clears it when the run ends."""

    def __init__(self, label: str):
        self.label = label
        self.slot = st.empty()

    def __call__(self, fraction: float, message: str) -> None:
        self.slot.progress(min(max(float(fraction), 0.0), 1.0), text=f"{self.label}: {message}")

    def __enter__(self) -> ProgressSlot:
        return self

    def __exit__(self, *exc) -> None:
        self.slot.empty()


def memo_has(key: Hashable) -> bool:
    store, lock = _memo_store()
    with lock:
        return key in store


# ---------------------------------------------------------------------------------------------------------
# Bias & variance: the lab's Monte Carlo, keyed on a frozen description of the toy


@dataclass(frozen=True)
class ToySpec:
    """Everything that defines a toy chain, as small hashable values.

    toy "bitchain": horizon H, threshold k, p, and the sampler: q, or (lag K > 0) pi K updates stale with
    step lr. toy "tabular": vocab V, horizon T, mismatch (per-state logit noise), toy_seed, reward.
    """

    toy: str = "bitchain"
    horizon: int = 64
    threshold: int = 40
    p: float = 0.6
    q: float = 0.55
    lag: int = 0
    lr: float = 1.0
    vocab: int = 3
    mismatch: float = 0.5
    toy_seed: int = 0
    reward: str = "random"

    def chain(self):
        if self.toy == "bitchain":
            if self.lag > 0:
                return lab.BitChain.lagged(self.horizon, self.threshold, self.p, self.lag, lr=self.lr)
            return lab.BitChain(self.horizon, self.threshold, self.p, self.q)
        if self.toy == "tabular":
            chain = lab.TabularAR(self.vocab, self.horizon, seed=self.toy_seed, mismatch=self.mismatch,
                                  reward=self.reward)
            return chain.with_lag(self.lag, lr=self.lr) if self.lag > 0 else chain
        raise ValueError(f"unknown toy {self.toy!r}")


@dataclass(frozen=True)
class MCSpec:
    """How the Monte Carlo runs: rollouts per batch, batches, seed, GRPO-style baseline, device."""

    batch_size: int = 128
    n_batches: int = 200
    seed: int = 0
    baseline: bool = False
    device: str = "cpu"

    def kwargs(self) -> dict:
        # float32 on CPU runs ~10x faster than float64 and its rounding (~1e-7 relative) sits far below the
        # Monte Carlo noise the charts show; on a GPU float64 costs next to nothing
        dtype = torch.float64 if self.device.startswith("cuda") else torch.float32
        return dict(batch_size=self.batch_size, n_batches=self.n_batches, seed=self.seed, baseline=self.baseline,
                    device=self.device, dtype=dtype)

Estimators = tuple[tuple[str, Config], ...]


@st.cache_resource(max_entries=16)
def chain_info(toy: ToySpec) -> dict:
    """The toy's description, exact gradient and value."""
    chain = toy.chain()
    true = chain.true_gradient()
    return dict(repr=repr(chain), true=true.tolist(), true_norm=float(true.norm()), value=chain.value(),
                dim=chain.dim, labels=chain.param_labels())


def _exact_means(toy: ToySpec, ests: Estimators) -> dict[str, list[float]]:
    """Exact expectations of the single-rollout estimates, where they are cheap: by enumeration (tabular
    toys, bit chains with H <= 12), else the bit chain's closed forms (pg; token_tis when its clip never
    binds; seq_is is unbiased)."""
    chain = toy.chain()
    out = {}
    if toy.toy == "tabular" or toy.horizon <= 12:
        for name, cfg in ests:
            out[name] = lab.expected_gradient(chain, name, cfg).tolist()
        return out
    H, k = toy.horizon, toy.threshold
    p, q = float(chain.p[0]), float(chain.q[0])
    max_ratio = max(p / q, (1 - p) / (1 - q))  # the largest token ratio rho_t the chain can produce
    for name, cfg in ests:
        if name == "seq_is":
            out[name] = chain.true_gradient().tolist()
        elif name == "pg":
            out[name] = [theory.bitchain_naive_pg_mean(H, k, p, q)] * H
        elif name == "token_tis" and cfg.token_clip >= max_ratio:  # the clip never binds: plain token IS
            out[name] = [theory.bitchain_token_is_mean(H, k, p, q)] * H
    return out


def compare(toy: ToySpec, ests: Estimators, mc: MCSpec, progress=None) -> dict:
    """Every estimator on the same rollouts (common random numbers). Returns {"summary": one row per
    estimator, "gradients": name -> (mean, stderr), "exact": name -> exact expectation where known}."""

    def compute():
        results = lab.monte_carlo_many(toy.chain(), list(ests), progress=progress, **mc.kwargs())
        summary = pd.DataFrame([r.record() for r in results])
        summary = summary.rename(columns={"stderr_bias2": "bias2_se", "stderr_variance": "variance_se",
                                          "stderr_mse": "mse_se"})
        grads = {r.estimator: (r.mean.tolist(), r.stderr.tolist()) for r in results}
        return dict(summary=summary, gradients=grads, exact=_exact_means(toy, ests),
                    seconds=max(r.seconds for r in results))

    return memo(("compare", toy, ests, mc), compute)


def knob_values(name: str, knob: str, base: Config | None = None, n: int = 7) -> tuple[float, ...]:
    """Values to sweep a knob over: n (log-)spaced points on its slider range, its default, and +inf for
    clips; values the config refuses with the other knobs of `base` (a band edge past the other edge) are
    left out."""
    spec = ESTIMATORS[name]
    base = base if base is not None else spec.config()
    f = next(f for f in knobs(spec.config) if f.name == knob)
    lo, hi = f.metadata["ui"]
    log = f.metadata["log"] and lo > 0
    pts = np.geomspace(lo, hi, n) if log else np.linspace(lo, hi, n)
    scale = (lambda v: math.log(v)) if log else (lambda v: v)
    gap = 0.4 * (scale(hi) - scale(lo)) / (n - 1)  # a grid point this close to an anchor gives way to it
    anchors = [float(v) for v in (f.default, getattr(base, knob))
               if isinstance(v, (int, float)) and math.isfinite(v) and (v > 0 or not log)]
    values = {float(f"{v:.3g}") for v in pts if all(abs(scale(v) - scale(a)) >= gap for a in anchors)}
    values.update(anchors)
    if "clip" in knob and f.metadata["gt"] is not None:
        values.add(math.inf)
    ok = []
    for v in sorted(values):
        try:
            base.replace(**{knob: v})
        except ValueError:
            continue
        ok.append(v)
    return tuple(ok)


def sweepable_knobs(names) -> list[str]:
    """"name · knob" for every numeric knob of these estimators (adv_tau left out: it only rescales)."""
    out = []
    for name in names:
        for f in knobs(ESTIMATORS[name].config):
            if f.name != "adv_tau" and f.metadata["choices"] is None and f.metadata["ui"] is not None:
                out.append(f"{name} · {f.name}")
    return out


def knob_sweep(toy: ToySpec, name: str, cfg: Config, knob: str, values: tuple[float, ...], mc: MCSpec,
               progress=None) -> pd.DataFrame:
    """bias², variance, MSE of one estimator with `knob` set to each value (its other knobs from cfg), on
    the same rollouts. Columns value, bias2(_se), variance(_se), mse(_se), noise_floor."""

    def compute():
        df = lab.sweep_knob(toy.chain(), name, knob, values, cfg, progress=progress, **mc.kwargs())
        return df.rename(columns={"x": "value", "stderr_bias2": "bias2_se", "stderr_variance": "variance_se",
                                  "stderr_mse": "mse_se"})

    return memo(("knob", toy, name, cfg, knob, values, mc), compute)


CHAIN_SWEEPS = {
    "horizon H": ("horizon", (8, 16, 32, 64, 128)),
    "sampler lag K": ("lag", (0, 2, 4, 8, 12, 16, 24)),
}


def chain_sweep(toy: ToySpec, ests: Estimators, what: str, values: tuple[int, ...], mc: MCSpec, progress=None):
    """Every estimator vs the toy's horizon (bit chain, threshold scaled with it) or its sampler's lag."""

    def compute():
        chain = toy.chain()
        if what == "horizon":
            df = lab.sweep_horizon(chain, list(ests), values, progress=progress, **mc.kwargs())
        else:
            base = ToySpec(**{**toy.__dict__, "lag": 0}).chain()
            df = lab.sweep_lag(base, list(ests), values, lr=toy.lr, progress=progress, **mc.kwargs())
        return df.rename(columns={"x": "value", "stderr_bias2": "bias2_se", "stderr_variance": "variance_se",
                                  "stderr_mse": "mse_se"})

    return memo(("chain", toy, ests, what, values, mc), compute)


FRONTIER_SIZES = (8, 16, 32, 64, 128, 256, 512, 1024)
FRONTIER_LINE = tuple(int(b) for b in np.unique(np.round(np.geomspace(4, 16384, 49))))


def frontier(toy: ToySpec, ests: Estimators, n_batches: int, mc: MCSpec, progress=None) -> dict:
    """MSE vs batch size: simulated points at FRONTIER_SIZES (the rollouts drawn once and regrouped), and
    the line MSE(B) = bias² + Var(1) / B through them, extended to larger batches."""

    def compute():
        kw = {**mc.kwargs(), "n_batches": n_batches}
        kw.pop("batch_size")
        df = lab.sweep_batch_size(toy.chain(), list(ests), FRONTIER_SIZES, **kw)
        df = df.drop(columns=["batch_size"]).rename(columns={"x": "batch_size", "stderr_mse": "mse_se"})
        lines = []
        for name, d in df.groupby("estimator", sort=False):
            b0 = d.sort_values("batch_size").iloc[0]
            unit_var = b0["variance"] * b0["batch_size"]  # Var(1): one rollout's estimate
            B = np.asarray(FRONTIER_LINE, dtype=float)
            lines.append(pd.DataFrame({"estimator": name, "batch_size": B, "mse": b0["bias2"] + unit_var / B}))
        return dict(points=df, lines=pd.concat(lines, ignore_index=True))

    return memo(("frontier", toy, ests, n_batches, mc), compute)
