"""Huang's three training sweeps at CPU scale: final J against horizon, lag and batch size.

Each sweep trains every estimator with several seeds (seqis.lab.train) and returns one row per
(estimator, x, seed) with the final exact J. `CPU_SCALE` holds the settings we chose so that the
published orderings show in seconds on a CPU (Huang 2026 ran H up to 1024, lag 500, 7,000 updates and
B up to 4096; `seqis.lab.huang2026` has those numbers). Every value is ours, chosen by a deterministic
(expected-gradient) model of the scalar chain and checked on sampled runs; none was tuned to a seed:

    bit chain, p0 = 0.5 (theta0 = 0), reward 1[sum >= ceil(f H)], plain SGD, A = reward, rollouts float32
    horizon  f = 0.6, H in 32..256, lag 50, lr 3, 300 updates, B = 256, 4 seeds
    lag      f = 0.65, H = 128, lags 0..200, lr 10, 300 updates, B = 512, 3 seeds (one vectorised run)
    batch    f = 0.65, H = 128, lag 50, lr 10, 300 updates, B = 8..512, 3 seeds

(B = 512 in the lag sweep: at B = 128-256 untruncated sequence IS already loses seeds at K = 100, the
small-batch effect the batch sweep shows.)

A fixed fraction f makes a longer chain harder (J0 = P(Bin(H, 1/2) >= f H) falls fast with H), which is what
makes the horizon matter: the lag's shift of the sampler's count, in standard deviations, grows with it.

The small-batch collapse (published: untruncated sequence IS ends at 0.12 / 0.04 at B = 8 / 16, lag 500,
where sequence TIS [0, 2] reaches 0.47 / 0.56). What brings it here, measured with 4 seeds (mean [min, max]
of final J, sequence IS vs sequence TIS [0, 2]; H = 512, k = 282, J0 = 0.012, lag 300, 1,000 updates;
`sweep("batch", COLLAPSE.with_(optimizer=..., lr=..., baseline=...))` reruns a row):

    SGD lr 3, A = reward (our default)   B = 8: 0.92 [0.71, 1.00] vs 0.55   B = 16: 0.76 vs 0.84   B = 64: 0.93 vs 0.95
    Adam lr 0.05, A = reward             B = 8: 0.95 [0.91, 0.97] vs 0.85   B = 16: 0.78 vs 0.67
    SGD lr 3, A = reward - batch mean    B = 8: 0.66 [0.17, 0.85] vs 0.69 (gaps +0.11 / +0.23 / -0.03 / -0.44)
    Adam lr 0.05, A = reward - mean      B = 8: 0.54 [0.10, 0.96] vs 0.68   B = 16: 0.63 [0.25, 0.90] vs 0.85
                                         B = 64: 0.78 [0.38, 0.93] vs 0.98
    the same, 2,000 updates              B = 8: 0.78 [0.12, 1.00] vs 0.97 (one seed stays at 0.12);
                                         B = 16: 0.96 vs 1.00

The baseline is the ingredient: with A = reward >= 0 a huge weight only makes a big step toward a successful
rollout, and untruncated sequence IS stays ahead or the sign of the gap flips between seeds (as at H = 128:
B = 8 gaps -0.12 / +0.02 / -0.12 / +0.16). With A = reward - mean, failed rollouts get negative advantages
and a huge weight on one of them pushes the policy away from it: single seeds collapse (0.17 with SGD).
Adam, whose step ignores ||g|| and keeps the direction in its momentum, makes it systematic: sequence IS
ends below the truncated weight at every small batch, single seeds at 0.10-0.38 and staying there, the
published direction at a smaller depth in 1,000-2,000 updates. At lag 100 the same runs end within 0.03 of
each other (Adam + baseline, B = 16: 0.99 vs 1.00): the lag must be long.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import pandas as pd

from .chain import BitChain
from .huang2026 import ESTIMATOR_OF
from .train import Progress, train, train_lags


@dataclass(frozen=True)
class SweepSettings:
    """One sweep's fixed settings (the swept one is ignored)."""

    threshold_frac: float = 0.6  # f: reward 1[sum of bits >= ceil(f H)]
    p0: float = 0.5  # starting P(bit = 1) of every position (theta0 = logit p0)
    horizon: int = 128
    lag: int = 50
    lr: float = 3.0
    steps: int = 300
    batch_size: int = 256
    seeds: int = 4
    values: tuple = ()  # the swept values
    estimators: tuple[str, ...] = ("Sequence IS", "Token IS", "GeoMean IS")  # labels of ESTIMATOR_OF
    optimizer: str = "sgd"  # "sgd" or "adam" (seqis.lab.train)
    baseline: bool = False  # A = reward - the batch mean

    def chain(self, horizon: int | None = None) -> BitChain:
        H = int(horizon or self.horizon)
        return BitChain(H, math.ceil(self.threshold_frac * H), self.p0, self.p0)

    def with_(self, **kw) -> SweepSettings:
        return replace(self, **kw)


