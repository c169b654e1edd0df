"""Bias & variance's cached bridge: the lab's Monte Carlo keyed on frozen descriptions of the toy and the run.

`ToySpec` and `MCSpec` are small frozen dataclasses; `compare`, `knob_sweep`, `chain_sweep` and `frontier`
return DataFrames through `memo` (ui/runtime/memo.py), so a run shows a progress bar once and is instant after.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
import streamlit as st
import torch

from seqis import ESTIMATORS, Config, knobs, lab
from seqis.registry import resolve
from seqis.theory import formulas as theory

from .runtime.memo import memo


@dataclass(frozen=True)
class ToySpec:
    """Everything that defines a toy chain, as small hashable values.

    toy "bitchain": horizon H, threshold k, p, and the sampler: q, or (lag K > 0) pi K updates stale with
    step lr; bit_reward "threshold" (1[sum >= k]) or "additive" (the sum of the bits). toy "tabular": vocab V,
    horizon T, mismatch (per-state logit noise), toy_seed, reward.
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
    bit_reward: str = "threshold"

    def chain(self):
        if self.toy == "bitchain":
            if self.lag > 0:
                return lab.BitChain.lagged(self.horizon, self.threshold, self.p, self.lag, lr=self.lr,
                                           reward=self.bit_reward)
            return lab.BitChain(self.horizon, self.threshold, self.p, self.q, reward=self.bit_reward)
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
                dim=chain.dim, labels=chain.param_labels(), seq_chi2=chain.seq_chi2())


def token_is_contrast(toy: ToySpec) -> dict[str, float] | None:
    """On a bit chain: token IS's exact mean over the true gradient under each reward (theory's closed forms),
    the contrast that explains its bias: {"threshold": 0.567, "additive": 1.0} on Huang's chain. None for
    another toy."""
    if toy.toy != "bitchain":
        return None
    chain = toy.chain()
    p, q = float(chain.p[0]), float(chain.q[0])
    H, k = toy.horizon, toy.threshold
    return {r: theory.bitchain_token_is_mean(H, k, p, q, r) / theory.bitchain_true_gradient(H, k, p, r)
            for r in theory.REWARDS}


def _exact_means(toy: ToySpec, ests: Estimators) -> dict[str, list[float]]:
    """Exact expectations of the single-rollout estimates, where they are cheap: by enumeration (tabular
    toys, bit chains with H <= 12), else the bit chain's closed forms for what a composition reduces to: no
    weight (naive PG), an untruncated sequence weight (unbiased), a token weight whose clip never binds."""
    chain = toy.chain()
    out = {}
    if toy.toy == "tabular" or toy.horizon <= 12:
        for name, cfg in ests:
            out[name] = lab.expected_gradient(chain, name, cfg).tolist()
        return out
    H, k = toy.horizon, toy.threshold
    p, q = float(chain.p[0]), float(chain.q[0])
    max_ratio = max(p / q, (1 - p) / (1 - q))  # the largest token ratio rho_t the chain can produce
    for name, cfg in ests:  # read from each estimator's composition, never its name
        comp = resolve(name, cfg)
        w = comp.weight
        if not comp.plain or w.band is not None or w.self_normalize or w.clip_low:
            continue
        if w.level == "sequence" and w.upper == math.inf:  # untruncated sequence IS: unbiased
            out[name] = chain.true_gradient().tolist()
        elif w.level == "none":  # no correction: naive PG on the sampler's tokens
            out[name] = [theory.bitchain_naive_pg_mean(H, k, p, q, toy.bit_reward)] * H
        elif w.level == "token" and w.upper >= max_ratio:  # a token clip that never binds: plain token IS
            out[name] = [theory.bitchain_token_is_mean(H, k, p, q, toy.bit_reward)] * H
    return out


def compare(toy: ToySpec, ests: Estimators, mc: MCSpec, progress=None) -> dict:
    """Every estimator on the same rollouts (common random numbers). Returns {"summary": one row per
    estimator, "gradients": name -> (mean, stderr), "exact": name -> exact expectation where known, "batches":
    name -> (n_batches, D) every batch's gradient where the lab kept them}."""

    def compute():
        results = lab.monte_carlo_many(toy.chain(), list(ests), progress=progress, **mc.kwargs())
        summary = pd.DataFrame([r.record() for r in results])
        summary = summary.rename(columns={"stderr_bias2": "bias2_se", "stderr_variance": "variance_se",
                                          "stderr_mse": "mse_se"})
        grads = {r.estimator: (r.mean.tolist(), r.stderr.tolist()) for r in results}
        batches = {r.estimator: r.grads.numpy() for r in results if r.grads is not None}  # (n_batches, D) each
        return dict(summary=summary, gradients=grads, exact=_exact_means(toy, ests), batches=batches,
                    seconds=max(r.seconds for r in results))

    return memo(("compare", toy, ests, mc), compute)


def is_clip(field) -> bool:
    """A truncation knob (a clip C > 0 that may be switched off with inf), as the widgets read it."""
    return "clip" in field.name and field.metadata["gt"] is not None


def clip_grid(lo: float, hi: float) -> list[float]:
    """A clip sweep fine enough to find the best clip: steps of lo / 4 from lo / 4 to 4 lo (a seq_clip from 1:
    0.25, 0.5, ..., 4), then 1-1.5-2-3-5-7 per decade up to hi."""
    fine = [lo / 4 * i for i in range(1, 17)]
    coarse = [m * 10**k for k in range(-3, 6) for m in (1, 1.5, 2, 3, 5, 7) if 4 * lo < m * 10**k <= hi]
    return [float(f"{v:.3g}") for v in fine + coarse]


