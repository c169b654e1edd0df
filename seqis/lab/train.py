"""Training dynamics under policy lag: SGD on a toy, each estimator driving the update, exact J every step.

    res = train(BitChain(128, 77, 0.5, 0.5), ["seq_is", "geo_is"], steps=300, lr=0.3, lag=100,
                batch_size=512, seeds=4)
    res.J            # (n_estimators, n_seeds, steps + 1) float64: exact J before each update and after the last

Policy: per-position logits theta, initialised to logit(chain.p) (BitChain; TabularAR: its pi logits);
chain.q is ignored, the sampler is the lagged policy. Reward = the chain's reward, A = reward (no baseline).
Update s (s = 0 .. steps - 1): draw batch_size rollouts from theta_{max(s - lag, 0)} (optionally through a
`SamplerFault`), g = minus the gradient in theta of the estimator's loss (`seqis.run(..., agg=
"seq-mean-token-sum")`, the library's own loss: d loss / d trainer_logprobs by autograd, mapped to theta by
the policy's score), theta <- theta + lr g (plain SGD ascent). `batch_size=None` replaces the sample by every
sequence weighted by its sampler probability: the estimator's exact expected gradient (small toys only).

Vectorised: every (estimator, lag, seed) run is a row of one (R, D) theta; a step draws all rollouts as
(R, B, T) tensors, each estimator sees its runs' rollouts in row blocks of a few Batches (estimators are
per-rollout functions, so each run gets exactly the gradient it would get alone), and the policy maps the
loss gradient to theta for all runs at once. The only Python loops are over steps, estimators and row blocks
(run by run for self-normalised or penalised estimators). J and the exact gradient come from
`seqis.lab.poisson_binomial` (BitChain) or enumeration (TabularAR) every step. Each seed has its own
counter-based random stream (`seqis.lab.streams`), shared by the estimators and lags of that seed (common
random numbers), and no arithmetic on a run's path depends on the runs beside it (`seqis.lab.fixed`), so a
seed reproduces J to the bit alone or in a sweep, whatever the chunking (same machine and torch; horizons up
to 512). Runs are chunked by seeds to fit `memory_budget`.

Our choices (the post, Huang 2026, states none of them): plain SGD, theta0 = logit(p), A = reward, no
normalisation, rollouts in float32 (float64 for batch_size=None), theta and J in float64. Two options probe
what the choice does: optimizer="adam" (per-run Adam: a step of about lr whatever ||g||) and baseline=True
(A = reward - the batch's mean reward, as GRPO without the std).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from ..core.compose import Composition
from ..core.types import Batch, Config
from ..registry import entry, resolve, run
from .chain import binary_head
from .fixed import row_blocks
from .policies import ChainPolicy, SamplerFault, policy_of
from .streams import Streams

AGG = "seq-mean-token-sum"


def _sgd(lr: float):
    return lambda g: lr * g


def _adam(lr: float, betas=(0.9, 0.999), eps=1e-8):
    """Adam per run and parameter (state (R, D), bias-corrected): each step's size is about lr whatever ||g||."""
    state = {"t": 0, "m": 0.0, "v": 0.0}

    def step(g):
        state["t"] += 1
        state["m"] = betas[0] * state["m"] + (1 - betas[0]) * g
        state["v"] = betas[1] * state["v"] + (1 - betas[1]) * g * g
        m_hat = state["m"] / (1 - betas[0] ** state["t"])
        v_hat = state["v"] / (1 - betas[1] ** state["t"])
        return lr * m_hat / (v_hat.sqrt() + eps)

    return step


OPTIMIZERS = {"sgd": _sgd, "adam": _adam}  # name -> (lr -> (g -> the step added to theta))
DEFAULT_BUDGET = {False: 256 << 20, True: 8 << 30}  # bytes of live step tensors: CPU, CUDA
Progress = Callable[[float, str], None]

__all__ = ["train", "train_lags", "TrainResult", "SamplerFault", "label_of"]


