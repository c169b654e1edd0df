"""The numbers of the Lessons page's first screens and of fact (a)'s realistic half, computed by the library.

- Why trainer and sampler disagree, and by how much: the per-token mismatch of the tiny transformer's bf16 (or fp16)
  sampler against its fp32 trainer (`seqis.samplers.tiny_lm`, the shipped batches assets/precision_tiny_lm_bf16
  .parquet and assets/tiny_lm_fp16.parquet: `make_batch("tiny_lm", seed=0[, sampler_dtype="fp16"])`), beside the
  literature's measured per-token KL of real engines, each also as the s of the lessons' noise model (KL = s²/2).
- The estimators' cast: what each correction does to three rollouts (noise, one token L nats low, one token L
  nats high), read from `seqis.run`'s weights, so the card says what the code does.
- Fact (a) at a realistic mismatch: MIS-PO's trajectory band [0.996, 1.001] as a per-token KL cutoff (Length &
  thresholds' own panel).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import streamlit as st
import torch

from seqis import ESTIMATORS, Batch, run
from seqis.io import load_batch
from seqis.io.columns import ASSETS_DIR
from seqis.theory import formulas as theory

from . import lengths_data

# ---- why trainer and sampler disagree
MISMATCH_ASSETS = {"bf16": "precision_tiny_lm_bf16.parquet", "fp16": "tiny_lm_fp16.parquet"}  # the sampler's format
ENGINE_KL = (  # measured per-token KL(mu || pi) of inference engines against their trainers (LITERATURE.md)
    ("H20 GPUs", 5e-4, 1e-3), ("L20 GPUs", 1e-3, 1e-2), ("A100 GPUs", 1e-2, 1.0))
LESSON_S = (0.02, 0.05, 0.1, 1.2)  # the noise levels the later screens offer
KL_BINS = ((0.0, 1e-4, "below 1e-4"), (1e-4, 1e-3, "1e-4 to 1e-3"), (1e-3, 1e-2, "1e-3 to 1e-2"),
           (1e-2, math.inf, "above 1e-2"))  # the prediction's choices, in nats per token


def kl_bin(kl: float) -> str:
    """The KL_BINS label a per-token KL falls in."""
    return next(label for lo, hi, label in KL_BINS if lo <= kl < hi)


@st.cache_data(max_entries=4, show_spinner=False)
def mismatch(dtype: str) -> dict:
    """The shipped tiny-transformer batch whose sampler ran in `dtype`: per-token KL(mu || pi) estimated over its
    loss tokens (sampled from mu) by k3 = mean(rho - 1 - l) (>= 0, low variance) and k1 = mean(-l), the s with
    s²/2 = k3, the standard deviation of l, p50 / p99 of |l|, the loss-token count, and every token's l (for the
    histogram)."""
    batch = load_batch(ASSETS_DIR / MISMATCH_ASSETS[dtype])
    log_ratio = (batch.trainer_logprobs - batch.inference_logprobs)[batch.loss_mask].double()  # (N,) l on loss tokens
    k3 = float(torch.expm1(log_ratio).sub(log_ratio).mean())
    absl = log_ratio.abs()
    return dict(dtype=dtype, tokens=int(log_ratio.numel()), rollouts=int(batch.loss_mask.shape[0]), kl=k3,
                k1=float((-log_ratio).mean()), s=float(theory.s_from_kl(k3)), sd=float(log_ratio.std()),
                p50=float(absl.quantile(0.5)), p99=float(absl.quantile(0.99)), l=log_ratio.numpy())


def engines() -> pd.DataFrame:
    """The literature's engine ranges: rows engine, kl_low, kl_high, s_low, s_high."""
    return pd.DataFrame([dict(engine=e, kl_low=lo, kl_high=hi, s_low=float(theory.s_from_kl(lo)),
                              s_high=float(theory.s_from_kl(hi))) for e, lo, hi in ENGINE_KL])


def lesson_levels() -> pd.DataFrame:
    """The lessons' noise levels as per-token KL: rows s, kl."""
    return pd.DataFrame({"s": LESSON_S, "kl": [float(theory.kl_from_s(s)) for s in LESSON_S]})


