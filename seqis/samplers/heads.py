"""The sampler's top-k head for the batches seqis makes, so every page and test can run score centering
(DESIGN.md, "The sampler's head"; `Batch(topk_ids=..., topk_inference_logprobs=..., topk_trainer_logprobs=...)`).

Where the sampler has a whole distribution (policy_lag's and fp8_logits' tables, tiny_lm, the generators) the head is
exact: the sampler's K most likely tokens at each position, with both policies' log-probs of them, normalised over the
whole vocabulary (`top_k_head`); a token the sampler's truncation removed (log q = -inf) leaves its slot empty (-1).

The synthetic scenarios have no vocabulary. Their head (`synthetic_head`) is consistent rather than exact: slot 0 is
the sampled token (both log-probs exactly the batch's), slots 1..K-1 are K - 1 other tokens, and the rest of each
policy's mass (1 - q_y, 1 - p_y) is shared between them and a tail outside the head by one split per position:

    q_v = (1 - q_y) softmax(z)_v,    p_v = (1 - p_y) softmax(z + n)_v      v = the K - 1 others and the tail
    z_v ~ N(0, 1) (the tail's z shifted by log((K - 1) / 9): about a tenth of the rest lies outside the head)
    n_v ~ N(-sigma_v^2 / 2, sigma_v^2), sigma_v the scenario's per-token mismatch at that token's probability

so Q_H, P_H < 1 always, p = q on every slot when the scenario has no mismatch (the coefficient is 0 on policy), and the
head's log-ratios have the scenario's size. The ids are slot numbers (0 the sampled token). The head draws from its
own generator: a batch's other fields are the ones it had before heads existed, bit for bit.
"""

from __future__ import annotations

import math

import torch

HEAD_K = 8  # the head's size where a maker is not told otherwise: small enough to keep every test fast
_SEED_OFFSET = 0x5C  # the head's generator is seeded apart from the batch's (its other fields stay as they were)


def head_generator(seed: int) -> torch.Generator:
    """The generator a synthetic head draws from: its own stream, so the batch's other draws are untouched."""
    return torch.Generator(device="cpu").manual_seed(int(seed) * 1_000_003 + _SEED_OFFSET)


def top_k_head(log_q: torch.Tensor, log_p: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(..., V) log-probs of the sampler and the trainer -> the sampler's top-k head: ids (..., k) int64 (-1 where
    the sampler gives a token no mass: truncation), log q and log p (..., k) (0 in an empty slot)."""
    k = min(k, log_q.shape[-1])
    logq, ids = log_q.topk(k, -1)  # (..., k)
    logp = log_p.gather(-1, ids)  # (..., k)
    empty = ~torch.isfinite(logq)
    zero = logq.new_zeros(())
    return ids.masked_fill(empty, -1), logq.masked_fill(empty, 0.0), torch.where(empty, zero, logp)


def synthetic_head(trainer: torch.Tensor, inference: torch.Tensor, sigma, k: int,
                   g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(B, T) float64 log p_y and log q_y of the sampled tokens -> a consistent head of k slots (the module's
    docstring): ids (B, T, k), log q and log p (B, T, k) float64. sigma: a function of the (B, T, k) sampler
    probabilities of the other slots and the tail, giving the trainer's per-slot log-ratio std there."""
    B, T = trainer.shape
    z = torch.randn(B, T, k, generator=g, dtype=torch.float64)  # (B, T, k): k - 1 others, then the tail
    z[..., -1] += math.log(max(k - 1, 1) / 9)
    rest_q = torch.log(-torch.expm1(inference.clamp(max=-1e-300)))  # (B, T) log(1 - q_y)
    rest_p = torch.log(-torch.expm1(trainer.clamp(max=-1e-300)))  # (B, T) log(1 - p_y)
    logq = rest_q[..., None] + z.log_softmax(-1)  # (B, T, k)
    s = sigma(logq.exp())  # (B, T, k)
    n = s * torch.randn(B, T, k, generator=g, dtype=torch.float64) - s * s / 2
    logp = rest_p[..., None] + (z + n).log_softmax(-1)  # (B, T, k)
    logq = torch.cat([inference[..., None], logq[..., :-1]], -1)  # the sampled token first, the tail dropped
    logp = torch.cat([trainer[..., None], logp[..., :-1]], -1)
    ids = torch.arange(k).expand(B, T, k)
    return ids, logq, logp


def head_fields(head, mask: torch.Tensor, device, dtype, whole_support: bool = False) -> dict:
    """Batch's head keywords from (ids, log q, log p), empty (-1, 0) off the loss mask; {} without a head.
    whole_support: the sampler's truncation keeps at most K tokens (top-k <= K), so the head's filled slots are its
    whole sampling support, replayed as `topk_support` (score centering's exact variant reads it)."""
    if head is None:
        return {}
    ids, logq, logp = head
    m = mask[..., None]
    ids = torch.where(m, ids, -1)
    support = {"topk_support": (ids >= 0).to(device)} if whole_support else {}
    return {"topk_ids": ids.to(device), **support,
            "topk_inference_logprobs": torch.where(m, logq, 0.0).to(device=device, dtype=dtype),
            "topk_trainer_logprobs": torch.where(m, logp, 0.0).to(device=device, dtype=dtype)}


def shifted_head(b, shift: int) -> dict:
    """Batch's head keywords of batch b with the head reported `shift` positions late (the off-by-one fault: the
    sampler's whole report moves, the trainer's log-probs of the reported ids with it); {} without a head."""
    if not b.has_head:
        return {}
    ids, logq, logp, support = b.head()
    return {"topk_ids": torch.roll(ids, shift, dims=1), "topk_inference_logprobs": torch.roll(logq, shift, dims=1),
            "topk_trainer_logprobs": torch.roll(logp, shift, dims=1),
            **({} if support is None else {"topk_support": torch.roll(support, shift, dims=1)})}