@dataclass(eq=False)
class TrainResult:
    """What `train` returns (numpy arrays; axis 0 the estimators, axis 1 the seeds).

    J              (E, S, steps + 1) float64 exact J(theta) before each update and after the last (NaN where a
                   stopped run never got)
    grad_norm      (E, S, steps) ||g_s||, the estimate that drove update s (a collapse shows as a spike)
    true_norm      (E, S, steps) ||dJ/dtheta|| at theta_s;  cosine: (E, S, steps) cos(g_s, dJ/dtheta)
    kept           (E, S, steps) fraction of the batch's tokens whose gradient the estimator kept
    estimators     the labels, in order (`label_of`);  seeds: the seed of each column
    """

    estimators: list[str]
    seeds: list[int]
    J: np.ndarray
    grad_norm: np.ndarray
    true_norm: np.ndarray
    cosine: np.ndarray
    kept: np.ndarray
    steps: int
    lr: float
    lag: int
    batch_size: int | None
    seconds: float = 0.0
    stopped: bool = False
    settings: dict = field(default_factory=dict)

    @property
    def final(self) -> np.ndarray:
        """(E, S) J after the last update that ran."""
        done = ~np.isnan(self.J).all(axis=(0, 1))
        return self.J[:, :, np.flatnonzero(done)[-1]]

    def frame(self):
        """One row per (estimator, seed): final J, its best J, the largest grad_norm, the mean kept."""
        import pandas as pd

        rows = []
        for i, name in enumerate(self.estimators):
            for j, seed in enumerate(self.seeds):
                rows.append({"estimator": name, "seed": seed, "lag": self.lag, "batch_size": self.batch_size,
                             "final_J": float(self.final[i, j]), "best_J": float(np.nanmax(self.J[i, j])),
                             "max_grad_norm": float(np.nanmax(self.grad_norm[i, j], initial=0.0)),
                             "mean_kept": float(np.nanmean(self.kept[i, j])) if self.steps else 1.0})
        return pd.DataFrame(rows)


def label_of(estimator) -> str:
    """A name or preset key as is; (name, cfg) as name(knob=value, ...) for the knobs that differ from the
    defaults; a Composition by its description."""
    if isinstance(estimator, str):
        return estimator
    if isinstance(estimator, Composition):
        return estimator.describe()
    name, cfg = estimator
    if cfg is None:
        return name
    default = entry(name)[1].as_dict()  # a registry entry's defaults, or a preset's (the framework's)
    changed = [f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in cfg.as_dict().items()
               if default.get(k) != v]
    return f"{name}({', '.join(changed)})" if changed else name


@dataclass(frozen=True)
class _Estimator:
    """What the trainer needs to know about one estimator."""

    x: object  # a registry name, a preset key or a Composition, as run() takes it
    cfg: Config | None
    adv_tau: float  # read off its own loss on one on-policy token: d loss / d log pi = -adv_tau there
    coupled: bool  # its weights depend on the whole batch (self-normalised): evaluated run by run
    penalised: bool  # its loss has a penalty: the gradient by autograd, through the loss's 1 / (rollouts)
    centered: bool = False  # score centering: its batches carry the bit's two-token head (seqis.lab.chain)

    @property
    def label(self) -> str:
        return label_of(self.x if self.cfg is None else (self.x, self.cfg))


def _pairs(estimators) -> list[_Estimator]:
    if isinstance(estimators, (str, Composition)) or (isinstance(estimators, tuple) and len(estimators) == 2
                                                      and isinstance(estimators[1], (Config, type(None)))):
        estimators = [estimators]  # one name or composition, or one (name, cfg) pair
    pairs = [tuple(e) if isinstance(e, tuple) else (e, None) for e in estimators]
    if not pairs:
        raise ValueError("estimators is empty: give at least one name, preset key or (name, cfg) pair")
    out = []
    for x, cfg in pairs:  # an unknown name or a config of the wrong class fails here, before any work
        comp = resolve(x, cfg)
        leaf = torch.zeros(1, 1, dtype=torch.float64, requires_grad=True)
        res = run(x, _batch(leaf, torch.zeros(1, 1, dtype=torch.float64), torch.ones(1, dtype=torch.float64),
                            comp.centering is not None), cfg, agg=AGG)
        (dlogp,) = torch.autograd.grad(res.loss, leaf)
        out.append(_Estimator(x, cfg, -float(dlogp), comp.weight.self_normalize, comp.penalty is not None,
                              comp.centering is not None))
    return out