# ---- the estimators' cast
CAST_T = 200  # tokens per rollout
CAST_BAD = 50  # the position of the odd token
CAST_L = (3, 10, 30)  # the odd token's |l|
CAST_NOISE = 0.05  # the noisy rollout's s
CAST = (  # label, what it is in one line, (registry name, config)
    ("token IS", "ρ_t on each token", ("token_tis", ESTIMATORS["token_tis"].config(token_clip=math.inf))),
    ("token TIS", "min(ρ_t, 2) on each token", ("token_tis", ESTIMATORS["token_tis"].config())),
    ("sequence IS", "w = Π ρ_t on every token", ("seq_is", ESTIMATORS["seq_is"].config())),
    ("sequence TIS", "min(w, 2)", ("seq_tis", ESTIMATORS["seq_tis"].config())),
    ("sequence MIS", "w, the rollout dropped if w > 2 (Li)",
     ("seq_mis_product", ESTIMATORS["seq_mis_product"].config())),
    ("geometric mask", "weight 1, dropped unless exp(S/T) ∈ [0.5, 2]", ("geo_mask", ESTIMATORS["geo_mask"].config())),
    ("GeoMean IS", "the geometric ratio exp(S/T) as the weight", ("geo_is", ESTIMATORS["geo_is"].config())),
    ("MIS-PO", "ρ_t in [0.5, 2] and exp(S/T) in [0.996, 1.001]", ("mis_po", ESTIMATORS["mis_po"].config())),
    ("veto", "dropped if any ρ_t < 1e-4 (verl)",
     ("max_mask", ESTIMATORS["max_mask"].config(token_mask_low=1e-4, token_mask_high=math.inf))),
)
CAST_ROLLOUTS = ("noise s = 0.05", "one l = −L", "one l = +L")
GEO_CHOICES = ("0: the rollout is dropped", "e^(−L/T) on every token", "e^(−L) on the odd token, 1 on the others",
               "1 on every token")


def cast_batch(L: float) -> Batch:
    """Three CAST_T-token rollouts: l_t ~ N(-s²/2, s²) with s = CAST_NOISE (seed 0); on-policy but one token at
    l = -L; on-policy but one token at l = +L. Advantage 1 each (the weights do not depend on it)."""
    g = torch.Generator().manual_seed(0)
    log_ratio = torch.zeros(3, CAST_T, dtype=torch.float64)  # (3, T)
    log_ratio[0] = -CAST_NOISE**2 / 2 + CAST_NOISE * torch.randn(CAST_T, generator=g, dtype=torch.float64)
    log_ratio[1, CAST_BAD], log_ratio[2, CAST_BAD] = -L, L
    inference = torch.full_like(log_ratio, -1.0)  # (3, T) any log mu: only l = log pi - log mu matters
    return Batch(trainer_logprobs=inference + log_ratio, inference_logprobs=inference,
                 advantages=torch.ones(3, dtype=torch.float64))


def describe(weights: np.ndarray, odd: int | None) -> tuple[str, str, str]:
    """What one rollout's per-token weights amount to, in words and in a card's few characters, and its kind:
    "dropped" (all 0), "as is" (all 1), "scaled" (one value on every token), "odd" (the odd token differs from the
    others, which share a value), "per token" (anything else)."""
    w = np.asarray(weights, dtype=float)
    if np.all(w == 0):
        return "dropped", "0", "dropped"
    if np.allclose(w, w[0], rtol=1e-9, atol=0):
        if abs(w[0] - 1) < 1e-9:
            return "1 on every token", "1", "as is"
        return f"{w[0]:.3g} on every token", f"{w[0]:.3g}", "scaled"
    if odd is not None:
        rest = np.delete(w, odd)
        if np.allclose(rest, rest[0], rtol=1e-9, atol=0):
            return f"odd token {w[odd]:.2g}, others {rest[0]:.3g}", f"{w[odd]:.2g} | {rest[0]:.3g}", "odd"
    return f"{w.min():.2f} to {w.max():.2f} by token", f"{w.min():.2f}–{w.max():.2f}", "per token"


