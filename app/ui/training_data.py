"""Cached bridge for the Training page: a frozen description of a run in, plain data out.

`TrainSpec` holds everything that defines a training run as small hashable values; `run_training(spec)`
trains it (seqis.lab.train) once per spec, held in the lab's LRU (`memo`) so a page passes its progress bar
on a miss and gets the stored result at once on a hit, and returns DataFrames of the curves (mean and band
over seeds per estimator and update), never tensors. `run_sweep` does the same for Huang's three sweeps.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from seqis import ESTIMATORS, PRESETS, lab
from seqis.lab import huang2026, train_sweeps
from seqis.registry import needs_head

from .runtime.memo import memo, memo_has

FAULTS = ("none", "fp16", "bf16", "fp8", "top-p")


def catalog() -> dict[str, object]:
    """label -> what train() takes: Huang's labels, then the registry's estimators (defaults), then presets (those
    that read the sampler's head left out: the toys' training batches carry none)."""
    return {**huang2026.ESTIMATOR_OF, **{name: name for name in ESTIMATORS},
            **{key: key for key in PRESETS if not needs_head(key)}}


@dataclass(frozen=True)
class TrainSpec:
    """A training run. toy "bitchain": H bits, reward 1[sum >= ceil(threshold_frac H)], theta0 = logit(p0);
    toy "tabular": TabularAR(vocab, tab_horizon, seed=toy_seed, reward). fault: "none", a precision preset
    or "top-p" (with top_p)."""

    toy: str = "bitchain"
    horizon: int = 256
    threshold_frac: float = 0.6
    p0: float = 0.5
    vocab: int = 3
    tab_horizon: int = 4
    toy_seed: int = 0
    reward: str = "random"
    estimators: tuple[str, ...] = ("Sequence IS", "Token IS", "GeoMean IS", "Sequence TIS 0-2")
    lag: int = 50
    batch_size: int = 128
    steps: int = 300
    lr: float = 3.0
    seeds: int = 3
    fault: str = "none"
    optimizer: str = "sgd"
    baseline: bool = False
    top_p: float = 0.95
    device: str = "cpu"

    def chain(self):
        if self.toy == "tabular":
            return lab.TabularAR(self.vocab, self.tab_horizon, seed=self.toy_seed, reward=self.reward)
        H = int(self.horizon)
        return lab.BitChain(H, math.ceil(self.threshold_frac * H), self.p0, self.p0)

    def sampler_fault(self) -> lab.SamplerFault | None:
        if self.fault == "none":
            return None
        if self.fault == "top-p":
            return lab.SamplerFault(top_p=self.top_p)
        return lab.SamplerFault(precision=self.fault)

    def work(self) -> float:
        """Token-updates of the run (rollout tokens drawn over all runs and updates): its cost, roughly."""
        T = self.horizon if self.toy == "bitchain" else self.tab_horizon
        return float(self.steps) * len(self.estimators) * self.seeds * self.batch_size * T

    def settings(self) -> dict:
        return asdict(self)


def _band(values: np.ndarray, labels, what: str) -> pd.DataFrame:
    """(E, S, n) -> long frame: estimator, update, mean, low, high (min and max over seeds)."""
    frames = []
    steps = np.arange(values.shape[-1])
    with warnings.catch_warnings():  # an update no seed has a value for (NaN) stays NaN, silently
        warnings.simplefilter("ignore", RuntimeWarning)
        for i, label in enumerate(labels):
            v = values[i]
            frames.append(pd.DataFrame({"estimator": label, "update": steps, "mean": np.nanmean(v, 0),
                                        "low": np.nanmin(v, 0), "high": np.nanmax(v, 0), "what": what}))
    return pd.concat(frames, ignore_index=True).dropna(subset=["mean"])


def _train(spec: TrainSpec, progress=None) -> dict:
    names = catalog()
    res = lab.train(spec.chain(), [names[label] for label in spec.estimators], steps=spec.steps, lr=spec.lr,
                    lag=spec.lag, batch_size=spec.batch_size, seeds=spec.seeds, device=spec.device,
                    fault=spec.sampler_fault(), optimizer=spec.optimizer, baseline=spec.baseline,
                    progress=progress)
    labels = list(spec.estimators)
    final = pd.DataFrame({"estimator": labels, "final J (mean)": res.final.mean(1),
                          "min over seeds": res.final.min(1), "max over seeds": res.final.max(1),
                          "largest ‖g‖": np.nanmax(res.grad_norm, axis=(1, 2), initial=0.0),
                          "mean kept": np.nanmean(res.kept, axis=(1, 2)) if spec.steps else 1.0,
                          "mean cos(g, ∇J)": np.nanmean(res.cosine, axis=(1, 2)) if spec.steps else 1.0})
    return {
        "J": _band(res.J, labels, "J"),
        # an update with no successful rollout has g = 0 exactly: left out of the log-scale panel
        "grad_norm": _band(np.where(res.grad_norm > 0, res.grad_norm, np.nan), labels, "‖g‖"),
        "kept": _band(res.kept, labels, "kept fraction"),
        "cosine": _band(res.cosine, labels, "cos(g, ∇J)"),
        "final": final,
        "J0": float(res.J[0, 0, 0]),
        "seconds": res.seconds,
        "stopped": res.stopped,
        "repr": repr(spec.chain()),
    }


def run_training(spec: TrainSpec, progress=None) -> dict:
    """The run's curves, memoised by spec. A Stop click interrupts the run (Streamlit stops the script at
    its next progress call), so only finished runs are kept."""
    return memo(("train", spec), lambda: _train(spec, progress))


def has_run(spec: TrainSpec) -> bool:
    return memo_has(("train", spec))


SWEEPS = train_sweeps.CPU_SCALE


def has_sweep(what: str, device: str) -> bool:
    return memo_has(("train-sweep", what, device))


def published(what: str) -> dict:
    """Huang's points of one sweep, and an empty frame where ours will go: {"ours", "published", "settings"}."""
    settings = train_sweeps.CPU_SCALE[what]
    pub = huang2026.frame()
    pub = pub[(pub["figure"] == what) & pub["estimator"].isin(settings.estimators)]
    if what == "lag":  # figure 1 has every batch size: show the largest, as the post does
        pub = pub[pub["batch_size"] == max(huang2026.BATCHES)]
    x = {"horizon": "horizon", "lag": "lag", "batch": "batch_size"}[what]
    ours = pd.DataFrame(columns=["x", "estimator", "mean", "sem", "low", "high"])
    return {"ours": ours, "published": pub.rename(columns={x: "x"}), "settings": settings}


def run_sweep(what: str, device: str, progress=None) -> dict:
    """One of Huang's sweeps at CPU scale (seqis.lab.train_sweeps.CPU_SCALE), memoised by (what, device):
    `published(what)` with "ours" filled in: summary rows (x, estimator, mean, sem, low, high)."""

    def compute():
        panel = published(what)
        df = train_sweeps.sweep(what, panel["settings"], device=device, progress=progress)
        return {**panel, "ours": train_sweeps.summary(df)}

    return memo(("train-sweep", what, device), compute)
