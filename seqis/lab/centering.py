"""Score centering on the bit chain, exactly: the drift a constant reward leaves, and training along exact gradients.

Marek & Ryabinin (arXiv 2609.20807) say the instability under a mismatched sampler is mainly drift: the
sampler-expected score E_{v~q}[grad log p_v] is not 0 under the trainer, so plain REINFORCE moves the policy even when
the reward says nothing, and score centering (SC) subtracts it over the sampler's head. On a bit chain the vocabulary
is two tokens, so the head is the whole vocabulary, the tail is empty and SC is exact (seqis.lab.chain.binary_head);
every expectation below is exact (a sum over the H + 1 counts, seqis.lab.mean_field), not Monte Carlo.

One position, trainer p = P(1), sampler q, token rule f (1, min(x, C), ...), constant reward r, per-token weight
f(rho_a) on the sampled bit a (seq-mean-token-sum). d log p_a / d theta = a - p, so

    drift_f     = r E_{a~q}[f(p_a / q_a) (a - p)] = r [q f(p / q) (1 - p) - (1 - q) f((1 - p) / (1 - q)) p]
    plain (f=1) = r (q - p)                       token IS (f = x): 0        token TIS: 0 unless the cap bites
    SC          = the same minus r E_{v~q}[f(rho_v) (v - p)] = 0 for every f (alpha p_v adds sum p_v (v - p) = 0)

With a reward that couples the tokens, SC + f=1 follows E_mu[A (a_t - q_t)] = Cov_mu(A, a_t): the sampler's own
policy gradient (in the trainer's parametrisation); it removes the drift term E_mu[A] (q - p), not the bias from the
other tokens being drawn from mu (Huang's token-IS bias, which SC leaves as it is).

    sc_drift(p=0.3, q=[0.4, 0.6])                # DataFrame: correction, p, q, drift (exact, per position)
    drift_path(p0=0.5, logit_bias=-1.0)          # DataFrame: correction, step, p (constant reward, exact)
    sc_training()                                # DataFrame: each setting x correction, J along the way
    CORRECTIONS                                  # the four corrections the issue names (+ sequence IS)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..core.compose import Centering, Composition, Weight
from .chain import BitChain
from .mean_field import expected_gradient_counts, train_expected
from .policies import SamplerFault
from .train import _pairs

# verl's names where it ships them: bypass_pg (none), ... token_tis (C = 2), bypass_pg_sc, bypass_pg_token_tis_sc
CORRECTIONS: dict[str, object] = {
    "none": Composition(Weight("none")),
    "token TIS": Composition(Weight("token", clip=2.0)),
    "SC": Composition(Weight("none"), centering=Centering("none")),
    "SC + TIS": Composition(Weight("token", clip=2.0), centering=Centering("truncate", high=2.0)),
}
REFERENCE = {"sequence IS": "seq_is"}  # unbiased at every lag and bias: the yardstick


def _named(corrections) -> dict[str, object]:
    if corrections is None:
        return dict(CORRECTIONS)
    if isinstance(corrections, Mapping):
        return dict(corrections)
    return {str(c) if isinstance(c, str) else c.describe(): c for c in corrections}


def sc_drift(corrections=None, *, p=0.5, q=0.5, horizon: int = 1, reward: float = 1.0):
    """The exact expected gradient (per position, in the logit) of each correction under a constant reward, trainer
    p = P(1) and sampler q on a bit chain of `horizon` bits: "with a constant reward, should the policy move?" (it
    should not). p and q: numbers or arrays, broadcast together. corrections: names, compositions, or a {label:
    correction} dict (default CORRECTIONS). Returns a DataFrame: correction, p, q, drift."""
    import pandas as pd

    named = _named(corrections)
    pp, qq = np.broadcast_arrays(np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64))
    pp, qq = pp.ravel(), qq.ravel()
    if not (((pp > 0) & (pp < 1)).all() and ((qq > 0) & (qq < 1)).all()):
        raise ValueError(f"p and q must lie strictly between 0 and 1, got p={p}, q={q}")
    if int(horizon) < 1 or not math.isfinite(reward):
        raise ValueError(f"need horizon >= 1 and a finite reward, got horizon={horizon}, reward={reward}")
    pairs = _pairs(list(named.values()))
    n, E = len(pp), len(pairs)
    theta = torch.logit(torch.as_tensor(pp)).repeat(E)  # (E n,) estimator-major
    theta_mu = torch.logit(torch.as_tensor(qq)).repeat(E)
    g, _ = expected_gradient_counts(pairs, theta, theta_mu, torch.full((int(horizon) + 1,), float(reward),
                                                                       dtype=torch.float64), n)
    g = g.view(E, n).numpy()
    return pd.DataFrame([{"correction": label, "p": float(pp[j]), "q": float(qq[j]), "drift": float(g[i, j])}
                         for i, label in enumerate(named) for j in range(n)])


def drift_path(corrections=None, *, p0: float = 0.5, logit_bias: float = -1.0, steps: int = 100, lr: float = 1.0,
               reward: float = 1.0):
    """The policy under a constant reward, update by update: one bit from P(1) = p0, the sampler's logit the policy's
    plus `logit_bias`, plain SGD along each correction's exact expected gradient (sc_drift at every step). Returns a
    DataFrame: correction, step (updates made: 0 .. steps), p. Plain REINFORCE walks towards the sampler's side for
    ever (logit_{s+1} = logit_s + lr r (sigmoid(logit_s + b) - sigmoid(logit_s))); score centering stays at p0."""
    import pandas as pd

    named = _named(corrections)
    if not 0 < p0 < 1 or int(steps) < 0 or not (math.isfinite(lr) and math.isfinite(logit_bias)):
        raise ValueError(f"need 0 < p0 < 1, steps >= 0, finite lr and logit_bias; got p0={p0}, steps={steps}, "
                         f"lr={lr}, logit_bias={logit_bias}")
    pairs = _pairs(list(named.values()))
    theta = torch.full((len(pairs),), math.log(p0 / (1 - p0)), dtype=torch.float64)
    constant = torch.full((2,), float(reward), dtype=torch.float64)
    path = [torch.sigmoid(theta)]
    for _ in range(int(steps)):
        g, _ = expected_gradient_counts(pairs, theta, theta + logit_bias, constant, 1)
        theta = theta + lr * g
        path.append(torch.sigmoid(theta))
    P = torch.stack(path, 1).numpy()  # (E, steps + 1)
    return pd.DataFrame([{"correction": label, "step": s, "p": float(P[i, s])}
                         for i, label in enumerate(named) for s in range(P.shape[1])])


@dataclass(frozen=True)
class Setting:
    """One sampler the corrections train under: `lag` updates stale, its logit of a one shifted by `logit_bias`."""

    name: str
    lag: int = 0
    logit_bias: float = 0.0


# the docs' settings (docs/score-centering.md): a biased engine against the reward and towards it, one so biased
# that the sampler almost never reaches the reward, lag alone, and lag on top of the bias
SETTINGS = (Setting("biased sampler (b = -0.5)", 0, -0.5), Setting("biased towards the reward (b = +0.5)", 0, 0.5),
            Setting("strongly biased sampler (b = -1)", 0, -1.0), Setting("lag 50", 50, 0.0),
            Setting("lag 50, b = -0.5", 50, -0.5))
CHAIN = dict(horizon=32, threshold=21, p=0.5)  # Huang's k / H = 84 / 128 at a quarter of the length


def sc_training(settings: Sequence[Setting] = SETTINGS, corrections=None, *, chain: BitChain | None = None,
                steps: int = 300, lr: float = 10.0, marks: Sequence[int] = (50, 100)):
    """Train along each correction's exact expected gradient (seqis.lab.train_expected) under each setting's sampler
    and return a DataFrame: setting, correction, J after each update in `marks` and the last, and the first update
    at which J reaches 0.5 and 0.9 (None: never). corrections default: CORRECTIONS and sequence IS."""
    import pandas as pd

    chain = chain or BitChain(CHAIN["horizon"], CHAIN["threshold"], CHAIN["p"], CHAIN["p"])
    named = _named(corrections) if corrections is not None else {**CORRECTIONS, **REFERENCE}
    rows = []
    for setting in settings:
        fault = SamplerFault(logit_bias=setting.logit_bias)
        (res,) = train_expected(chain, list(named.values()), steps=steps, lr=lr, lags=[setting.lag], fault=fault)
        for i, label in enumerate(named):
            J = res.J[i, 0]
            row = {"setting": setting.name, "correction": label}
            row.update({f"J@{m}": float(J[m]) for m in marks if m <= steps})
            row[f"J@{steps}"] = float(J[steps])
            for level in (0.5, 0.9):
                hit = np.flatnonzero(J >= level)
                row[f"first J>={level}"] = int(hit[0]) if len(hit) else None
            rows.append(row)
    return pd.DataFrame(rows)


__all__ = ["CORRECTIONS", "REFERENCE", "SETTINGS", "Setting", "drift_path", "sc_drift", "sc_training"]
