"""Training in the infinite-batch limit on a uniform bit chain: every update takes the estimator's exact expected
gradient under the lagged sampler, so what is left is its bias, not its noise.

    res = train_expected(BitChain(128, 84, 0.5, 0.5), ["seq_is", "geo_is"], steps=300, lr=10.0, lags=[0, 50])
    res[1].J         # (n_estimators, 1, steps + 1) float64: exact J before each update and after the last, lag 50

`train(..., batch_size=None)` does the same by enumerating all 2^H sequences (H <= 16). On a BitChain whose bits
share one p (and whose sampler shares one q, as a lagged copy of such a policy does), an estimator whose
coefficient on a token depends only on the rollout's count of ones c and on the token's own bit ("exchangeable":
every registered estimator but the prefix ratios) has an expected gradient that is a sum over the H + 1 counts:

    E_mu[g_t] = (1 / H) sum_c Bin(c; H, q) sum_t kappa_t(x_c) (a_t(x_c) - p)

with x_c one rollout with c ones (the first c tokens) and kappa_t its coefficients (the estimator's loss through
autograd, as `train` computes them). Every position gets the same gradient, so theta stays one number per run;
J and dJ/dtheta are exact as in `train` (seqis.lab.poisson_binomial). Cost per update: one (H + 1, H) batch
per estimator, whatever H. Sequence IS's expected gradient is the true gradient at every lag (it is unbiased);
token-level and geometric weights follow a different field once the sampler lags.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from .chain import BitChain
from .policies import SamplerFault, policy_of
from .train import TrainResult, _coefficient, _pairs


def _uniform(x: torch.Tensor) -> bool:
    return bool((x == x[0]).all())


def _check_exchangeable(est) -> None:
    """Raise unless the estimator's token coefficients follow the tokens when a rollout's positions are
    reversed (so they depend on the rollout's count and the token's own value, not on where it sits)."""
    g = torch.Generator().manual_seed(0)
    logq = -torch.rand(1, 3, 6, generator=g, dtype=torch.float64)  # (1, n, T)
    logp = logq + 0.3 * torch.randn(1, 3, 6, generator=g, dtype=torch.float64)
    if est.centered:  # the two-token head needs log-probs of a bit (below 0)
        logp = -(logp.abs() + 1e-3)
    reward = torch.rand(1, 3, generator=g, dtype=torch.float64) + 0.5
    ahead, _, head_ahead = _coefficient(est, logp, logq, reward)
    behind, _, head_behind = _coefficient(est, logp.flip(-1), logq.flip(-1), reward)
    if est.centered:
        ahead, behind = torch.cat([ahead, head_ahead], -1), torch.cat([behind.flip(-1), head_behind.flip(-1)], -1)
    else:
        behind = behind.flip(-1)
    if not torch.allclose(ahead, behind, rtol=1e-9, atol=1e-12):
        raise ValueError(f"{est.label}: its token weights depend on the token's position (prefix ratios, say), "
                         "so its expected gradient is not a sum over counts; use train(..., batch_size=None) "
                         "on a chain with horizon <= 16")


def _log_binom(H: int, prob: torch.Tensor) -> torch.Tensor:
    """(R, H + 1) log Bin(c; H, prob) for each run's prob (R,), c = 0..H (exact 0 and 1 allowed)."""
    c = torch.arange(H + 1, dtype=torch.float64, device=prob.device)
    log_choose = math.lgamma(H + 1.0) - torch.lgamma(c + 1) - torch.lgamma(H - c + 1)
    q = prob[:, None]
    return log_choose + torch.special.xlogy(c, q) + torch.special.xlogy(H - c, 1 - q)


