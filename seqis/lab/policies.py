"""The toys as R policies at once, for training: exact J and gradient, lagged rollouts, the score map.

A trainer holds R parameter vectors theta (R, D) float64 (one per run: estimator x lag x seed) and asks:

    value_and_gradient(theta)            J (R,) and dJ/dtheta (R, D), exact, float64
    rollouts(theta, theta_mu, draw, n)   n rollouts per run from the sampler theta_mu (R, D): tokens,
                                         log pi and log mu (R, n, T) in `dtype`, reward (R, n)
    enumerate(theta, theta_mu)           every sequence with its probability under the sampler (R, N)
    score(tokens, coef, theta)           (R, D): the gradient in theta of sum_{b,t} coef_bt log pi(a_bt)

`draw(stream, shape)` gives (R, *shape) uniforms from the trainer's per-seed random streams.

A sampler fault (`SamplerFault`) sits on top of the lag: `precision` adds uniform logit noise of standard
deviation eps (seqis.samplers.scenarios.PRECISION_EPS: fp16 0.0125, bf16 0.1, fp8 0.4) to every sampled token's
logit, a fresh draw per token, and reports the noisy log-probability (a valid IS model: mu is what the
noisy engine samples); `top_p` < 1 renormalises each sampling step over its nucleus (the smallest set of
tokens whose probability reaches top_p), so tokens outside it are never sampled (sequence IS then loses
the gradient they would carry); `logit_bias` b samples every bit from sigmoid(theta + b), a systematically
miscalibrated engine (the setting where score centering's drift shows, seqis.lab.centering). BitChain takes all
three; TabularAR takes top_p.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..samplers.scenarios import PRECISION_EPS
from .chain import BitChain
from .fixed import pointwise
from .poisson_binomial import value_and_gradient
from .tabular import TabularAR


@dataclass(frozen=True)
class SamplerFault:
    """A fault of the inference engine on top of policy lag (None / 1.0: no fault)."""

    precision: str | None = None  # "fp16" | "bf16" | "fp8": uniform logit noise of sd eps per sampled token
    top_p: float = 1.0  # nucleus sampling: tokens outside the top-p set are never sampled
    logit_bias: float = 0.0  # BitChain: the sampler's logit of a one is the policy's plus this (a biased engine)

    def __post_init__(self):
        if self.precision is not None and self.precision not in PRECISION_EPS:
            raise ValueError(f"precision must be None or one of {', '.join(PRECISION_EPS)}, got {self.precision!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must lie in (0, 1], got {self.top_p}")
        if not math.isfinite(self.logit_bias):
            raise ValueError(f"logit_bias must be finite, got {self.logit_bias}")

    @property
    def active(self) -> bool:
        return self.precision is not None or self.top_p < 1.0 or self.logit_bias != 0.0


def _nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """probs (..., V) renormalised over the top-p nucleus of each row (ties broken by token order)."""
    if top_p >= 1.0:
        return probs
    sorted_p, order = probs.sort(dim=-1, descending=True, stable=True)
    before = sorted_p.cumsum(-1) - sorted_p  # mass of the tokens ranked above
    keep = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, order, before < top_p)
    kept = torch.where(keep, probs, 0.0)
    return kept / kept.sum(-1, keepdim=True)


class ChainPolicy:
    """BitChain: theta (R, H) are the logits of P(a_t = 1); reward f(count) from the chain."""

    def __init__(self, chain: BitChain, fault: SamplerFault | None = None):
        self.chain, self.fault = chain, fault or SamplerFault()
        self.horizon = self.dim = chain.horizon
        self.n_sequences = 1 << chain.horizon  # what batch_size=None enumerates
        self.count_reward = chain.count_reward  # (H + 1,)

    def theta0(self) -> torch.Tensor:
        return torch.logit(self.chain.p)  # (H,) float64

    def value_and_gradient(self, theta: torch.Tensor, gradient: bool = True):
        p = pointwise(torch.sigmoid, theta)  # (R, H); pointwise: a run's bits whatever R is (seqis.lab.fixed)
        J, dJdp = value_and_gradient(p, self.count_reward, gradient=gradient)
        return J, (dJdp * p * (1 - p) if gradient else None)

    def _sampler(self, theta_mu: torch.Tensor, draw, n: int, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(R, n, H) or (R, 1, H) float64 probabilities of a one under the faulty sampler."""
        logits = theta_mu[:, None, :] + self.fault.logit_bias  # (R, 1, H)
        if self.fault.precision is not None:  # uniform noise of sd eps: eps sqrt(3) (2u - 1)
            eps = PRECISION_EPS[self.fault.precision]
            u = draw("precision", (n, self.horizon)).to(torch.float64)  # (R, n, H)
            logits = logits + eps * math.sqrt(3.0) * (2 * u - 1)
        q = pointwise(torch.sigmoid, logits)
        top_p = self.fault.top_p
        if top_p < 1.0:  # the majority bit alone is the nucleus once its probability reaches top_p
            q = torch.where(q >= top_p, 1.0, torch.where(1 - q >= top_p, 0.0, q))
        return q

    def rollouts(self, theta: torch.Tensor, theta_mu: torch.Tensor, draw, n: int, dtype: torch.dtype):
        u = draw("tokens", (n, self.horizon)).to(dtype)  # (R, n, H)
        if not self.fault.active:  # log P(a) = log sigmoid(-theta) + a theta: one fused pass per policy
            q = pointwise(torch.sigmoid, theta_mu).to(dtype)[:, None, :]  # (R, 1, H)
            a = (u < q).to(dtype)  # (R, n, H) 0/1
            logq = torch.addcmul(pointwise(F.logsigmoid, -theta_mu).to(dtype)[:, None], a, theta_mu.to(dtype)[:, None])
        else:
            q = self._sampler(theta_mu, draw, n, dtype)
            hit = u < q.to(dtype)
            a = hit.to(dtype)
            logq = torch.where(hit, pointwise(torch.log, q), pointwise(torch.log1p, -q)).to(dtype)  # never impossible
        logp = torch.addcmul(pointwise(F.logsigmoid, -theta).to(dtype)[:, None], a, theta.to(dtype)[:, None])  # (R,n,H)
        reward = self.count_reward.to(a.device, dtype)[a.sum(-1).long()]  # (R, n)
        return a, logp, logq, reward

    def enumerate(self, theta: torch.Tensor, theta_mu: torch.Tensor, dtype: torch.dtype):
        """Every one of the 2^H sequences (H <= 16) for every run, and its probability under the sampler."""
        H = self.horizon
        if H > 16:
            raise ValueError(f"batch_size=None enumerates 2^H sequences: it needs horizon <= 16, got {H}")
        if self.fault.precision is not None:
            raise ValueError("batch_size=None has no exact form under a precision fault (its noise is per token)")
        R, N = theta.shape[0], 1 << H
        bits = ((torch.arange(N, device=theta.device)[:, None] >> torch.arange(H - 1, -1, -1, device=theta.device))
                & 1).to(dtype)  # (N, H)
        a = bits.expand(R, N, H)
        q = self._sampler(theta_mu, None, 1, dtype)  # (R, 1, H)
        hit = a.bool()
        logq64 = torch.where(hit, pointwise(torch.log, q), pointwise(torch.log1p, -q))  # (R, N, H), -inf: cannot go
        prob = pointwise(torch.exp, logq64.sum(-1))  # (R, N)
        logq = torch.where(prob[..., None] > 0, logq64, 0.0).to(dtype)  # impossible rollouts carry weight 0
        logp = torch.addcmul(pointwise(F.logsigmoid, -theta).to(dtype)[:, None], a, theta.to(dtype)[:, None])
        reward = self.count_reward.to(a.device, dtype)[a.sum(-1).long()]
        return a, logp, logq, reward, prob

    def score(self, tokens: torch.Tensor, coef: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
        """d log pi(a_t) / d theta_t = a_t - p_t, so the gradient is sum_b coef (a - p)."""
        p = pointwise(torch.sigmoid, theta)  # (R, H)
        return (coef * tokens).sum(1).double() - p * coef.sum(1).double()  # (R, H)


class TabularPolicy:
    """TabularAR: theta (R, T V V) are the logits [position, previous token, token]; all V^T sequences are
    enumerated, so J and its gradient are exact sums (autograd through the log-softmax)."""

    def __init__(self, toy: TabularAR, fault: SamplerFault | None = None):
        self.toy, self.fault = toy, fault or SamplerFault()
        if self.fault.precision is not None or self.fault.logit_bias != 0.0:
            raise ValueError("TabularAR takes a top_p fault only (its precision noise would be per rollout state; "
                             "logit_bias is a bit's)")
        T, V = toy.horizon, toy.vocab
        self.horizon, self.dim, self.vocab, self.n_sequences = T, T * V * V, V, V**T
        seqs = toy.sequences  # (N, T)
        prev = torch.cat([torch.zeros_like(seqs[:, :1]), seqs[:, :-1]], 1)
        self._row = torch.arange(T) * V + prev  # (N, T) the softmax row (t, a_{t-1}) each token is drawn from
        self._index = self._row * V + seqs  # (N, T) the logit of each token, in theta's flat order
        self.sequences, self.seq_reward = seqs, toy.seq_reward

    def theta0(self) -> torch.Tensor:
        return self.toy.pi_logits.flatten()  # (D,)

    def _logp_table(self, theta: torch.Tensor) -> torch.Tensor:
        """(R, N, T) log pi(a_t | t, a_{t-1}) of every sequence."""
        T, V = self.horizon, self.vocab
        logsm = torch.log_softmax(theta.view(-1, T, V, V), -1).flatten(1)  # (R, D)
        return logsm[:, self._index.to(theta.device)]

    def value_and_gradient(self, theta: torch.Tensor, gradient: bool = True):
        with torch.enable_grad():
            th = theta.detach().clone().requires_grad_(gradient)
            # (R,); a sum, not a matmul: BLAS's order depends on R, and a seed must not (seqis.lab.train)
            J = (pointwise(torch.exp, self._logp_table(th).sum(-1)) * self.seq_reward.to(th.device)).sum(-1)
            grad = torch.autograd.grad(J.sum(), th)[0] if gradient else None
        return J.detach(), grad

    def _sampler_table(self, theta_mu: torch.Tensor) -> torch.Tensor:
        """(R, N, T) log mu of every sequence's tokens (-inf where top-p removes one)."""
        T, V = self.horizon, self.vocab
        probs = _nucleus(torch.softmax(theta_mu.view(-1, T, V, V), -1), self.fault.top_p).flatten(1)
        return pointwise(torch.log, probs)[:, self._index.to(theta_mu.device)]

    def rollouts(self, theta: torch.Tensor, theta_mu: torch.Tensor, draw, n: int, dtype: torch.dtype):
        logq_all = self._sampler_table(theta_mu)  # (R, N, T)
        cdf = pointwise(torch.exp, logq_all.sum(-1)).cumsum(-1)  # (R, N)
        u = draw("tokens", (n,)).to(torch.float64) * cdf[:, -1:]  # (R, n): one uniform per rollout
        idx = torch.searchsorted(cdf, u, right=True).clamp(max=cdf.shape[1] - 1)  # (R, n) sequence ids
        pick = idx[..., None].expand(-1, -1, self.horizon)  # (R, n, T)
        logp = self._logp_table(theta).gather(1, pick).to(dtype)
        logq = logq_all.gather(1, pick).to(dtype)
        reward = self.seq_reward.to(idx.device, dtype)[idx]
        return self.sequences.to(idx.device)[idx], logp, logq, reward

    def enumerate(self, theta: torch.Tensor, theta_mu: torch.Tensor, dtype: torch.dtype):
        logq64 = self._sampler_table(theta_mu)  # (R, N, T)
        prob = pointwise(torch.exp, logq64.sum(-1))  # (R, N)
        logq = torch.where(prob[..., None] > 0, logq64, 0.0).to(dtype)
        R = theta.shape[0]
        tokens = self.sequences.to(theta.device).expand(R, -1, -1)
        reward = self.seq_reward.to(theta.device, dtype).expand(R, -1)
        return tokens, self._logp_table(theta).to(dtype), logq, reward, prob

    def score(self, tokens: torch.Tensor, coef: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
        """coef_t (onehot(a_t) - pi(. | t, a_{t-1})) lands in softmax row (t, a_{t-1})."""
        T, V = self.horizon, self.vocab
        R = tokens.shape[0]
        prev = torch.cat([torch.zeros_like(tokens[..., :1]), tokens[..., :-1]], -1)  # (R, n, T)
        row = torch.arange(T, device=tokens.device) * V + prev  # (R, n, T)
        c = coef.double().flatten(1)
        onehot = torch.zeros(R, T * V * V, dtype=torch.float64, device=c.device)
        onehot.scatter_add_(1, (row * V + tokens).flatten(1), c)
        per_row = torch.zeros(R, T * V, dtype=torch.float64, device=c.device).scatter_add_(1, row.flatten(1), c)
        probs = torch.softmax(theta.view(R, T * V, V), -1)  # (R, T V, V)
        return onehot - (per_row[..., None] * probs).flatten(1)


def policy_of(chain, fault: SamplerFault | None = None):
    """The batched policy for a toy: BitChain or TabularAR."""
    if isinstance(chain, BitChain):
        return ChainPolicy(chain, fault)
    if isinstance(chain, TabularAR):
        return TabularPolicy(chain, fault)
    raise ValueError(f"train needs a BitChain or a TabularAR, got {type(chain).__name__}")