@st.cache_data(max_entries=8, show_spinner=False)
def cast(L: float) -> dict:
    """Every cast member on cast_batch(L): {"cells": rows estimator, what, rollout, text, short, kind; "geo": the
    GeoMean IS weight on the low rollout in GEO_CHOICES' words (classified from the weights), "geo_text" and
    "mask_text": GeoMean IS's and the geometric mask's on it in words, "ratio": the low rollout's exp(S/T)}."""
    batch = cast_batch(float(L))
    rows = []
    for label, what, (name, cfg) in CAST:
        weights = run(name, batch, cfg).weights.detach().numpy()  # (3, T)
        for r, rollout in enumerate(CAST_ROLLOUTS):
            text, short, kind = describe(weights[r], None if r == 0 else CAST_BAD)
            rows.append(dict(estimator=label, what=what, rollout=rollout.replace("L", f"{L:g}"), text=text,
                             short=short, kind=kind, row=r))
    cells = pd.DataFrame(rows)
    low = cells[cells["row"] == 1].set_index("estimator")
    kind = {"dropped": 0, "scaled": 1, "odd": 2, "as is": 3}.get(low.loc["GeoMean IS", "kind"])
    return dict(cells=cells, geo=GEO_CHOICES[kind] if kind is not None else low.loc["GeoMean IS", "text"],
                geo_text=low.loc["GeoMean IS", "text"], mask_text=low.loc["geometric mask", "text"],
                ratio=math.exp(-float(L) / CAST_T))


# ---- fact (a) at a realistic mismatch: MIS-PO's band
REAL_KL = (1e-4, 1e-3, 4e-3, 1e-2)  # per-token KL offered: the engines' range, MIS-PO's cutoff 0.004 inside it
REAL_T = 4096  # the length the question asks about
REAL_SHOWN = (16, 256)  # the lengths drawn before the reveal
MIS_PO_TRAJ = (0.996, 1.001)
KL_ROLLOUTS = 250  # Length & thresholds' KL panel at its first view (1,000 rollouts per point, a quarter of them)
LT_S = (0.01, 0.02, 0.04, 0.05, 0.08, 0.1, 0.15)  # some of Length & thresholds' s options: Go deeper picks the nearest


def lt_s(kl: float) -> float:
    """The Length & thresholds s (one it offers) nearest to the s of this per-token KL."""
    s = float(theory.s_from_kl(kl))
    return min(LT_S, key=lambda v: abs(v - s))


KEEP_BINS = ("most of them (over 80%)", "about half", "almost none (under 20%)")


def keep_bin(share: float) -> str:
    return KEEP_BINS[0] if share > 0.8 else KEEP_BINS[2] if share < 0.2 else KEEP_BINS[1]


def realistic(kl: float, device: str) -> dict:
    """MIS-PO's trajectory band against the per-token KL (Length & thresholds' KL panel at its defaults): {"theory",
    "sim" (rows T, kl, accepted(_se)), "cutoff" (-log 0.996), "kl", "keep": {T: closed-form share kept at this KL},
    "keep_sim": the simulated share at REAL_T and the KL point nearest kl (its kl and its s.e.)}."""
    panel = lengths_data.kl_panel(MIS_PO_TRAJ, KL_ROLLOUTS, 0, device)
    s = float(theory.s_from_kl(kl))
    keep = {T: float(theory.geo_band_acceptance(T, s, *MIS_PO_TRAJ)) for T in lengths_data.KL_LENGTHS}
    sim = panel["sim"][panel["sim"]["T"] == REAL_T]
    near = sim.iloc[int(np.argmin(np.abs(np.log(sim["kl"].to_numpy()) - math.log(kl))))]
    return dict(theory=panel["theory"], sim=panel["sim"], cutoff=panel["cutoff"], kl=kl, s=s, keep=keep,
                keep_sim=(float(near["kl"]), float(near["accepted"]), float(near["accepted_se"])))