def _check_centered(pairs: list[_Estimator], policy) -> None:
    """Score centering needs the sampler's head: the lab builds it where the vocabulary is two tokens (a bit)."""
    centered = [p.label for p in pairs if p.centered]
    if centered and not isinstance(policy, ChainPolicy):
        raise ValueError(f"{', '.join(centered)}: score centering needs the sampler's head, which the lab builds on "
                         "a BitChain only (two tokens a position: the head is the whole vocabulary)")


def _seeds(seeds) -> list[int]:
    out = list(range(int(seeds))) if isinstance(seeds, (int, np.integer)) else [int(s) for s in seeds]
    if not out:
        raise ValueError(f"seeds must be a positive count or a non-empty list, got {seeds!r}")
    return out


def train(chain, estimators, steps: int, lr: float, lag: int, batch_size: int | None, seeds=1, device=None, *,
          fault: SamplerFault | None = None, optimizer: str = "sgd", baseline: bool = False,
          dtype: torch.dtype | None = None, memory_budget: int | None = None,
          progress: Progress | None = None, should_stop: Callable[[], bool] | None = None) -> TrainResult:
    """Train one policy per (estimator, seed) from theta0 by plain SGD with rollouts `lag` updates stale.

    chain        BitChain or TabularAR;  estimators: registry names, preset keys or (name, cfg) pairs
    steps        updates;  lr: SGD step;  lag: K, update s samples from theta_{max(s - K, 0)}
    batch_size   rollouts per update, or None for the exact expected gradient (enumeration, small toys)
    seeds        n (seeds 0..n-1) or a list;  device: where every tensor lives (default CPU)
    fault        a SamplerFault on top of the lag;  dtype: rollouts' dtype (float32, or float64 when exact)
    optimizer    "sgd" (default) or "adam";  baseline: A = reward - the batch mean (default False: A = reward)
    progress     progress(fraction, message) a few times a second;  should_stop(): True stops after the
                 current update (the result is marked stopped, J is NaN past the last update that ran)
    """
    return train_lags(chain, estimators, [lag], steps=steps, lr=lr, batch_size=batch_size, seeds=seeds,
                      device=device, fault=fault, optimizer=optimizer, baseline=baseline, dtype=dtype,
                      memory_budget=memory_budget, progress=progress,
                      should_stop=should_stop)[0]


