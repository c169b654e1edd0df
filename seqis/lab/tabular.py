"""A tabular autoregressive toy: state-dependent logits over V tokens and T positions, exact by enumeration."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from .chain import Rollouts, _Toy, _walk_back

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

    def seq_chi2(self) -> float:
        """chi2(pi || mu) of the whole sequence, E_mu[w^2] - 1 = sum_x pi(x)^2 / mu(x) - 1 over every sequence."""
        log_w2_mu = 2 * self._pi_logp.sum(-1) - self._mu_logp.sum(-1)  # (V^T,) log pi(x)^2 / mu(x)
        return float(torch.logsumexp(log_w2_mu, 0).expm1())

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