def knob_values(name: str, knob: str, base: Config | None = None, n: int = 7) -> tuple[float, ...]:
    """Values to sweep a knob over: n (log-)spaced points on its slider range and its default, or for a clip
    the fine `clip_grid` (down to a quarter of the slider's low end, where a best clip may sit) and +inf;
    values the config refuses with the other knobs of `base` (a band edge past the other edge) are left out."""
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
    if is_clip(f) and lo > 0:
        values = set(clip_grid(lo, hi))
    else:
        values = {float(f"{v:.3g}") for v in pts if all(abs(scale(v) - scale(a)) >= gap for a in anchors)}
    values.update(anchors)
    if is_clip(f):
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
    """"name · knob" for every numeric knob of these estimators (advanced ones left out: adv_tau only rescales)."""
    out = []
    for name in names:
        for f in knobs(ESTIMATORS[name].config):
            if not f.metadata.get("advanced") and f.metadata["choices"] is None and f.metadata["ui"] is not None:
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


def drives_sequence_clip(name: str, cfg: Config, knob: str) -> bool:
    """Whether `knob` is the clip C of a sequence-level truncated weight min(w, C) (read from the composition at
    two values of the knob, never from the estimator's name): where Li's C* = sqrt(2 (1 + chi2)) applies."""
    try:
        a, b = (resolve(name, cfg.replace(**{knob: v})).weight for v in (2.0, 3.0))
    except (ValueError, TypeError):
        return False
    return a.level == "sequence" and a.clip == 2.0 and b.clip == 3.0


CLIP_LINE = tuple(float(c) for c in np.geomspace(0.05, 200, 241))  # the exact curve's clips


@st.cache_data(max_entries=32, show_spinner=False)
def clip_theory(toy: ToySpec, name: str, cfg: Config, knob: str, mc: MCSpec) -> dict | None:
    """What theory says about a sweep of a sequence weight's clip: Li's C* = sqrt(2 (1 + chi2)) with the toy's
    whole-rollout chi2 = E_mu[w^2] - 1 (exact: `chain.seq_chi2()`), and where the composition is nothing but
    min(w, C) on a bit chain whose bits share one p and one q (no baseline), the exact bias², variance and MSE at
    this batch size against C (theory.bitchain_seq_tis_error) and the clip that minimises it. None when the
    knob is not such a clip."""
    if not drives_sequence_clip(name, cfg, knob):
        return None
    chain = toy.chain()
    chi2 = chain.seq_chi2()
    out = dict(chi2=chi2, star=float(theory.seq_tis_best_clip(chi2)) if math.isfinite(chi2) else None,
               exact=None, best=None)
    comp = resolve(name, cfg)
    w = comp.weight
    only_clip = comp.plain and w.band is None and not w.self_normalize and w.clip_low == 0.0  # min(w, C) alone
    uniform = toy.toy == "bitchain" and bool((chain.p == chain.p[0]).all() and (chain.q == chain.q[0]).all())
    if only_clip and uniform and not mc.baseline:
        C = np.asarray(CLIP_LINE)
        p, q = float(chain.p[0]), float(chain.q[0])
        bias2, var = theory.bitchain_seq_tis_error(toy.horizon, toy.threshold, p, q, C, mc.batch_size,
                                                   toy.bit_reward)
        out["exact"] = pd.DataFrame({"value": C, "bias2": bias2, "variance": var, "mse": bias2 + var})
        out["best"] = float(C[np.argmin(bias2 + var)])
    return out


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


# a toy whose sequence-TIS MSE has an interior minimum at the page's batch size: H = 16, k = 11, p = 0.55, q = 0.45,
# B = 128: exact best clip 1.83, Li's C* = 1.94 (chi2 = 0.885, the whole rollout's); MSE 0.0113 there, 0.0172 at
# C = 0.25, 0.0251 unclipped (theory.bitchain_seq_tis_error)
INTERIOR_TOY = ToySpec(horizon=16, threshold=11, p=0.55, q=0.45)
INTERIOR_VIEW = {"bv.toy": "bitchain", "bv.H": 16, "bv.k": 11, "bv.p": 0.55, "bv.q": 0.45, "bv.lag": 0,
                 "bv.bit_reward": "threshold", "bv.B": 128, "bv.sweep": "seq_tis · seq_clip"}

# the page's first view: its default toy and run (ToySpec(), MCSpec()), these estimators at their defaults, this sweep
DEFAULT_ESTIMATORS = ("seq_is", "seq_tis", "token_tis", "pg", "geo_mask")
DEFAULT_SWEEP = "seq_tis · seq_clip"


def frontier_batches(n_batches: int) -> int:
    """Batches of the largest size the frontier draws (fewer than the comparison: each holds 1024 rollouts)."""
    return max(int(n_batches) // 8, 25)


def default_run(device: str) -> None:
    """Compute the page's first view (comparison, default sweep, frontier) into the memo, so that Bias & variance
    opens with it at once; the app runs this in the background once per server."""
    toy, mc = ToySpec(), MCSpec(device=device)
    ests = tuple((n, ESTIMATORS[n].config()) for n in DEFAULT_ESTIMATORS)
    compare(toy, ests, mc)
    name, knob = DEFAULT_SWEEP.split(" · ")
    cfg = dict(ests)[name]
    knob_sweep(toy, name, cfg, knob, knob_values(name, knob, cfg), mc)
    frontier(toy, ests, frontier_batches(mc.n_batches), mc)