def train_lags(chain, estimators, lags: Sequence[int], *, steps: int, lr: float, batch_size: int | None, seeds=1,
               device=None, fault: SamplerFault | None = None, optimizer: str = "sgd", baseline: bool = False,
               dtype: torch.dtype | None = None,
               memory_budget: int | None = None, progress: Progress | None = None,
               should_stop: Callable[[], bool] | None = None) -> list[TrainResult]:
    """`train` at several lags in one vectorised run: one TrainResult per lag, in order."""
    pairs, seeds, lags = _pairs(estimators), _seeds(seeds), [int(k) for k in lags]
    if int(steps) < 0 or not lags or min(lags) < 0 or not (lr >= 0 and math.isfinite(lr)):
        raise ValueError(f"need steps >= 0, lags >= 0 and a finite lr >= 0; got steps={steps}, lags={lags}, lr={lr}")
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {optimizer!r}")
    if baseline and (batch_size is None or int(batch_size) < 2):
        raise ValueError(f"baseline=True needs a batch_size >= 2 (the batch mean of the reward), got {batch_size}")
    if batch_size is not None and int(batch_size) < 1:
        raise ValueError(f"batch_size must be >= 1 or None (exact expected gradient), got {batch_size}")
    if batch_size is None and any(p.coupled for p in pairs):
        names = ", ".join(p.label for p in pairs if p.coupled)
        raise ValueError(f"batch_size=None has no exact form for self-normalised weights ({names}): they depend "
                         "on the batch; give a batch_size")
    device = torch.device(device) if device is not None else torch.device("cpu")
    dtype = dtype or (torch.float64 if batch_size is None else torch.float32)
    policy = policy_of(chain, fault)
    _check_centered(pairs, policy)
    E, L, S, steps = len(pairs), len(lags), len(seeds), int(steps)
    shape = (E, L, S)
    out = {k: np.full(shape + (steps + (k == "J"),), np.nan) for k in ("J", "grad_norm", "true_norm", "cosine", "kept")}
    per_seed = _bytes_per_seed(policy, E * L, batch_size, max(lags), dtype)
    budget = memory_budget or DEFAULT_BUDGET[device.type == "cuda"]
    chunk = max(1, min(S, budget // max(per_seed, 1)))
    start, stopped = time.perf_counter(), False
    for c0 in range(0, S, chunk):
        part = seeds[c0 : c0 + chunk]
        done = _run_chunk(policy, pairs, lags, part, steps, (lr, optimizer, baseline), batch_size, device, dtype, out,
                          slice(c0, c0 + len(part)), progress, should_stop, (c0, S))
        if done < steps:
            stopped = True
            break
    seconds = time.perf_counter() - start
    settings = {"chain": repr(chain), "steps": steps, "lr": lr, "batch_size": batch_size, "fault": fault,
                "dtype": str(dtype), "device": str(device), "theta0": "logit(p)",
                "advantage": "reward - batch mean" if baseline else "reward", "optimizer": optimizer}
    return [TrainResult(estimators=[p.label for p in pairs], seeds=seeds, steps=steps, lr=lr, lag=k,
                        batch_size=batch_size, seconds=seconds, stopped=stopped, settings={**settings, "lag": k},
                        **{name: arr[:, i] for name, arr in out.items()})
            for i, k in enumerate(lags)]


def _bytes_per_seed(policy, runs_per_seed: int, batch_size: int | None, max_lag: int, dtype) -> int:
    """Live memory of one seed's runs in a step: about 12 (B, T) tensors of rollouts per run, plus the lag
    history of theta."""
    n = batch_size if batch_size is not None else policy.n_sequences
    item = torch.finfo(dtype).bits // 8
    return runs_per_seed * (12 * n * policy.horizon * item + (max_lag + 2) * policy.dim * 8)


def _run_chunk(policy, pairs, lags, seeds, steps, update, batch_size, device, dtype, out, cols, progress,
               should_stop, position) -> int:
    """Train the runs of these seeds (all estimators and lags) for `steps` updates; write rows of `out`.
    Returns the number of updates that ran."""
    E, L, S = len(pairs), len(lags), len(seeds)
    R = E * L * S  # run r = (e, l, s), s fastest
    D = policy.dim
    theta = policy.theta0().to(device).expand(R, D).clone()  # (R, D) float64
    lag_of = torch.tensor(lags, device=device).repeat_interleave(S).repeat(E)  # (R,)
    depth = max(lags) + 1
    history = torch.empty(depth, R, D, dtype=torch.float64, device=device)  # ring of the last `depth` thetas
    streams = Streams(seeds, device)
    rows = torch.arange(R, device=device)
    J_all = torch.empty(R, steps + 1, dtype=torch.float64, device=device)
    stats = torch.zeros(4, R, max(steps, 1), dtype=torch.float64, device=device)  # grad_norm, true_norm, cos, kept
    last_report, done = 0.0, steps
    lr, optimizer, baseline = update
    step = OPTIMIZERS[optimizer](lr)
    for s in range(steps + 1):
        J, true = policy.value_and_gradient(theta)
        J_all[:, s] = J
        if s == steps:
            break
        history[s % depth] = theta
        theta_mu = history[(s - lag_of).clamp(min=0) % depth, rows]  # (R, D) each run's sampler

        def draw(stream, tail, s=s):  # (R, *tail): each run gets its seed's uniforms
            return streams.uniform(s, stream, tail, dtype).repeat(E * L, *([1] * len(tail)))

        g, kept = _estimate(policy, pairs, theta, theta_mu, draw, batch_size, dtype, L * S, baseline)
        stats[0, :, s] = g.norm(dim=-1)
        stats[1, :, s] = true.norm(dim=-1)
        stats[2, :, s] = torch.nn.functional.cosine_similarity(g, true, dim=-1, eps=1e-300)
        stats[3, :, s] = kept
        theta = theta + step(g)
        now = time.perf_counter()
        if progress is not None and (now - last_report > 0.25 or s == steps - 1):
            last_report = now
            c0, total = position
            progress((c0 + S * (s + 1) / max(steps, 1)) / total,
                     f"update {s + 1:,} / {steps:,} (seeds {seeds[0]}..{seeds[-1]})")
        if should_stop is not None and should_stop():
            done = s + 1
            break
    shape = (E, L, S)
    out["J"][:, :, cols, : done + 1] = J_all[:, : done + 1].view(*shape, -1).cpu().numpy()
    for k, name in enumerate(("grad_norm", "true_norm", "cosine", "kept")):
        out[name][:, :, cols, :done] = stats[k, :, :done].view(*shape, -1).cpu().numpy()
    return done


def _estimate(policy, pairs, theta, theta_mu, draw, batch_size, dtype, runs_per_estimator, baseline=False):
    """(R, D) gradient estimates and (R,) kept fractions: each estimator's loss on its runs' rollouts."""
    if batch_size is None:
        tokens, logp, logq, reward, prob = policy.enumerate(theta, theta_mu, dtype)
        weight = prob.to(dtype)  # (R, N): each sequence counts with its sampler probability
    else:
        tokens, logp, logq, reward = policy.rollouts(theta, theta_mu, draw, batch_size, dtype)
        weight = None
        if baseline:  # A = reward - the mean reward of the run's batch (a GRPO-style baseline, no std)
            reward = reward - reward.mean(-1, keepdim=True)
    R, n, T = logp.shape
    coef = torch.empty_like(logp)  # (R, n, T) d (a run's mean surrogate over its own rollouts) / d log pi
    other = torch.zeros_like(logp) if any(p.centered for p in pairs) else None  # ... / d log pi(the other bit)
    kept = torch.empty(R, dtype=torch.float64, device=logp.device)
    k = runs_per_estimator
    for i, est in enumerate(pairs):
        sl = slice(i * k, (i + 1) * k)
        if est.coupled or est.penalised:  # each run's batch alone (see _coefficient)
            parts = [_coefficient(est, logp[r : r + 1], logq[r : r + 1], reward[r : r + 1])
                     for r in range(*sl.indices(R))]
            c, frac, o = (x[0] if x[0] is None else torch.cat(x) for x in zip(*parts, strict=True))
        else:  # per-rollout weights: every run of this estimator in one Batch
            c, frac, o = _coefficient(est, logp[sl], logq[sl], reward[sl])
        coef[sl] = c / n if weight is None else c * weight[sl][..., None]  # a run's mean, or its expectation
        if o is not None:
            other[sl] = o / n if weight is None else o * weight[sl][..., None]
        kept[sl] = frac.mean(-1) if weight is None else (frac * weight[sl].double()).sum(-1)
    with torch.no_grad():
        g = policy.score(tokens, coef.detach(), theta)
        if other is not None:  # score centering's term on the bit not sampled
            g = g + policy.score(1 - tokens, other.detach(), theta)
    return g, kept


def _batch(logp, logq, reward, centered: bool) -> Batch:
    """The rollouts as a Batch, carrying the two-token head (seqis.lab.chain.binary_head) for score centering."""
    head = binary_head(logp.detach(), logq) if centered else {}
    if centered and logp.requires_grad:  # the head's trainer log-probs: a leaf of their own, as a trainer gives
        head["topk_trainer_logprobs"] = head["topk_trainer_logprobs"].requires_grad_()
    return Batch(logp, logq, reward, **head)


def _coefficient(est: _Estimator, logp, logq, reward):
    """k runs' rollouts (k, n, T) through the estimator: (k, n, T) the gradient coefficient of each token (d loss
    / d log pi times -k n, so a run's mean over its rollouts is the estimate), (k, n) the fraction of each
    rollout's tokens kept, and for score centering (k, n, T) the coefficient on the other bit's log-prob (None
    without: the sampled bit's share of the head is added to the first).

    A run's coefficients must not depend on the other runs beside it (a seed reproduces alone or in a sweep,
    seqis.lab.fixed). Per-rollout weights: the k n rollouts, padded with rollouts of log pi = log mu = 0 and
    reward 0 (coefficient 0, dropped after), go through the estimator in the calls `row_blocks` gives.
    Self-normalised weights (they average over the batch) and penalised losses (their gradient carries the
    loss's 1 / n) come here one run at a time (k = 1), the same call alone or in a sweep."""
    k, n, T = logp.shape
    if est.penalised:  # a loss with a penalty term: its full gradient, by autograd
        leaf = logp.reshape(k * n, T).detach().requires_grad_()
        batch = _batch(leaf, logq.reshape(k * n, T), reward.reshape(k * n), est.centered)
        res = run(est.x, batch, est.cfg, agg=AGG)
        leaves = (leaf, batch.topk_trainer_logprobs) if est.centered else (leaf,)
        grads = [g * -float(k * n) for g in torch.autograd.grad(res.loss, leaves)]
        c = grads[0] + (grads[1][..., 0] if est.centered else 0)
        other = grads[1][..., 1].view(k, n, T) if est.centered else None
        return c.view(k, n, T), res.rollouts["kept_fraction"].view(k, n).double(), other
    if est.coupled:
        res = run(est.x, _batch(logp.reshape(k * n, T), logq.reshape(k * n, T), reward.reshape(k * n),
                                est.centered), est.cfg, agg=AGG)
        weights, kept, head = res.weights, res.rollouts["kept_fraction"], res.head_weights
    else:
        N = k * n
        rows, blocks = row_blocks(N, T)
        pad = (0, 0, 0, rows - N)
        lp, lq = (torch.nn.functional.pad(x.reshape(N, T), pad) for x in (logp, logq))  # (rows, T)
        rw = torch.nn.functional.pad(reward.reshape(N), (0, rows - N))  # (rows,)
        weights = logp.new_empty(rows, T)
        kept = logp.new_empty(rows)
        head = logp.new_empty(rows, T, 2) if est.centered else None
        for sl in blocks:
            res = run(est.x, _batch(lp[sl], lq[sl], rw[sl], est.centered), est.cfg, agg=AGG)
            weights[sl] = res.weights
            kept[sl] = res.rollouts["kept_fraction"]
            if est.centered:
                head[sl] = res.head_weights
        weights, kept, head = weights[:N], kept[:N], (None if head is None else head[:N])
    # the contract: d loss / d log pi = -weights * adv_tau * A / (k n), exact whatever k is; the head's the same
    # with head_weights (seqis.core.types.EstimatorOutput)
    scale = (est.adv_tau * reward)[..., None]  # (k, n, 1)
    c = weights.view(k, n, T) * scale
    if head is None:
        return c, kept.view(k, n).double(), None
    head = head.view(k, n, T, 2) * scale[..., None]
    return c + head[..., 0], kept.view(k, n).double(), head[..., 1]
