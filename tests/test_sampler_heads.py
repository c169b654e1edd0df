"""The sampler's head on every batch seqis makes (seqis/samplers/heads.py): consistent masses, the batch's own
sampled token in a synthetic head, the exact top-k where a sampler has a distribution, on-policy zero, the fp8
scenario's mismatch, and the batch's other fields unchanged by the head (its generator is its own)."""

from __future__ import annotations

import math

import pytest
import torch

from seqis import Composition, Weight, run
from seqis.core.compose import Centering
from seqis.samplers.heads import HEAD_K, top_k_head
from seqis.samplers.scenarios import SCENARIOS, e4m3, make_batch

SMALL = dict(n_rollouts=16, max_len=64, min_len=4)
SC = Composition(Weight("token", clip=2.0), centering=Centering("truncate", high=2.0))


def _masses(b):
    slots = (b.topk_ids >= 0) & b.loss_mask[..., None]
    q = torch.where(slots, b.topk_inference_logprobs.double().exp(), 0.0).sum(-1)
    p = torch.where(slots, b.topk_trainer_logprobs.double().exp(), 0.0).sum(-1)
    return q[b.loss_mask], p[b.loss_mask]


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_every_scenario_carries_a_head_whose_masses_are_below_one(name):
    b = make_batch(name, seed=1, dtype=torch.float64, **SMALL)
    assert b.has_head and b.topk_ids.shape[-1] == HEAD_K
    q, p = _masses(b)
    assert bool((q <= 1 + 1e-12).all()) and bool((p <= 1 + 1e-12).all())
    assert bool((q > 0).all()) and bool((p > 0).all())
    assert math.isfinite(float(run(SC, b).loss))


@pytest.mark.parametrize("name", ["gaussian", "drift", "catastrophic", "precision"])
def test_a_synthetic_head_starts_with_the_sampled_token_and_leaves_a_tail(name):
    b = make_batch(name, seed=2, dtype=torch.float64, **SMALL)
    m = b.loss_mask
    assert torch.equal(b.topk_inference_logprobs[..., 0][m], b.inference_logprobs[m])
    assert torch.equal(b.topk_trainer_logprobs[..., 0][m], b.trainer_logprobs[m])
    q, p = _masses(b)
    assert bool((q < 1).all()) and bool((p < 1).all())  # a tail outside the head, both sides


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_the_head_leaves_every_other_field_as_it_was(name):
    with_head, without = (make_batch(name, seed=3, head_k=k, **SMALL) for k in (HEAD_K, 0))
    assert not without.has_head
    for field in ("trainer_logprobs", "inference_logprobs", "advantages", "loss_mask"):
        assert torch.equal(getattr(with_head, field), getattr(without, field)), field
    assert with_head.metadata == without.metadata


def test_a_scenario_without_mismatch_has_a_head_with_coefficient_zero():
    b = make_batch("gaussian", seed=4, s=0.0, dtype=torch.float64, **SMALL)
    out = run(SC, b)
    assert float(out.head_weights.abs().max()) == 0.0


def test_a_larger_mismatch_gives_a_larger_head_mismatch():
    """The other slots' log-ratios, less their mean at the position (the ratio of the two rests, 1 - p_y over
    1 - q_y), spread with the scenario's s (about s, times the softmax's shrinkage)."""
    spread = []
    for s in (0.0, 0.02, 0.2):
        b = make_batch("gaussian", seed=5, s=s, dtype=torch.float64, **SMALL)
        l = (b.topk_trainer_logprobs - b.topk_inference_logprobs)[..., 1:][b.loss_mask]  # (N, K - 1)
        spread.append(float((l - l.mean(-1, keepdim=True)).std()))
    assert spread[0] < 1e-12 and 0.005 < spread[1] < 0.03 and 0.05 < spread[2] < 0.3


def test_a_table_scenarios_head_is_the_samplers_exact_top_k():
    """policy_lag and fp8_logits sample from a (C, V) table: the head is the sampler's K most likely tokens of the
    token's context, both log-probs normalised over the whole vocabulary, so every head mass is below 1 and the
    sampler's head holds its K largest probabilities."""
    b = make_batch("fp8_logits", seed=6, dtype=torch.float64, vocab=32, **SMALL)
    q = b.topk_inference_logprobs[b.loss_mask]  # (N, K)
    assert bool((q[:, :-1] >= q[:, 1:]).all())  # sorted like a top-k
    ids = b.topk_ids[b.loss_mask]
    assert bool((ids.sort(-1).values.diff(dim=-1) > 0).all())  # distinct ids
    log_q = torch.randn(3, 10, dtype=torch.float64).log_softmax(-1)
    log_p = torch.randn(3, 10, dtype=torch.float64).log_softmax(-1)
    ids, lq, lp = top_k_head(log_q, log_p, 4)
    assert torch.equal(lq, log_q.topk(4, -1).values) and torch.equal(lp, log_p.gather(-1, ids))
    trunc = log_q.clone()
    trunc[:, 5:] = -math.inf  # a truncated sampler: tokens it cannot draw leave their slot empty
    ids, lq, _ = top_k_head(trunc.sort(-1, descending=True).values, log_p, 8)
    assert bool((ids[:, 5:] == -1).all()) and bool((lq[:, 5:] == 0).all())


def test_the_fp8_sampler_rounds_its_logits_to_e4m3_and_mismatches_more_at_larger_logits():
    x = torch.tensor([0.3, 1.3, 5.6, 11.2, 17.0, 600.0], dtype=torch.float64)
    assert e4m3(x).tolist() == [0.3125, 1.25, 5.5, 11.0, 16.0, 448.0]  # 3 mantissa bits, saturating at 448
    kl = []
    for offset in (2.0, 16.0):
        b = make_batch("fp8_logits", seed=7, logit_offset=offset, dtype=torch.float64, n_rollouts=64, max_len=128)
        l = (b.trainer_logprobs - b.inference_logprobs)[b.loss_mask]
        kl.append(float((l.exp() - 1 - l).mean()))
    assert 0 < kl[0] < kl[1] and 5e-4 < kl[1] < 1e-2  # the engines' measured range at the default offset


def test_a_top_k_sampler_within_the_head_replays_its_whole_support():
    """A generator whose sampler keeps its top 4 (K = 8): the head's filled slots are the whole support, their
    sampler mass 1 (the processed distribution), so the exact presets run; without truncation there is no support."""
    from seqis.samplers.generators import GENERATORS

    name = next(iter(GENERATORS))
    b = make_batch(name, seed=0, top_k=4, n_prompts=2, max_len=16)
    assert b.topk_support is not None
    m = b.loss_mask
    q = torch.where(b.topk_support, b.topk_inference_logprobs.double().exp(), 0.0).sum(-1)[m]
    torch.testing.assert_close(q, torch.ones_like(q), rtol=0, atol=1e-5)
    assert math.isfinite(float(run("miles/score_centering_exact", b).loss.detach()))
    assert make_batch(name, seed=0, n_prompts=2, max_len=16).topk_support is None