def expected_gradient_counts(pairs, theta: torch.Tensor, theta_mu: torch.Tensor, count_reward: torch.Tensor,
                             runs_per_estimator: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(R,) the exact expected gradient of every position (all equal) and (R,) the expected kept fraction, for R =
    E * runs_per_estimator runs (estimator-major) of a uniform bit chain of horizon H = len(count_reward) - 1:
    theta (R,) the trainer's logit, theta_mu (R,) the sampler's. A sum over the H + 1 counts (module docstring);
    score centering's term on the bit not sampled (seqis.lab.chain.binary_head) joins it."""
    H, R, L = count_reward.shape[0] - 1, theta.shape[0], runs_per_estimator
    ones = (torch.arange(H)[None, :] < torch.arange(H + 1)[:, None]).double()  # (H + 1, H): x_c, c ones first
    reward = count_reward.expand(R, H + 1)  # (R, H + 1) f(c)
    logp = torch.where(ones.bool(), F.logsigmoid(theta)[:, None, None], F.logsigmoid(-theta)[:, None, None])
    logq = torch.where(ones.bool(), F.logsigmoid(theta_mu)[:, None, None], F.logsigmoid(-theta_mu)[:, None, None])
    prob = _log_binom(H, torch.sigmoid(theta_mu)).exp()  # (R, H + 1) P_mu(count = c)
    coef = torch.empty(R, H + 1, H, dtype=torch.float64)  # (R, H + 1, H) on the sampled bit
    other = torch.zeros(R, H + 1, H, dtype=torch.float64)  # on the other bit (score centering)
    kept = torch.empty(R, dtype=torch.float64)
    for i, est in enumerate(pairs):
        sl = slice(i * L, (i + 1) * L)
        c, frac, o = _coefficient(est, logp[sl], logq[sl], reward[sl])  # (L, H + 1, H), (L, H + 1), ...
        coef[sl] = c
        if o is not None:
            other[sl] = o
        kept[sl] = (frac * prob[sl]).sum(-1)
    p = torch.sigmoid(theta)[:, None, None]
    score = ones - p  # (R, H + 1, H) a_t - p
    per_count = (coef * score).sum(-1) + (other * (1 - ones - p)).sum(-1)  # (R, H + 1)
    return (per_count * prob).sum(-1) / H, kept


def train_expected(chain: BitChain, estimators, *, steps: int, lr: float, lags: Sequence[int],
                   fault: SamplerFault | None = None) -> list[TrainResult]:
    """`train_lags(chain, estimators, lags, steps=steps, lr=lr, batch_size=None)` on a uniform bit chain, for
    any horizon: plain SGD from theta0 = logit(p) along each estimator's exact expected gradient under a sampler
    `lag` updates stale, A = reward. One TrainResult per lag (one "seed", 0; batch_size None). fault: a
    SamplerFault with a logit_bias only (the sampler's logit is the stale policy's plus b: a biased engine;
    precision noise and top-p have no form here). Score-centered compositions run with the bit's two-token
    head (seqis.lab.centering)."""
    if not isinstance(chain, BitChain):
        raise ValueError(f"train_expected needs a BitChain, got {type(chain).__name__}")
    if not _uniform(chain.p):
        raise ValueError("train_expected needs a chain whose bits share one p (theta stays one number per run)")
    fault = fault or SamplerFault()
    if fault.precision is not None or fault.top_p < 1.0:
        raise ValueError(f"train_expected takes a SamplerFault with logit_bias only, got {fault}")
    lags = [int(k) for k in lags]
    if int(steps) < 0 or not lags or min(lags) < 0 or not (lr >= 0 and math.isfinite(lr)):
        raise ValueError(f"need steps >= 0, lags >= 0 and a finite lr >= 0; got steps={steps}, lags={lags}, lr={lr}")
    pairs = _pairs(estimators)
    for est in pairs:
        if est.coupled:
            raise ValueError(f"{est.label}: self-normalised weights depend on the batch; they have no expected "
                             "gradient per rollout")
        _check_exchangeable(est)
    start = time.perf_counter()
    H, steps = chain.horizon, int(steps)
    E, L = len(pairs), len(lags)
    R = E * L  # run r = (estimator e, lag l), l fastest
    policy = policy_of(chain)
    theta = torch.full((R,), float(torch.logit(chain.p[0])), dtype=torch.float64)  # (R,) one logit per run
    lag_of = torch.tensor(lags).repeat(E)  # (R,)
    depth = max(lags) + 1
    history = torch.empty(depth, R, dtype=torch.float64)
    J_all = torch.empty(R, steps + 1, dtype=torch.float64)
    stats = torch.zeros(4, R, max(steps, 1), dtype=torch.float64)  # grad_norm, true_norm, cosine, kept
    rows = torch.arange(R)
    for s in range(steps + 1):
        J, true = policy.value_and_gradient(theta[:, None].expand(R, H))  # (R,), (R, H)
        J_all[:, s] = J
        if s == steps:
            break
        history[s % depth] = theta
        theta_mu = history[(s - lag_of).clamp(min=0) % depth, rows] + fault.logit_bias  # (R,) each run's sampler
        g, kept = expected_gradient_counts(pairs, theta, theta_mu, chain.count_reward, L)
        stats[0, :, s] = g.abs() * math.sqrt(H)
        stats[1, :, s] = true.norm(dim=-1)
        stats[2, :, s] = torch.sign(g) * torch.sign(true[:, 0])  # both are uniform over positions
        stats[3, :, s] = kept
        theta = theta + lr * g
    seconds = time.perf_counter() - start
    out = {"J": J_all.view(E, L, 1, -1).numpy()}
    for k, name in enumerate(("grad_norm", "true_norm", "cosine", "kept")):
        out[name] = stats[k, :, :steps].view(E, L, 1, -1).numpy()
    settings = {"chain": repr(chain), "steps": steps, "lr": lr, "batch_size": None, "dtype": "torch.float64",
                "theta0": "logit(p)", "advantage": "reward", "optimizer": "sgd", "gradient": "expected (counts)",
                "fault": fault if fault.active else None}
    return [TrainResult(estimators=[p.label for p in pairs], seeds=[0], steps=steps, lr=lr, lag=k, batch_size=None,
                        seconds=seconds, settings={**settings, "lag": k},
                        **{name: np.ascontiguousarray(arr[:, i]) for name, arr in out.items()})
            for i, k in enumerate(lags)]
