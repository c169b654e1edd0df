"""How much score centering's tail model costs: the gradient's error against the exact one by head size (Marin's table).

Score centering sums over the sampler's top-K tokens (the head) and models the rest (the tail) by one ratio of tail
masses (seqis.core.compose.Centering). With the whole vocabulary as the head the tail is empty and the centered
gradient is exact; Marin measured how far the top-K gradient is from it (L1, relative) for K = 1 ... 128. This module
reproduces the measurement on a small generator with a full next-token distribution:

- `HeadLM`: a vocabulary of V tokens (default 1024), an LLM-like profile (a Zipf bias over a random ranking of the
  tokens, a successor token that takes most of the mass at a share of positions, the rest branching), the next
  token's logits a function of the previous token; the sampler adds Gaussian logit noise of sd `mismatch` (a
  synthetic mismatch, as Marin's 0.016) and draws the tokens; the reward is the share of a fixed set of "good"
  tokens, the advantage that minus the batch mean. `draw()` returns both full log-distributions.
- `head_batch(draw, K)`: the batch with the sampler's top-K head, the trainer's logits a leaf; `logit_gradient` is
  minus the gradient of a correction's loss in every position's logits (B, T, V), by autograd through the plain
  evaluator.
- `head_error_table`: for each K, the mean sampler tail mass 1 - Q_H and the L1 error of the K-head gradient against
  the whole-vocabulary one, relative to the whole gradient and to score centering's own term.

    table = head_error_table()        # K, tail_mass, l1_error (%), sc_l1_error (%), mismatch_l1
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..core.compose import Centering, Composition, Weight
from ..core.types import Batch
from ..registry import run

SC = Composition(Weight("none"), centering=Centering("none"))  # verl's bypass_pg_sc
TIS_SC = Composition(Weight("token", clip=2.0), centering=Centering("truncate", high=2.0))  # with Marin's cap 2
KS = (1, 4, 8, 32, 128)


@dataclass(frozen=True)
class HeadLM:
    """A generator with a full next-token distribution (module docstring). Every draw is seeded."""

    vocab: int = 1024
    positions: int = 32
    rollouts: int = 32
    mismatch: float = 0.016  # sd of the sampler's Gaussian logit noise
    dim: int = 16  # the embedding's width
    scale: float = 1.0  # how strongly the previous token shapes the logits
    zipf: float = 3.0  # the bias -zipf * log(rank + 1) over a random ranking (3: tails like Marin's, below)
    margin: tuple[float, float] = (3.0, 6.0)  # the successor's logit boost relu(m0 + m1 * N(0, 1)) per position
    world_seed: int = 0

    def __post_init__(self):
        if self.vocab < 2 or self.positions < 1 or self.rollouts < 2:
            raise ValueError(f"HeadLM needs vocab >= 2, positions >= 1, rollouts >= 2; got {self.vocab}, "
                             f"{self.positions}, {self.rollouts}")
        if not (self.mismatch >= 0 and math.isfinite(self.mismatch)):
            raise ValueError(f"HeadLM.mismatch must be a finite sd >= 0, got {self.mismatch}")

    def _world(self):
        g = torch.Generator().manual_seed(self.world_seed)
        V, d = self.vocab, self.dim
        emb = torch.randn(V, d, generator=g, dtype=torch.float64) / math.sqrt(d)
        unemb = torch.randn(V, d, generator=g, dtype=torch.float64)
        rank = torch.randperm(V, generator=g)
        bias = -self.zipf * torch.log(rank.double() + 1)  # (V,)
        succ = torch.randint(0, V, (V,), generator=g)  # the token each token makes likely next
        good = torch.randperm(V, generator=g)[: V // 4]  # the reward's tokens
        return emb, unemb, bias, succ, good

    def draw(self, seed: int = 0) -> dict[str, torch.Tensor]:
        """One batch: tokens (B, T), the trainer's and the sampler's full log-distributions log_p, log_q (B, T, V)
        float64 (the tokens drawn from q), advantages (B,)."""
        emb, unemb, bias, succ, good = self._world()
        g = torch.Generator().manual_seed(int(seed))
        B, T, V = self.rollouts, self.positions, self.vocab
        prev = torch.randint(0, V, (B,), generator=g)  # the prompt's last token
        log_p, log_q, tokens = [], [], []
        for _ in range(T):
            m0, m1 = self.margin
            boost = torch.relu(m0 + m1 * torch.randn(B, generator=g, dtype=torch.float64))  # (B,)
            z = self.scale * emb[prev] @ unemb.T + bias  # (B, V)
            z = z.scatter_add(1, succ[prev][:, None], boost[:, None])
            zq = z + self.mismatch * torch.randn(B, V, generator=g, dtype=torch.float64)
            lq = zq.log_softmax(-1)
            y = torch.multinomial(lq.exp(), 1, generator=g)[:, 0]  # (B,) drawn from the sampler
            log_p.append(z.log_softmax(-1))
            log_q.append(lq)
            tokens.append(y)
            prev = y
        tokens = torch.stack(tokens, 1)  # (B, T)
        reward = torch.isin(tokens, good).double().mean(-1)  # (B,)
        return {"tokens": tokens, "log_p": torch.stack(log_p, 1), "log_q": torch.stack(log_q, 1),
                "advantages": reward - reward.mean()}


def head_batch(draw: dict[str, torch.Tensor], K: int) -> tuple[Batch, torch.Tensor]:
    """(batch, logits): the draw as a Batch whose head is the sampler's top-K tokens at each position, the trainer's
    log-probs (sampled token's and head's) both read from `logits` (B, T, V), a leaf that requires grad."""
    V = draw["log_p"].shape[-1]
    if not 1 <= int(K) <= V:
        raise ValueError(f"K must lie in [1, vocab={V}], got {K}")
    logits = draw["log_p"].clone().requires_grad_()
    log_p = logits.log_softmax(-1)
    y = draw["tokens"][..., None]
    ids = draw["log_q"].topk(int(K), -1).indices  # (B, T, K)
    batch = Batch(log_p.gather(-1, y)[..., 0], draw["log_q"].gather(-1, y)[..., 0], draw["advantages"],
                  topk_ids=ids, topk_inference_logprobs=draw["log_q"].gather(-1, ids),
                  topk_trainer_logprobs=log_p.gather(-1, ids))
    return batch, logits


def logit_gradient(correction, draw: dict[str, torch.Tensor], K: int) -> torch.Tensor:
    """(B, T, V) minus the gradient of the correction's loss (token-mean) in every position's logits, the head the
    sampler's top-K."""
    batch, logits = head_batch(draw, K)
    (grad,) = torch.autograd.grad(run(correction, batch).loss, logits)
    return -grad