CPU_SCALE = {
    "horizon": SweepSettings(threshold_frac=0.6, lag=50, lr=3.0, steps=300, batch_size=256, values=(32, 64, 128, 256)),
    "lag": SweepSettings(threshold_frac=0.65, horizon=128, lr=10.0, steps=300, batch_size=512, seeds=3,
                         values=(0, 25, 50, 100, 200)),
    "batch": SweepSettings(threshold_frac=0.65, horizon=128, lag=50, lr=10.0, steps=300, seeds=3,
                           values=(8, 32, 128, 512), estimators=("Sequence IS", "Sequence TIS 0-2")),
}


# the small-batch collapse (module docstring): sweep("batch", COLLAPSE) gives its Adam + baseline row
COLLAPSE = SweepSettings(threshold_frac=0.55, horizon=512, lag=300, lr=0.05, steps=1000, seeds=4, values=(8, 16, 64),
                         estimators=("Sequence IS", "Sequence TIS 0-2"), optimizer="adam", baseline=True)


@dataclass
class _Parts:
    """Progress of a sweep made of several train calls."""

    progress: Progress | None
    n: int
    done: list = field(default_factory=lambda: [0])

    def part(self, label: str) -> Progress | None:
        if self.progress is None:
            return None
        i = self.done[0]
        return lambda f, msg: self.progress((i + f) / self.n, f"{label}: {msg}")


def _rows(res, what: str, x, labels: Sequence[str]) -> list[dict]:
    return [{"sweep": what, "x": x, "estimator": label, "seed": seed, "final_J": float(res.final[i, j]),
             "max_grad_norm": float(res.grad_norm[i, j].max(initial=0.0)), "stopped": res.stopped}
            for i, label in enumerate(labels) for j, seed in enumerate(res.seeds)]


def _estimators(settings: SweepSettings):
    return [ESTIMATOR_OF[label] for label in settings.estimators]


def sweep(what: str, settings: SweepSettings | None = None, *, device=None, progress: Progress | None = None,
          should_stop: Callable[[], bool] | None = None) -> pd.DataFrame:
    """Final J per (estimator, x, seed) for what = "horizon", "lag" or "batch" (settings default to
    CPU_SCALE[what]). Columns: sweep, x, estimator, seed, final_J, max_grad_norm, stopped."""
    if what not in CPU_SCALE:
        raise ValueError(f"what must be one of {', '.join(CPU_SCALE)}, got {what!r}")
    s = settings or CPU_SCALE[what]
    kw = dict(steps=s.steps, lr=s.lr, seeds=s.seeds, device=device, should_stop=should_stop, optimizer=s.optimizer,
              baseline=s.baseline)
    labels, ests = list(s.estimators), _estimators(s)
    if what == "lag":  # every lag in one vectorised run
        results = train_lags(s.chain(), ests, list(s.values), batch_size=s.batch_size, progress=progress, **kw)
        return pd.DataFrame([r for k, res in zip(s.values, results, strict=True) for r in _rows(res, what, k, labels)])
    parts, rows = _Parts(progress, len(s.values)), []
    for x in s.values:
        chain = s.chain(x if what == "horizon" else None)
        B = x if what == "batch" else s.batch_size
        res = train(chain, ests, lag=s.lag, batch_size=B, progress=parts.part(f"{what} = {x}"), **kw)
        rows += _rows(res, what, x, labels)
        parts.done[0] += 1
        if res.stopped:
            break
    return pd.DataFrame(rows)


def summary(df: pd.DataFrame) -> pd.DataFrame:
    """Mean, standard error and range of final J over seeds, per (sweep, x, estimator)."""
    g = df.groupby(["sweep", "x", "estimator"], sort=False)["final_J"]
    out = g.agg(mean="mean", sem="sem", low="min", high="max", seeds="count").reset_index()
    return out.fillna({"sem": 0.0})
