"""The bias and variance lab: toy policies with exact gradients, and a vectorised Monte Carlo.

An estimator's gradient error on real rollouts can only be compared with another estimator's. On a toy
whose true policy gradient is known exactly, it splits cleanly into bias and variance:

    g_b      the gradient estimate from batch b: minus the gradient in theta of the estimator's loss
             (`seqis.run(name, batch, cfg, agg="seq-mean-token-sum")`, A = reward) on B rollouts from mu
    mean     average of g_b over n_batches seeded batches;  true: the exact dJ/dtheta
    bias2    ||mean - true||^2          variance: mean over batches of ||g_b - mean||^2
    mse      mean over batches of ||g_b - true||^2 = bias2 + variance

bias2 carries a noise floor of variance / n_batches (what an unbiased estimator shows); the sweeps
report it. With the seq-mean-token-sum loss a batch's estimate is the mean of per-rollout terms, so
Var(B) = Var(1) / B and MSE(B) = bias^2 + Var(1) / B: a biased estimator's MSE plateaus at bias^2 as B
grows while sequence IS keeps falling (`sweep_batch_size`).

Two toys (the "chain" protocol below; `monte_carlo` accepts either):

- `BitChain(horizon, threshold, p, q)`: Huang's prefix chain. H independent bits, pi(a_t = 1) = p_t =
  sigmoid(theta_t), mu(a_t = 1) = q_t, reward 1[sum a >= k] (or additive: sum a). Exact gradient by a
  dynamic program over the count of ones: dJ/dtheta_t = p_t (1 - p_t) P_pi(sum of the others = k - 1).
  Token IS is biased here (its expectation uses P_mu for the other tokens); with an additive reward it
  is not: the bias needs rewards that couple tokens.
- `TabularAR(vocab, horizon)`: a tabular autoregressive policy over V <= 4 tokens and T <= 6 positions
  whose logits depend on (position, previous token), with trainer and inference policies that differ
  per state. Exact gradient and exact estimator expectations by enumerating all V^T sequences. Here the
  sampler also shifts which states are visited, so token IS is biased even with an additive reward.

The chain protocol: `horizon` (T), `dim` (D, the number of parameters theta), `sample(n, generator,
device, dtype) -> Rollouts`, `score_vjp(tokens, v) -> (n, D)` (the per-rollout gradient in theta of
sum_t v_t log pi(a_t)), `logprobs(tokens, theta)` (differentiable), `true_gradient() -> (D,) float64`,
`value()`, `with_lag(lag, lr)`, and `enumerate()` where the sequence space is small.

Everything runs as tensors: all n_batches * batch_size rollouts are drawn as [N, T] tensors in chunks
that fit `memory_budget` (whole batches per chunk), each chunk goes through `seqis.run_many` once (the
log-ratios are shared by every estimator), autograd gives d loss / d trainer_logprobs, the chain maps it
to theta, and a reshape forms the per-batch means. No Python loop over rollouts. Estimators must be
per-rollout functions of the batch (every registered one is): a chunk of several batches then gives
each batch exactly the gradient it would get alone.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from .estimators import Ratios
from .metrics import resolve_config, run_many
from .types import Batch, Config

AGG = "seq-mean-token-sum"  # sum over a rollout's tokens, mean over rollouts: the unbiased policy gradient
DEFAULT_BUDGET = {False: 64 << 20, True: 2 << 30}  # bytes per chunk of rollouts: CPU (cache-friendly), CUDA
Progress = Callable[[float, str], None]

__all__ = [
    "AGG",
    "BitChain",
    "TabularAR",
    "Rollouts",
    "MCResult",
    "monte_carlo",
    "monte_carlo_many",
    "expected_gradient",
    "sweep_knob",
    "sweep_batch_size",
    "sweep_horizon",
    "sweep_lag",
]


# ---------------------------------------------------------------------------------------------------------
# rollouts


@dataclass(eq=False)
class Rollouts:
    """Rollouts sampled from mu, ready to become a Batch.

    tokens              (N, T) the sampled tokens (bool bits for BitChain, int64 ids for TabularAR)
    trainer_logprobs    (N, T) log pi(a_t | state), detached
    inference_logprobs  (N, T) log mu(a_t | state)
    reward              (N,)
    """

    tokens: torch.Tensor
    trainer_logprobs: torch.Tensor
    inference_logprobs: torch.Tensor
    reward: torch.Tensor

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def to_batch(self, *, baseline_group: int | None = None, requires_grad: bool = False) -> Batch:
        """A Batch with advantages = reward, or reward minus the mean of its group of `baseline_group`
        consecutive rollouts (a GRPO-style baseline). requires_grad: trainer_logprobs becomes a leaf that
        the loss backpropagates into."""
        adv = self.reward
        if baseline_group is not None:
            r = adv.view(-1, baseline_group)  # (groups, G)
            adv = (r - r.mean(-1, keepdim=True)).view(-1)
        logp = self.trainer_logprobs.detach()
        if requires_grad:
            logp = logp.clone().requires_grad_()
        return Batch(logp, self.inference_logprobs, adv)


def _probs(x, H: int, name: str) -> torch.Tensor:
    """A probability (scalar or per position) as a float64 (H,) tensor, strictly inside (0, 1)."""
    t = torch.as_tensor(x, dtype=torch.float64).detach().cpu()
    if t.dim() == 0:
        t = t.expand(H).clone()
    if t.shape != (H,):
        raise ValueError(f"{name} must be a scalar or a ({H},) tensor, got shape {tuple(t.shape)}")
    if not bool(((t > 0) & (t < 1)).all()):
        raise ValueError(f"{name} must lie strictly between 0 and 1, got {t.min().item()}..{t.max().item()}")
    return t


class _Toy:
    """What both toys share beyond the chain protocol."""

    def batch(self, n: int, seed: int = 0, device=None, *, baseline_group: int | None = None) -> Batch:
        """n seeded rollouts from mu as a Batch (advantages = reward), e.g. to look at in Explore."""
        gen = torch.Generator(device=device if device is not None else "cpu").manual_seed(int(seed))
        return self.sample(n, gen, device).to_batch(baseline_group=baseline_group)


def _walk_back(theta: torch.Tensor, grad_at: Callable[[torch.Tensor], torch.Tensor], lag: int, lr: float):
    """The policy `lag` steps of gradient ascent (step lr) behind theta: walk back along the true gradient."""
    if lag < 0 or lr < 0:
        raise ValueError(f"lag and lr must be >= 0, got lag={lag}, lr={lr}")
    for _ in range(int(lag)):
        theta = theta - lr * grad_at(theta)
    return theta


# ---------------------------------------------------------------------------------------------------------
# Huang's bit chain


class BitChain(_Toy):
    """Huang's prefix chain: H independent bits, pi(a_t = 1) = p_t = sigmoid(theta_t), mu(a_t = 1) = q_t.

    horizon    H, the number of tokens
    threshold  k: reward 1[sum a >= k] (reward="threshold")
    p, q       the trainer's and the sampler's probability of a one: scalars or (H,) tensors, kept as
               float64 (H,) tensors
    reward     "threshold" (1[sum a >= k]), "additive" (sum a: every token is rewarded on its own), or an
               (H + 1,) tensor f giving the reward f(c) of a rollout with c ones
    """

    def __init__(self, horizon: int, threshold: int, p, q, *, reward: str | torch.Tensor = "threshold"):
        H = int(horizon)
        if H < 1:
            raise ValueError(f"horizon must be >= 1, got {horizon}")
        if not 0 <= int(threshold) <= H:
            raise ValueError(f"threshold must lie in [0, horizon={H}], got {threshold}")
        self.horizon, self.threshold = H, int(threshold)
        self.p, self.q = _probs(p, H, "p"), _probs(q, H, "q")  # (H,) float64
        self.reward = reward
        c = torch.arange(H + 1, dtype=torch.float64)
        if isinstance(reward, str):
            if reward not in ("threshold", "additive"):
                raise ValueError(f"reward must be 'threshold', 'additive' or an ({H + 1},) tensor, got {reward!r}")
            f = (c >= self.threshold).double() if reward == "threshold" else c
        else:
            f = torch.as_tensor(reward, dtype=torch.float64).detach().cpu()
            if f.shape != (H + 1,):
                raise ValueError(f"a reward tensor must have shape ({H + 1},) (reward per count), got {tuple(f.shape)}")
        self.count_reward = f  # (H + 1,) reward of a rollout with c ones

    def __repr__(self) -> str:
        def short(x):
            return f"{x[0].item():.4g}" if bool((x == x[0]).all()) else f"[{x.min().item():.3g}..{x.max().item():.3g}]"

        r = self.reward if isinstance(self.reward, str) else "custom"
        return f"BitChain(H={self.horizon}, k={self.threshold}, p={short(self.p)}, q={short(self.q)}, reward={r})"

    @classmethod
    def lagged(cls, horizon: int, threshold: int, p, lag: int, *, lr: float = 1.0, shift: float | None = None,
               reward: str | torch.Tensor = "threshold") -> BitChain:
        """A chain whose sampler is the trainer `lag` updates stale. By default mu is pi walked back `lag`
        steps of gradient ascent with step `lr` along the exact gradient (so pi is mu after `lag` updates);
        with `shift`, every stale step is a constant logit shift instead: logit q = logit p - lag * shift."""
        chain = cls(horizon, threshold, p, p, reward=reward)
        if shift is not None:
            return chain._with_theta_mu(chain.theta - lag * float(shift))
        return chain.with_lag(lag, lr=lr)

    # --- the chain protocol

    @property
    def dim(self) -> int:
        return self.horizon

    @property
    def theta(self) -> torch.Tensor:  # (H,) logits of pi
        return torch.logit(self.p)

    def param_labels(self) -> list[str]:
        return [f"theta_{t}" for t in range(self.horizon)]

    def sample(self, n: int, generator: torch.Generator | None = None, device=None,
               dtype: torch.dtype = torch.float64) -> Rollouts:
        """n rollouts from mu, as (n, H) tensors on `device`."""
        device = torch.device(device) if device is not None else torch.device("cpu")
        p, q = self.p.to(device, dtype), self.q.to(device, dtype)  # (H,)
        u = torch.rand(n, self.horizon, generator=generator, device=device, dtype=dtype)  # (n, H)
        a = u < q  # (n, H) bool
        logp_pi = torch.where(a, torch.log(p), torch.log1p(-p))  # (n, H)
        logp_mu = torch.where(a, torch.log(q), torch.log1p(-q))
        reward = self.count_reward.to(device, dtype)[a.sum(-1)]  # (n,)
        return Rollouts(a, logp_pi, logp_mu, reward)

    def score_vjp(self, tokens: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """(n, H): the gradient in theta of sum_t v_t log pi(a_t), per rollout; d log pi(a_t) / d theta_t
        = a_t - p_t."""
        return v * (tokens.to(v.dtype) - self.p.to(v.device, v.dtype))

    def logprobs(self, tokens: torch.Tensor, theta: torch.Tensor | None = None) -> torch.Tensor:
        """(n, H) log pi(a_t) as a differentiable function of theta (H,)."""
        theta = self.theta if theta is None else theta
        return torch.where(tokens.bool(), F.logsigmoid(theta), F.logsigmoid(-theta))

    def count_distribution(self, probs: torch.Tensor | None = None) -> torch.Tensor:
        """(H + 1,) P(sum of the bits = c) under independent bits with these probabilities (default p)."""
        probs = self.p if probs is None else probs
        dist = torch.zeros(self.horizon + 1, dtype=torch.float64)
        dist[0] = 1.0
        for t, pt in enumerate(probs.tolist()):  # a DP over positions (not rollouts)
            dist[1 : t + 2] = dist[1 : t + 2] * (1 - pt) + dist[: t + 1] * pt
            dist[0] = dist[0] * (1 - pt)
        return dist

    def value(self) -> float:
        """J = E_pi[reward]."""
        return float((self.count_distribution() * self.count_reward).sum())

    def true_gradient(self) -> torch.Tensor:
        """(H,) float64, exact: dJ/dtheta_t = p_t (1 - p_t) sum_c P_pi(others = c) (f(c + 1) - f(c)), which for
        the threshold reward is p_t (1 - p_t) P_pi(sum of the other tokens = k - 1). "Others" is the
        Poisson-binomial count of the H - 1 other bits: a DP over prefixes and suffixes (binomial when p is
        one number)."""
        return self._gradient_at(self.p)

    def _gradient_at(self, p: torch.Tensor) -> torch.Tensor:
        H = self.horizon
        df = self.count_reward[1:] - self.count_reward[:-1]  # (H,) f(c + 1) - f(c), c = 0..H-1
        if bool((p == p[0]).all()):  # binomial: P(others = c) = C(H-1, c) p^c (1-p)^(H-1-c)
            c = torch.arange(H, dtype=torch.float64)
            p0 = p[0]
            log_pmf = (torch.lgamma(torch.tensor(H, dtype=torch.float64)) - torch.lgamma(c + 1)
                       - torch.lgamma(H - c) + c * torch.log(p0) + (H - 1 - c) * torch.log1p(-p0))
            return p * (1 - p) * (torch.exp(log_pmf) * df).sum()
        prefix = torch.zeros(H + 1, H + 1, dtype=torch.float64)  # prefix[t, c] = P(bits < t sum to c)
        suffix = torch.zeros(H + 1, H + 1, dtype=torch.float64)  # suffix[t, c] = P(bits >= t sum to c)
        prefix[0, 0] = suffix[H, 0] = 1.0
        for t in range(H):
            prefix[t + 1] = prefix[t] * (1 - p[t])
            prefix[t + 1, 1:] += prefix[t, :-1] * p[t]
            s = H - 1 - t
            suffix[s] = suffix[s + 1] * (1 - p[s])
            suffix[s, 1:] += suffix[s + 1, :-1] * p[s]
        # sum_c P(others = c) df(c) = sum_{i, j} prefix[t, i] suffix[t + 1, j] df(i + j)
        i = torch.arange(H + 1)
        ij = i[:, None] + i[None, :]  # (H + 1, H + 1)
        hankel = torch.where(ij < H, df[ij.clamp(max=H - 1)], torch.zeros((), dtype=torch.float64))
        others = ((prefix[:H] @ hankel) * suffix[1:]).sum(-1)  # (H,)
        return p * (1 - p) * others

    def with_lag(self, lag: int, lr: float = 1.0) -> BitChain:
        """Same pi; mu = pi walked back `lag` steps of gradient ascent (step lr) along the exact gradient."""
        theta_mu = _walk_back(self.theta, lambda th: self._gradient_at(torch.sigmoid(th)), lag, lr)
        return self._with_theta_mu(theta_mu)

    def _with_theta_mu(self, theta_mu: torch.Tensor) -> BitChain:
        q = torch.sigmoid(theta_mu).clamp(1e-12, 1 - 1e-12)
        return BitChain(self.horizon, self.threshold, self.p, q, reward=self.reward)

    def with_horizon(self, horizon: int) -> BitChain:
        """The same chain at another length, the threshold scaled with it (k' = round(k H' / H)). Needs one
        p and one q for every position."""
        if not (bool((self.p == self.p[0]).all()) and bool((self.q == self.q[0]).all())):
            raise ValueError("with_horizon needs a chain with one p and one q for every position")
        if not isinstance(self.reward, str):
            raise ValueError("with_horizon needs reward='threshold' or 'additive'")
        k = round(self.threshold * horizon / self.horizon)
        return BitChain(horizon, k, float(self.p[0]), float(self.q[0]), reward=self.reward)

    def enumerate(self) -> tuple[Rollouts, torch.Tensor]:
        """Every one of the 2^H sequences (H <= 20) as Rollouts, and its probability under mu."""
        if self.horizon > 20:
            raise ValueError(f"enumerate needs horizon <= 20 (2^H sequences), got {self.horizon}")
        H = self.horizon
        idx = torch.arange(2**H)
        a = (idx[:, None] >> torch.arange(H - 1, -1, -1)) & 1 == 1  # (2^H, H) bool
        logp_pi = torch.where(a, torch.log(self.p), torch.log1p(-self.p))
        logp_mu = torch.where(a, torch.log(self.q), torch.log1p(-self.q))
        return Rollouts(a, logp_pi, logp_mu, self.count_reward[a.sum(-1)]), logp_mu.sum(-1).exp()


# ---------------------------------------------------------------------------------------------------------
# a tabular autoregressive policy


class TabularAR(_Toy):
    """A tabular autoregressive policy: pi(a_t | t, a_{t-1}) = softmax(theta[t, a_{t-1}]) over V tokens.

    vocab       V in 2..4;  horizon T in 1..6 (all V^T sequences are enumerated)
    seed        draws the trainer's logits theta ~ scale * N(0, 1) and, unless given, the sampler's
                logits theta + mismatch * N(0, 1): a mismatch that differs per state
    reward      "random" (a seeded U(0, 1) per sequence: couples every token), "threshold"
                (1[count of token V-1 >= ceil(T / 2)]), "additive" (count of token V-1), a (V^T,) tensor
                indexed by the sequence's base-V number, or a callable (n, T) int64 tokens -> (n,)
    pi_logits / mu_logits  explicit (T, V, V) logits [position, previous token, token] (the first
                position reads row 0)

    Parameters theta are the (T, V, V) trainer logits, flattened: D = T V V (rows at t = 0 other than 0
    are never visited and keep a zero gradient).
    """

    def __init__(self, vocab: int = 3, horizon: int = 4, *, seed: int = 0, scale: float = 1.0,
                 mismatch: float = 0.5, reward: str | torch.Tensor | Callable = "random",
                 pi_logits: torch.Tensor | None = None, mu_logits: torch.Tensor | None = None):
        V, T = int(vocab), int(horizon)
        if not 2 <= V <= 4:
            raise ValueError(f"vocab must lie in 2..4, got {vocab}")
        if not 1 <= T <= 6:
            raise ValueError(f"horizon must lie in 1..6, got {horizon}")
        self.vocab, self.horizon = V, T
        g = torch.Generator().manual_seed(int(seed))
        shape = (T, V, V)
        if pi_logits is None:
            pi_logits = scale * torch.randn(shape, generator=g, dtype=torch.float64)
        self.pi_logits = self._logits(pi_logits, "pi_logits")
        if mu_logits is None:
            mu_logits = self.pi_logits + mismatch * torch.randn(shape, generator=g, dtype=torch.float64)
        self.mu_logits = self._logits(mu_logits, "mu_logits")
        self.seed, self.reward = int(seed), reward

        # every sequence, its base-V index, its previous tokens
        n = V**T
        idx = torch.arange(n)
        powers = V ** torch.arange(T - 1, -1, -1)  # (T,)
        self.sequences = (idx[:, None] // powers) % V  # (V^T, T) int64
        self._powers = powers
        self.seq_reward = self._reward_table(reward, g)  # (V^T,)
        self._mu_logp = self.logprobs(self.sequences, self.mu_logits.flatten())  # (V^T, T)
        self._pi_logp = self.logprobs(self.sequences, self.pi_logits.flatten())
        self._mu_cdf = torch.cumsum(self._mu_logp.sum(-1).exp(), 0)  # (V^T,)

    def _logits(self, x, name) -> torch.Tensor:
        t = torch.as_tensor(x, dtype=torch.float64).detach().cpu()
        want = (self.horizon, self.vocab, self.vocab)
        if t.shape != want:
            raise ValueError(f"{name} must have shape {want} [position, previous token, token], got {tuple(t.shape)}")
        if not bool(torch.isfinite(t).all()):
            raise ValueError(f"{name} must be finite")
        return t

    def _reward_table(self, reward, g: torch.Generator) -> torch.Tensor:
        V, T, seqs = self.vocab, self.horizon, self.sequences
        top = (seqs == V - 1).sum(-1).double()  # (V^T,) count of the last token
        if isinstance(reward, str):
            if reward == "random":
                return torch.rand(V**T, generator=g, dtype=torch.float64)
            if reward == "threshold":
                return (top >= math.ceil(T / 2)).double()
            if reward == "additive":
                return top
            raise ValueError(f"reward must be 'random', 'threshold', 'additive', a tensor or a callable, "
                             f"got {reward!r}")
        if callable(reward):
            r = torch.as_tensor(reward(seqs), dtype=torch.float64)
        else:
            r = torch.as_tensor(reward, dtype=torch.float64).detach().cpu()
        if r.shape != (V**T,):
            raise ValueError(f"the reward must give one value per sequence ({V**T},), got {tuple(r.shape)}")
        return r

    def __repr__(self) -> str:
        r = self.reward if isinstance(self.reward, str) else "custom"
        return f"TabularAR(V={self.vocab}, T={self.horizon}, seed={self.seed}, reward={r})"

    @property
    def dim(self) -> int:
        return self.horizon * self.vocab * self.vocab

    @property
    def theta(self) -> torch.Tensor:  # (D,)
        return self.pi_logits.flatten()

    def param_labels(self) -> list[str]:
        V = self.vocab
        return [f"t{t}|{prev}->{a}" for t in range(self.horizon) for prev in range(V) for a in range(V)]

    def _prev(self, tokens: torch.Tensor) -> torch.Tensor:  # (n, T) previous token, 0 before the first
        return torch.cat([torch.zeros_like(tokens[:, :1]), tokens[:, :-1]], 1)

    def logprobs(self, tokens: torch.Tensor, theta: torch.Tensor | None = None) -> torch.Tensor:
        """(n, T) log pi(a_t | t, a_{t-1}) as a differentiable function of theta (D,)."""
        theta = self.theta if theta is None else theta
        T, V = self.horizon, self.vocab
        logp = torch.log_softmax(theta.view(T, V, V), -1)  # (T, V, V)
        t = torch.arange(T, device=tokens.device)
        return logp.to(tokens.device)[t, self._prev(tokens), tokens]  # (n, T)

    def sample(self, n: int, generator: torch.Generator | None = None, device=None,
               dtype: torch.dtype = torch.float64) -> Rollouts:
        """n rollouts from mu: sequence ids by inverse CDF over the V^T sequences, one uniform per rollout."""
        device = torch.device(device) if device is not None else torch.device("cpu")
        cdf = self._mu_cdf.to(device)
        u = torch.rand(n, generator=generator, device=device, dtype=torch.float64) * cdf[-1]  # (n,)
        idx = torch.searchsorted(cdf, u, right=True).clamp(max=cdf.numel() - 1)  # (n,)
        return Rollouts(
            self.sequences.to(device)[idx],
            self._pi_logp.to(device, dtype)[idx],
            self._mu_logp.to(device, dtype)[idx],
            self.seq_reward.to(device, dtype)[idx],
        )

    def score_vjp(self, tokens: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """(n, D): the gradient in theta of sum_t v_t log pi(a_t | t, a_{t-1}) per rollout: v_t (onehot(a_t) -
        pi(. | t, a_{t-1})) lands in row (t, a_{t-1})."""
        n, T, V = tokens.shape[0], self.horizon, self.vocab
        prev = self._prev(tokens)  # (n, T)
        probs = torch.softmax(self.pi_logits, -1).to(v.device, v.dtype)[torch.arange(T, device=v.device), prev]
        delta = v[..., None] * (F.one_hot(tokens, V).to(v.dtype) - probs)  # (n, T, V)
        out = torch.zeros(n, T, V, V, dtype=v.dtype, device=v.device)
        out.scatter_(2, prev[:, :, None, None].expand(n, T, 1, V), delta[:, :, None, :])
        return out.view(n, T * V * V)

    def _gradient_at(self, theta: torch.Tensor) -> torch.Tensor:
        theta = theta.detach().clone().requires_grad_()
        J = (self.logprobs(self.sequences, theta).sum(-1).exp() * self.seq_reward).sum()
        (grad,) = torch.autograd.grad(J, theta)
        return grad

    def value(self) -> float:
        """J = E_pi[reward], summed over every sequence."""
        return float((self._pi_logp.sum(-1).exp() * self.seq_reward).sum())

    def true_gradient(self) -> torch.Tensor:
        """(D,) float64, exact: dJ/dtheta of J = sum over all V^T sequences x of pi(x) R(x), by autograd."""
        return self._gradient_at(self.theta)

    def with_lag(self, lag: int, lr: float = 1.0) -> TabularAR:
        """Same pi; mu = pi walked back `lag` steps of gradient ascent (step lr) along the exact gradient."""
        theta_mu = _walk_back(self.theta, self._gradient_at, lag, lr)
        return TabularAR(self.vocab, self.horizon, seed=self.seed, reward=self.seq_reward,
                         pi_logits=self.pi_logits, mu_logits=theta_mu.view_as(self.pi_logits))

    def enumerate(self) -> tuple[Rollouts, torch.Tensor]:
        """Every one of the V^T sequences as Rollouts, and its probability under mu."""
        return Rollouts(self.sequences, self._pi_logp, self._mu_logp, self.seq_reward), self._mu_logp.sum(-1).exp()


# ---------------------------------------------------------------------------------------------------------
# the gradient of an estimator's loss, per rollout


def _pairs(estimators, cfg: Config | None = None) -> list[tuple[str, Config]]:
    """Names, (name, cfg) pairs or a {name: cfg} dict -> validated (name, cfg) pairs."""
    if isinstance(estimators, str):
        estimators = [(estimators, cfg)]
    items = estimators.items() if isinstance(estimators, dict) else estimators
    pairs = [(e, None) if isinstance(e, str) else tuple(e) for e in items]
    return [(name, resolve_config(name, c)) for name, c in pairs]


def _contributions(chain, rollouts: Rollouts, pairs, baseline_group: int | None):
    """For each estimator, the (n, D) per-rollout gradient estimates: minus d loss / d theta of the
    estimator's seq-mean-token-sum loss, times n (so a batch's estimate is the mean of its rows).

    The loss goes through `run_many` and autograd gives d loss / d trainer_logprobs (n, T); the chain's
    score maps it to theta. One Ratios serves every estimator."""
    batch = rollouts.to_batch(baseline_group=baseline_group, requires_grad=True)
    logp, n = batch.trainer_logprobs, len(rollouts)
    ratios = Ratios.of(batch)
    for name, cfg in pairs:
        out = run_many([(name, cfg)], batch, agg=AGG, ratios=ratios)[name]
        (dlogp,) = torch.autograd.grad(out.loss, logp, allow_unused=True)
        dlogp = torch.zeros_like(logp) if dlogp is None else dlogp  # (n, T) = -weights * adv_tau * A / n
        yield name, cfg, out, chain.score_vjp(rollouts.tokens, -n * dlogp)  # (n, D)


def expected_gradient(chain, name: str, cfg: Config | None = None) -> torch.Tensor:
    """(D,) float64: the exact expectation under mu of the estimator's single-rollout gradient estimate (no
    baseline), summing over every sequence weighted by mu (chains with `enumerate`, e.g. TabularAR or a
    BitChain with H <= 20). Compare with `true_gradient()` for the exact bias."""
    rollouts, prob_mu = chain.enumerate()
    (_, _, _, c), = _contributions(chain, rollouts, _pairs(name, cfg), None)
    return (prob_mu[:, None] * c).sum(0)


# ---------------------------------------------------------------------------------------------------------
# Monte Carlo


@dataclass(eq=False)
class MCResult:
    """What `monte_carlo` returns (tensors are float64 on the CPU).

    mean          (D,) mean gradient estimate over batches;  true: (D,) the exact gradient
    stderr        (D,) standard error of `mean`, per parameter
    bias2         ||mean - true||^2 (it includes a noise floor of variance / n_batches)
    variance      mean over batches of ||g_b - mean||^2;  mse: mean of ||g_b - true||^2 = bias2 + variance
    stderr_bias2 / stderr_variance / stderr_mse   their standard errors (delta method / over batches)
    batch_errors  (n_batches,) ||g_b - true||^2;  batch_norms: (n_batches,) ||g_b||  (numpy, for plots)
    grads         (n_batches, D) every g_b, kept when n_batches * D <= 2^22 (else None)
    metrics       the estimator's metrics (is_masked, is_clipped, ...) averaged over every rollout
    seconds       wall time of the whole run (shared by the estimators of one monte_carlo_many call)
    """

    estimator: str
    config: Config
    mean: torch.Tensor
    true: torch.Tensor
    stderr: torch.Tensor
    bias2: float
    variance: float
    mse: float
    stderr_bias2: float
    stderr_variance: float
    stderr_mse: float
    batch_errors: np.ndarray
    batch_norms: np.ndarray
    batch_size: int
    n_batches: int
    baseline: bool
    seconds: float
    metrics: dict[str, float] = field(default_factory=dict)
    grads: torch.Tensor | None = None

    @property
    def noise_floor(self) -> float:
        """variance / n_batches: the expected bias2 of an unbiased estimator."""
        return self.variance / self.n_batches

    @property
    def relative_bias(self) -> float:
        """||mean - true|| / ||true||."""
        return math.sqrt(self.bias2) / max(float(self.true.norm()), 1e-300)

    @property
    def cosine(self) -> float:
        """Cosine between the mean estimate and the true gradient."""
        return float(F.cosine_similarity(self.mean, self.true, dim=0, eps=1e-300))

    @property
    def rollouts_per_s(self) -> float:
        return self.batch_size * self.n_batches / max(self.seconds, 1e-9)

    def record(self) -> dict:
        """One flat row for a DataFrame."""
        return {
            "estimator": self.estimator,
            "batch_size": self.batch_size,
            "n_batches": self.n_batches,
            "baseline": self.baseline,
            "bias2": self.bias2,
            "variance": self.variance,
            "mse": self.mse,
            "stderr_bias2": self.stderr_bias2,
            "stderr_variance": self.stderr_variance,
            "stderr_mse": self.stderr_mse,
            "noise_floor": self.noise_floor,
            "relative_bias": self.relative_bias,
            "cosine": self.cosine,
            "true_norm": float(self.true.norm()),
            "mean_norm": float(self.mean.norm()),
            "seconds": self.seconds,
            "config": repr(self.config),
            **self.metrics,
        }


_KEEP_GRADS = 1 << 22


class _Stats:
    """Running sums of per-batch estimates g (nb, D): sum, second-moment matrix, per-batch errors."""

    def __init__(self, true: torch.Tensor, device):
        D = true.numel()
        self.true = true.to(device)
        self.n = 0
        self.sum = torch.zeros(D, dtype=torch.float64, device=device)
        self.m2 = torch.zeros(D, D, dtype=torch.float64, device=device)
        self.errors, self.norms, self.grads = [], [], []
        self.metrics: dict[str, float] = {}
        self.rows = 0

    def add(self, g: torch.Tensor, metrics: dict[str, float], rows: int, keep: bool):
        g = g.to(torch.float64)  # (nb, D)
        self.n += g.shape[0]
        self.sum += g.sum(0)
        self.m2 += g.T @ g
        self.errors.append(((g - self.true) ** 2).sum(-1))
        self.norms.append(g.norm(dim=-1))
        if keep:
            self.grads.append(g)
        for k, v in metrics.items():  # rollout-weighted running mean
            self.metrics[k] = self.metrics.get(k, 0.0) + (v - self.metrics.get(k, 0.0)) * rows / (self.rows + rows)
        self.rows += rows

    def result(self, name, cfg, batch_size, baseline, seconds) -> MCResult:
        nb = self.n
        mean = (self.sum / nb).cpu()
        true = self.true.cpu()
        cov = (self.m2.cpu() / nb - torch.outer(mean, mean))  # (D, D) population covariance of g_b
        variance = float(cov.trace().clamp(min=0))
        d = mean - true
        bias2 = float(d @ d)
        errors = torch.cat(self.errors).cpu().numpy()
        ddof = max(nb - 1, 1)
        stderr = (cov.diagonal().clamp(min=0) / ddof).sqrt()
        grads = torch.cat(self.grads).cpu() if self.grads else None
        if grads is not None:
            dev2 = ((grads - mean) ** 2).sum(-1)  # (nb,) ||g_b - mean||^2
            stderr_variance = float(dev2.std() / math.sqrt(nb)) if nb > 1 else math.nan
        else:  # ||g_b - true||^2 spreads like ||g_b - mean||^2 when the bias is small
            stderr_variance = float(errors.std(ddof=1) / math.sqrt(nb)) if nb > 1 else math.nan
        return MCResult(
            estimator=name,
            config=cfg,
            mean=mean,
            true=true,
            stderr=stderr,
            bias2=bias2,
            variance=variance,
            mse=bias2 + variance,
            # ||mean - true||^2 with mean ~ N(true + d, cov / nb): Var = 4 d' cov d / nb + 2 tr(cov^2) / nb^2
            stderr_bias2=math.sqrt(max(4 * float(d @ cov @ d) / ddof + 2 * float((cov * cov).sum()) / ddof**2, 0.0)),
            stderr_variance=stderr_variance,
            stderr_mse=float(errors.std(ddof=1) / math.sqrt(nb)) if nb > 1 else math.nan,
            batch_errors=errors,
            batch_norms=torch.cat(self.norms).cpu().numpy(),
            batch_size=batch_size,
            n_batches=nb,
            baseline=baseline,
            seconds=seconds,
            metrics=dict(self.metrics),
            grads=grads,
        )


def _chunk_rows(chain, unit: int, total: int, memory_budget: int, itemsize: int) -> int:
    """Rollouts per chunk: a multiple of `unit` (whole batches) whose tensors fit the memory budget."""
    per_rollout = itemsize * (40 * chain.horizon + 4 * chain.dim)  # live [n, T] and [n, D] tensors, roughly
    rows = max(unit, memory_budget // per_rollout // unit * unit)
    return min(rows, total)


def _simulate(chain, pairs, *, batch_sizes: Sequence[int], n_rows: int, seed: int, device, dtype,
              baseline: bool, memory_budget: int | None, progress: Progress | None, label: str = "") -> dict:
    """Draw n_rows rollouts from mu in chunks and accumulate, for every estimator and every batch size B,
    the statistics of the per-batch estimates (consecutive groups of B rollouts)."""
    device = torch.device(device) if device is not None else torch.device("cpu")
    unit = math.lcm(*batch_sizes)
    if baseline and len(batch_sizes) > 1:
        raise ValueError("a baseline is per batch: run one batch size at a time")
    true = chain.true_gradient()
    stats = {(i, B): _Stats(true, device) for i in range(len(pairs)) for B in batch_sizes}
    keep = {B: (n_rows // B) * chain.dim <= _KEEP_GRADS for B in batch_sizes}
    gen = torch.Generator(device=device).manual_seed(int(seed))
    if memory_budget is None:
        memory_budget = DEFAULT_BUDGET[device.type == "cuda"]
    rows = _chunk_rows(chain, unit, n_rows, memory_budget, torch.finfo(dtype).bits // 8)
    start, done = time.perf_counter(), 0
    while done < n_rows:
        n = min(rows, n_rows - done)
        rollouts = chain.sample(n, gen, device, dtype)
        contribs = _contributions(chain, rollouts, pairs, batch_sizes[0] if baseline else None)
        for i, (_, _, out, c) in enumerate(contribs):
            metrics = {k: float(v) for k, v in out.metrics.items()}
            for B in batch_sizes:
                g = c.view(n // B, B, -1).mean(1)  # (n / B, D) per-batch estimates
                stats[i, B].add(g, metrics, n, keep[B])
        done += n
        if progress is not None:
            progress(done / n_rows, f"{label}{done:,} / {n_rows:,} rollouts")
    seconds = time.perf_counter() - start
    return {key: s.result(pairs[key[0]][0], pairs[key[0]][1], key[1], baseline, seconds) for key, s in stats.items()}


def _check(batch_size: int, n_batches: int):
    if int(batch_size) < 1 or int(n_batches) < 1:
        raise ValueError(f"batch_size and n_batches must be >= 1, got {batch_size} and {n_batches}")


def monte_carlo_many(chain, estimators, *, batch_size: int, n_batches: int, seed: int = 0, device=None,
                     baseline: bool = False, progress: Progress | None = None, memory_budget: int | None = None,
                     dtype: torch.dtype = torch.float64) -> list[MCResult]:
    """`monte_carlo` for several estimators on the same rollouts (common random numbers: their
    differences are sharper than independent runs'). `estimators`: names, (name, cfg) pairs or a dict."""
    _check(batch_size, n_batches)
    pairs = _pairs(estimators)
    res = _simulate(chain, pairs, batch_sizes=(int(batch_size),), n_rows=int(batch_size) * int(n_batches),
                    seed=seed, device=device, dtype=dtype, baseline=baseline, memory_budget=memory_budget,
                    progress=progress)
    return [res[i, int(batch_size)] for i in range(len(pairs))]


def monte_carlo(chain, name: str, cfg: Config | None = None, *, batch_size: int, n_batches: int, seed: int = 0,
                device=None, baseline: bool = False, progress: Progress | None = None,
                memory_budget: int | None = None, dtype: torch.dtype = torch.float64) -> MCResult:
    """Sample n_batches batches of batch_size rollouts from the chain's mu, estimate the gradient from each
    with estimator `name` (minus the gradient in theta of its seq-mean-token-sum loss, A = reward, or
    reward - batch mean with `baseline=True`, as a GRPO-style baseline does), and compare with the exact
    gradient. Runs on `device` (default CPU; "cuda" when asked), in chunks of whole batches within
    `memory_budget` bytes (default 64 MiB on CPU, 2 GiB on CUDA). The same seed, device and budget give
    the same result (on CPU the budget changes only the rounding).
    `progress(fraction, message)` is called after each chunk."""
    return monte_carlo_many(chain, [(name, cfg)], batch_size=batch_size, n_batches=n_batches, seed=seed,
                            device=device, baseline=baseline, progress=progress, memory_budget=memory_budget,
                            dtype=dtype)[0]


# ---------------------------------------------------------------------------------------------------------
# sweeps: one row per (estimator, x)


def _sub(progress: Progress | None, i: int, n: int, what: str) -> Progress | None:
    """A progress callback for step i of n, mapped into [i / n, (i + 1) / n]."""
    if progress is None:
        return None
    return lambda f, msg: progress((i + f) / n, f"{what}: {msg}")


def _frame(rows: list[dict]) -> pd.DataFrame:
    df = pd.DataFrame(rows)
    first = ["estimator", "sweep", "x", "bias2", "variance", "mse", "stderr_bias2", "stderr_variance", "stderr_mse"]
    return df[[c for c in first if c in df] + [c for c in df if c not in first]]


def sweep_knob(chain, name: str, knob: str, values: Iterable[float], cfg: Config | None = None, *,
               progress: Progress | None = None, **mc_kwargs) -> pd.DataFrame:
    """One estimator with one knob set to each value in turn (the other knobs from cfg), all on the same
    rollouts. Columns: estimator, sweep (the knob), x (its value), bias2, variance, mse, stderr_*, ..."""
    base = resolve_config(name, cfg)
    if knob not in base.as_dict():
        raise ValueError(f"{name} has no knob {knob!r}; its knobs: {', '.join(base.as_dict()) or 'none'}")
    values = list(values)
    pairs = [(name, base.replace(**{knob: v})) for v in values]
    results = monte_carlo_many(chain, pairs, progress=_sub(progress, 0, 1, f"{name}.{knob}"), **mc_kwargs)
    return _frame([{**r.record(), "sweep": knob, "x": v} for v, r in zip(values, results, strict=True)])


def sweep_batch_size(chain, estimators, sizes: Iterable[int], *, n_batches: int = 200, seed: int = 0,
                     device=None, baseline: bool = False, progress: Progress | None = None,
                     memory_budget: int | None = None, dtype: torch.dtype = torch.float64) -> pd.DataFrame:
    """MSE against batch size B: n_batches * max(sizes) rollouts (rounded up to whole batches of every
    size) drawn once and regrouped into batches of each size, so every size sees the same rollouts.
    The frontier is MSE(B) = bias^2 + Var(1) / B: a biased estimator plateaus at bias^2, sequence IS
    keeps falling. Column `frontier` is that curve from the smallest size's variance. With a baseline the
    advantages depend on the batch, so each size gets its own rollouts."""
    sizes = sorted({int(b) for b in sizes})
    _check(min(sizes), n_batches)
    pairs = _pairs(estimators)
    kw = dict(seed=seed, device=device, dtype=dtype, baseline=baseline, memory_budget=memory_budget)
    if baseline:
        res = {}
        for j, B in enumerate(sizes):
            part = _simulate(chain, pairs, batch_sizes=(B,), n_rows=B * n_batches,
                             progress=_sub(progress, j, len(sizes), f"B={B}"), **kw)
            res.update(part)
    else:
        unit = math.lcm(*sizes)
        if unit > 1 << 16:
            raise ValueError(f"batch sizes {sizes} have a least common multiple of {unit}: use sizes that divide "
                             "one another (e.g. powers of two)")
        n_rows = -(-n_batches * max(sizes) // unit) * unit
        res = _simulate(chain, pairs, batch_sizes=tuple(sizes), n_rows=n_rows, progress=progress, **kw)
    rows = []
    for i in range(len(pairs)):
        b0 = res[i, sizes[0]]
        for B in sizes:
            r = res[i, B]
            frontier = r.bias2 + b0.variance * b0.batch_size / B
            rows.append({**r.record(), "sweep": "batch_size", "x": B, "frontier": frontier})
    return _frame(rows)


def _sweep_chains(chains: list, xs: list, what: str, estimators, progress, mc_kwargs) -> pd.DataFrame:
    rows = []
    for j, (x, chain) in enumerate(zip(xs, chains, strict=True)):
        results = monte_carlo_many(chain, estimators, progress=_sub(progress, j, len(xs), f"{what}={x}"),
                                   **mc_kwargs)
        rows += [{**r.record(), "sweep": what, "x": x, "chain": repr(chain)} for r in results]
    return _frame(rows)


def sweep_horizon(chain: BitChain, estimators, horizons: Iterable[int], *, progress: Progress | None = None,
                  **mc_kwargs) -> pd.DataFrame:
    """The chain at each horizon (threshold scaled with it, `BitChain.with_horizon`); the estimators share
    rollouts at each horizon. Sequence IS's variance grows like (1 + chi2)^H."""
    horizons = [int(h) for h in horizons]
    return _sweep_chains([chain.with_horizon(h) for h in horizons], horizons, "horizon", estimators, progress,
                         mc_kwargs)


def sweep_lag(chain, estimators, lags: Iterable[int], *, lr: float = 1.0, progress: Progress | None = None,
              **mc_kwargs) -> pd.DataFrame:
    """The chain with its sampler `lag` updates stale (`chain.with_lag(lag, lr)`; lag 0 is on-policy)."""
    lags = [int(k) for k in lags]
    return _sweep_chains([chain.with_lag(k, lr=lr) for k in lags], lags, "lag", estimators, progress, mc_kwargs)
