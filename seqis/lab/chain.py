"""Huang's bit chain (reward 1[sum >= k], exact gradient by a dynamic program) and the rollouts toys sample."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..core.types import Batch

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


def binary_head(logp: torch.Tensor, logq: torch.Tensor) -> dict[str, torch.Tensor]:
    """The sampler's head of a two-token vocabulary (a bit chain's): at every position the whole vocabulary, slot 0
    the sampled token (log-probs logp, logq as given) and slot 1 the other (log(1 - p), log(1 - q)), so score
    centering's tail is empty and exact. A slot whose other token one policy cannot produce (probability 0) is left
    empty (id -1). Returns Batch's head fields (ids 0 = "the sampled token", 1 = "the other", not bit values)."""
    other_p, other_q = torch.log(-torch.expm1(logp)), torch.log(-torch.expm1(logq))  # log(1 - p), log(1 - q)
    can = torch.isfinite(other_p) & torch.isfinite(other_q)
    zero = logp.new_zeros(())
    ids = torch.stack([torch.zeros_like(can, dtype=torch.long), torch.where(can, 1, -1)], -1)  # (..., T, 2)
    return {"topk_ids": ids,
            "topk_inference_logprobs": torch.stack([logq, torch.where(can, other_q, zero)], -1),
            "topk_trainer_logprobs": torch.stack([logp, torch.where(can, other_p, zero)], -1)}


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

    def seq_chi2(self) -> float:
        """chi2(pi || mu) of the whole rollout, E_mu[w^2] - 1 = prod_t (p_t^2 / q_t + (1 - p_t)^2 / (1 - q_t)) - 1
        (the chi2 of Li's best clip C* = sqrt(2 (1 + chi2)))."""
        per_token = self.p**2 / self.q + (1 - self.p) ** 2 / (1 - self.q)  # (H,) E_mu[rho_t^2]
        return float(torch.expm1(torch.log(per_token).sum()))

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


