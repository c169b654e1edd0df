"""Loss tokens as small tables for the Diagnose page: an even sample, the worst ones, one rollout's.

Each table has one row per loss token: rollout, position, trainer_logprob, inference_logprob, log_ratio, and
entropy / token_id when the batch carries them (`batch.extras`). `shift` reads the inference log-probs that
many positions later, as `seqis.diagnosis.causes` does for a batch it finds misaligned.
"""

from __future__ import annotations

import pandas as pd
import torch

from ..core.types import Batch
from .causes import realign


def _table(batch: Batch, shift: int, pick) -> pd.DataFrame:
    trainer, inference, mask = realign(batch, shift)
    rows, pos = mask.nonzero(as_tuple=True)  # (N,) each, row-major
    l = trainer[rows, pos] - inference[rows, pos]  # (N,)
    idx = pick(l, rows)
    cols = {"rollout": rows[idx], "position": pos[idx], "trainer_logprob": trainer[rows[idx], pos[idx]],
            "inference_logprob": inference[rows[idx], pos[idx]], "log_ratio": l[idx]}
    for name, key in (("entropy", "entropy"), ("token_id", "token_ids")):
        if key in batch.extras:
            cols[name] = batch.extras[key].detach().cpu()[rows[idx], pos[idx]]
    return pd.DataFrame({k: v.numpy() for k, v in cols.items()})


def sample_tokens(batch: Batch, shift: int = 0, n: int = 4000) -> pd.DataFrame:
    """About n loss tokens, every k-th in row-major order (a fixed choice: the same batch, the same sample)."""
    return _table(batch, shift, lambda l, rows: torch.arange(0, l.numel(), max(1, l.numel() // n)))


def worst_tokens(batch: Batch, shift: int = 0, k: int = 20) -> pd.DataFrame:
    """The k loss tokens of largest |log-ratio|, largest first."""
    return _table(batch, shift, lambda l, rows: l.abs().topk(min(k, l.numel())).indices)


def rollout_tokens(batch: Batch, j: int, shift: int = 0) -> pd.DataFrame:
    """Rollout j's loss tokens in position order."""
    return _table(batch, shift, lambda l, rows: (rows == j).nonzero()[:, 0])


def worst_rollout(batch: Batch, shift: int = 0) -> int:
    """The rollout holding the largest |log-ratio| (the first such; 0 for a batch without loss tokens)."""
    trainer, inference, mask = realign(batch, shift)
    l = torch.where(mask, trainer - inference, 0.0).nan_to_num(0.0).abs()  # (B, T)
    return int(l.amax(-1).argmax()) if l.numel() else 0


def rollout_gains(batch: Batch, shift: int = 0) -> pd.DataFrame:
    """One row per rollout with loss tokens: its advantage (the mean over its tokens when advantages are per
    token), sum_t (rho_t - 1) and sum_t A_t (rho_t - 1), the policy-lag test's term (seqis.diagnosis.causes), with
    |l| clamped at 20 as there."""
    trainer, inference, mask = realign(batch, shift)
    rho = torch.where(mask, (trainer - inference).nan_to_num(0.0).clamp(-20.0, 20.0).exp() - 1, 0.0)  # (B, T)
    adv = batch.advantages.detach().cpu().float()
    adv = adv[:, None].expand_as(rho) if adv.dim() == 1 else adv  # (B, T)
    n = mask.sum(-1)  # (B,)
    rows = (n > 0).nonzero()[:, 0]
    mean_adv = torch.where(mask, adv, 0.0).sum(-1) / n.clamp(min=1)
    return pd.DataFrame({"rollout": rows.numpy(), "advantage": mean_adv[rows].numpy(),
                         "sum_rho_minus_1": rho.sum(-1)[rows].numpy(),
                         "gain": torch.where(mask, adv * rho, 0.0).sum(-1)[rows].numpy()})