def tail_mass(draw: dict[str, torch.Tensor], K: int) -> float:
    """Mean over positions of the sampler's mass outside its top-K, 1 - Q_H."""
    head = draw["log_q"].topk(int(K), -1).values.exp().sum(-1)  # (B, T)
    return float((1 - head).clamp(min=0).mean())


def head_error_table(lm: HeadLM = HeadLM(), Ks: Sequence[int] = KS, correction=SC, seeds: Sequence[int] = (0,)):
    """For each K: the sampler's mean tail mass outside the top-K, and the L1 error of the K-head centered gradient
    (in the logits) against the whole-vocabulary one, in % of the whole gradient's L1 norm (l1_error) and of score
    centering's own term, the whole gradient minus the base correction's (sc_l1_error); summed over `seeds`' batches.
    The last row is K = vocab (error 0 by construction: the tail is empty). Also returns the mean |log-ratio| of the
    sampled tokens in `mismatch_l1`. Where score centering's term is 0 (a rule f = x that never bites: TIS whose cap
    no ratio reaches), both errors are 0 at every K and sc_l1_error is NaN."""
    import pandas as pd

    base = dataclasses.replace(correction, centering=None) if isinstance(correction, Composition) else None
    draws = [lm.draw(s) for s in seeds]
    exact = [logit_gradient(correction, d, lm.vocab) for d in draws]
    base_g = [logit_gradient(base, d, 1) for d in draws] if base is not None else None
    whole = sum(float(g.abs().sum()) for g in exact)
    sc = sum(float((g - b).abs().sum()) for g, b in zip(exact, base_g, strict=True)) if base_g else math.nan
    mismatch = sum(float((d["log_p"] - d["log_q"]).gather(-1, d["tokens"][..., None]).abs().mean())
                   for d in draws) / len(draws)
    rows = []
    for K in [*Ks, lm.vocab]:
        err = sum(float((logit_gradient(correction, d, K) - e).abs().sum()) for d, e in zip(draws, exact,
                                                                                              strict=True))
        rows.append({"K": int(K), "tail_mass": sum(tail_mass(d, K) for d in draws) / len(draws),
                     "l1_error": 100 * err / whole, "sc_l1_error": 100 * err / sc if sc > 1e-9 * whole else math.nan,
                     "mismatch_l1": mismatch})
    return pd.DataFrame(rows)


__all__ = ["HeadLM", "KS", "SC", "TIS_SC", "head_batch", "head_error_table", "logit_gradient", "tail_mass"]
