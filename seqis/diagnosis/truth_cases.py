"""Batches with known bad rollouts, to hold the advice to a truth: does its suggestion drop the bad and keep the good?

Each case starts from the valid-IS Gaussian scenario (per-token noise s, the engine's precision: every rollout is
good) and spoils some rollouts in a way a real stack does (seqis.samplers.scenarios makes every part):

  catastrophic   `n_bad` rollouts each get one catastrophic token, |l| = `size` nats, signs alternating (a kernel
                 bug: the sampler emits a token the trainer finds absurd, or the other way round)
  drifted        one GRPO group's sampler runs at another ratio: every token of its rollouts gets l + log r (a
                 group sampled by a drifted engine, a wrong temperature for one environment)
  lagged         one GRPO group comes from a sampler `lag` trust-region steps behind the trainer (the policy_lag
                 scenario's tokens in its rows: a stale worker)
  clean          nothing spoilt: what a correction drops here it drops from good rollouts

`score(kept, case)` says what a correction's kept mask (effectively kept: seqis.diagnosis.summaries) does with
them: the share of the bad rollouts' loss tokens it drops (recall of the bad), the share of the catastrophic
tokens themselves it drops, and the share of the good rollouts' loss tokens it keeps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..core.types import Batch
from ..samplers.scenarios import make_batch

CASES = ("catastrophic", "drifted", "lagged")  # "clean" too (make_case): no bad rollout, for what is lost anyway
SHAPE = dict(n_rollouts=64, group_size=8, lengths="uniform", min_len=64, max_len=512)  # the 64 rollouts


@dataclass(frozen=True)
class Case:
    """A batch and its truth."""

    name: str
    batch: Batch
    bad: torch.Tensor  # (B,) bool: the spoilt rollouts
    bad_tokens: torch.Tensor  # (B, T) bool: the catastrophic tokens (all False for a group's fault)


def _clean(seed: int, s: float) -> Batch:
    return make_batch("gaussian", seed=seed, s=s, **SHAPE)


def catastrophic(seed: int = 0, s: float = 0.04, n_bad: int = 3, size: float = 20.0) -> Case:
    """`n_bad` rollouts with one catastrophic token each (positions and rollouts drawn from the seed)."""
    b = _clean(seed, s)
    g = torch.Generator().manual_seed(10_000 + seed)
    tl, il = b.trainer_logprobs.clone(), b.inference_logprobs.clone()
    rows = torch.randperm(b.shape[0], generator=g)[:n_bad]  # (n_bad,)
    tokens = torch.zeros(b.shape, dtype=torch.bool)
    for k, j in enumerate(rows.tolist()):
        pos = b.loss_mask[j].nonzero().squeeze(1)  # (T_j,)
        t = int(pos[torch.randint(len(pos), (1,), generator=g)])
        tokens[j, t] = True
        if k % 2:  # l = +size: the sampler found the token absurd (lowered log mu keeps both log-probs <= 0)
            il[j, t] -= size
        else:  # l = -size: the trainer does
            tl[j, t] -= size
    bad = torch.zeros(b.shape[0], dtype=torch.bool)
    bad[rows] = True
    return Case("catastrophic", Batch(tl, il, b.advantages, b.loss_mask, b.metadata), bad, tokens)


def _group_rows(b: Batch, group: int) -> torch.Tensor:
    return torch.tensor([gid == group for gid in b.metadata["group_id"]])  # (B,)


def drifted(seed: int = 0, s: float = 0.04, ratio: float = 0.98, group: int = 3) -> Case:
    """One GRPO group whose every token's ratio is off by `ratio` beside the noise."""
    b = _clean(seed, s)
    rows = _group_rows(b, group)
    shift = math.log(ratio)  # l moves by this on the group's tokens
    spoil = rows[:, None] & b.loss_mask  # (B, T)
    tl, il = b.trainer_logprobs.clone(), b.inference_logprobs.clone()
    if shift < 0:  # lower the trainer's log-prob (both stay <= 0)
        tl = torch.where(spoil, tl + shift, tl)
    else:
        il = torch.where(spoil, il - shift, il)
    return Case("drifted", Batch(tl, il, b.advantages, b.loss_mask, b.metadata), rows,
                torch.zeros(b.shape, dtype=torch.bool))


def lagged(seed: int = 0, s: float = 0.04, lag: int = 16, group: int = 3) -> Case:
    """One GRPO group from a sampler `lag` steps behind: the policy_lag scenario's tokens in the group's rows."""
    b = _clean(seed, s)
    stale = make_batch("policy_lag", seed=seed, lag=lag, **SHAPE)
    if not bool((stale.loss_mask == b.loss_mask).all()):
        raise RuntimeError("the policy_lag scenario drew other lengths than the gaussian one at this seed")
    rows = _group_rows(b, group)[:, None]  # (B, 1)
    tl = torch.where(rows, stale.trainer_logprobs, b.trainer_logprobs)
    il = torch.where(rows, stale.inference_logprobs, b.inference_logprobs)
    return Case("lagged", Batch(tl, il, b.advantages, b.loss_mask, b.metadata), rows.squeeze(1),
                torch.zeros(b.shape, dtype=torch.bool))


def clean(seed: int = 0, s: float = 0.04) -> Case:
    """No bad rollout: what a correction drops here it drops from good rollouts."""
    b = _clean(seed, s)
    return Case("clean", b, torch.zeros(b.shape[0], dtype=torch.bool), torch.zeros(b.shape, dtype=torch.bool))


MAKERS = {"catastrophic": catastrophic, "drifted": drifted, "lagged": lagged, "clean": clean}


def make_case(name: str, seed: int = 0, **kw) -> Case:
    if name not in MAKERS:
        raise ValueError(f"case must be one of {', '.join(MAKERS)}, got {name!r}")
    return MAKERS[name](seed=seed, **kw)


@torch.no_grad()
def score(kept: torch.Tensor, case: Case) -> dict[str, float]:
    """What a (B, T) kept mask does with the case's truth: bad_dropped (share of the bad rollouts' loss tokens
    dropped), tokens_dropped (share of the catastrophic tokens dropped; nan without any), good_kept (share of the
    good rollouts' loss tokens kept)."""
    m = case.batch.loss_mask
    bad_tok = m & case.bad[:, None]  # (B, T)
    good_tok = m & ~case.bad[:, None]
    n_cat = int(case.bad_tokens.sum())
    return {"bad_dropped": 1 - float((kept & bad_tok).sum()) / max(int(bad_tok.sum()), 1),
            "tokens_dropped": 1 - float((kept & case.bad_tokens).sum()) / n_cat if n_cat else math.nan,
            "good_kept": float((kept & good_tok).sum()) / max(int(good_tok.sum()), 1)}
