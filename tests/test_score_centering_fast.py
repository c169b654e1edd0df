"""Score centering in the fast evaluator (seqis/evaluators/outputs.py adds the plain evaluator's own term,
plain.add_centering): for every score-centering preset, on hypothesis-drawn batches with heads (ragged, float32 and
float64, small and nearly whole heads, tails below the floors, replayed supports), the fast evaluator in every form
equals the plain one (loss gradients in trainer_logprobs and topk_trainer_logprobs, head_weights, masks, metrics),
and the plain one in float64 equals the float64 loops of each framework's formula (test_score_centering_presets'
tables). A wrong f or tail floor fails: the last test breaks them on purpose.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import examples
from test_evaluators import FORMS, fast, same_output, tolerance
from test_score_centering import head_batch
from test_score_centering import reference as formula
from test_score_centering_presets import EXACT, EXACT_TOKEN_W, FORMULAS, exact_reference

from seqis import AGGREGATIONS, Batch, run_many
from seqis.core.compose import Centering
from seqis.evaluators import fast as fast_module
from seqis.evaluators.plain import evaluate
from seqis.registry import resolve

CENTERED = [*FORMULAS, *EXACT]


@st.composite
def head_batches(draw):
    """A ragged batch over a vocabulary of V with the sampler's top-K head (K from 1 to V), a replayed support
    (slot 0, the sampler's top token, always in it), per-rollout or per-token advantages; `tiny`: the last
    vocabulary token holds e^-40 of the sampler's mass (and e^-40 or e^-5 of the trainer's), below every floor."""
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    B, T, V = draw(st.integers(1, 5)), draw(st.integers(1, 6)), draw(st.integers(2, 9))
    K, drift = draw(st.integers(1, V)), draw(st.sampled_from([0.0, 0.3, 1.0, 2.5]))
    logits_q = torch.randn(B, T, V, generator=g, dtype=torch.float64) * 2
    logits_p = logits_q + drift * torch.randn(B, T, V, generator=g, dtype=torch.float64)
    if draw(st.booleans()):
        logits_q[..., -1], logits_p[..., -1] = -40.0, draw(st.sampled_from([-40.0, -5.0]))
    log_q, log_p = logits_q.log_softmax(-1), logits_p.log_softmax(-1)
    y = torch.multinomial(log_q.exp().reshape(-1, V), 1, generator=g).reshape(B, T)  # (B, T) sampled from q
    ids = log_q.topk(K, -1).indices  # (B, T, K)
    mask = torch.arange(T)[None, :] < torch.randint(0, T + 1, (B,), generator=g)[:, None]
    ids = torch.where(mask[..., None], ids, -1)
    support = torch.rand(B, T, K, generator=g) < 0.7
    support[..., 0] = True
    shape = (B, T) if draw(st.booleans()) else (B,)
    dtype = draw(st.sampled_from([torch.float64, torch.float32]))
    c = lambda x: x.to(dtype)
    return Batch(c(log_p.gather(-1, y[..., None])[..., 0]).requires_grad_(), c(log_q.gather(-1, y[..., None])[..., 0]),
                 c(torch.randn(shape, generator=g, dtype=torch.float64)), mask, topk_ids=ids,
                 topk_inference_logprobs=c(log_q.gather(-1, ids.clamp(min=0))),
                 topk_trainer_logprobs=c(log_p.gather(-1, ids.clamp(min=0))).requires_grad_(), topk_support=support)


def wide(batch: Batch, advantages=None) -> Batch:
    """The batch in float64 (the references' precision), fresh leaves."""
    d = lambda x: x.detach().double()
    return Batch(d(batch.trainer_logprobs).requires_grad_(), d(batch.inference_logprobs),
                 d(advantages if advantages is not None else batch.advantages), batch.loss_mask,
                 topk_ids=batch.topk_ids, topk_inference_logprobs=d(batch.topk_inference_logprobs),
                 topk_trainer_logprobs=d(batch.topk_trainer_logprobs).requires_grad_(), topk_support=batch.topk_support)


def grads(out, batch: Batch):
    return torch.autograd.grad(out.loss, (batch.trainer_logprobs, batch.topk_trainer_logprobs), retain_graph=True)


def want(key: str, batch: Batch, sc: Centering | None = None):
    """The float64 loops of the framework's formula: (d loss / d trainer_logprobs, d loss / d topk_trainer_logprobs),
    token-mean; sc: the modelled tail's Centering to read (the table's, unless a test breaks it)."""
    if key in EXACT:
        return exact_reference(batch, EXACT[key], EXACT_TOKEN_W[key])
    token_w, table = FORMULAS[key]
    return formula(batch, sc or table, token_w)[1:]


@pytest.mark.parametrize("key", CENTERED)
@settings(max_examples=examples(12), deadline=None)
@given(batch=head_batches(), agg=st.sampled_from(AGGREGATIONS), form=st.sampled_from(FORMS))
def test_fast_equals_plain_equals_the_frameworks_formula(key, batch, agg, form):
    comp = resolve(key)
    assert fast_module.supports(comp), f"{key}: score centering is the fast evaluator's too"
    got, plain = fast(comp, batch, agg, form), evaluate(comp, batch, agg)
    tol = tolerance(batch)
    for a, b, what in zip(grads(got, batch), grads(plain, batch), ("trainer_logprobs", "topk_trainer_logprobs")):
        torch.testing.assert_close(a, b, **tol, msg=lambda m, what=what: f"{key} fast vs plain, d / d {what}: {m}")
    torch.testing.assert_close(got.head_weights, plain.head_weights, **tol, msg=f"{key}: head_weights")
    same_output(got, plain, batch, f"{key} fast vs plain")
    per_rollout = batch.advantages if batch.advantages.dim() == 1 else batch.advantages[:, 0]
    b64 = wide(batch, per_rollout)  # the loops read one advantage per rollout, token-mean
    got64 = grads(fast(comp, b64, "token-mean", form), b64)
    for a, b, what in zip(got64, want(key, b64), ("trainer_logprobs", "topk_trainer_logprobs")):
        # atol: a head covering the whole vocabulary leaves a sampler's tail of rounding (1e-16) over a trainer
        # floor of 1e-6 (Miles, NeMo-RL): rho is noise of 1e-10, in any float64 code of the formula
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9,
                                   msg=lambda m, what=what: f"{key} vs its formula: d loss / d {what}: {m}")


@pytest.mark.parametrize("key", list(FORMULAS))
def test_a_wrong_f_or_tail_floor_fails_on_the_drawn_batches(key):
    """The comparison above bites: on the draws of a fixed hypothesis seed, the formula with another f, or with
    the other frameworks' floors, disagrees with the fast evaluator on some batch."""
    token_w, sc = FORMULAS[key]
    wrongs = [dataclasses.replace(sc, rule="truncate", low=None, high=1.5)]
    floors = {(c.sampler_floor, c.trainer_floor) for _, c in FORMULAS.values()} - {(sc.sampler_floor,
                                                                                    sc.trainer_floor)}
    wrongs += [dataclasses.replace(sc, sampler_floor=s, trainer_floor=t) for s, t in floors
               if (s or 0.0, t) != (sc.sampler_floor or 0.0, sc.trainer_floor)]  # None and 0 agree on a valid head
    caught = set()

    @settings(max_examples=60, deadline=None, database=None, derandomize=True)
    @given(batch=head_batches())
    def check(batch):
        b64 = wide(batch, batch.advantages if batch.advantages.dim() == 1 else batch.advantages[:, 0])
        got = grads(fast(resolve(key), b64, "token-mean", {}), b64)[1]
        for i, wrong in enumerate(wrongs):
            if not torch.allclose(got, want(key, b64, wrong)[1], rtol=1e-6, atol=1e-8):
                caught.add(i)

    check()
    assert caught == set(range(len(wrongs))), [w for i, w in enumerate(wrongs) if i not in caught]


def test_two_keys_naming_one_centered_composition_get_a_loss_each():
    """run_many: a preset and its own composition are one composition with two outputs; each loss is differentiated
    alone (its centering term a graph of its own) and gives the same gradients."""
    batch, _, _ = head_batch(4)
    comp = resolve("verl/bypass_pg_token_tis_sc")
    outs = run_many(["verl/bypass_pg_token_tis_sc", comp], batch)
    first = torch.autograd.grad(outs["verl/bypass_pg_token_tis_sc"].loss,
                                (batch.trainer_logprobs, batch.topk_trainer_logprobs))
    second = torch.autograd.grad(outs[comp].loss, (batch.trainer_logprobs, batch.topk_trainer_logprobs))
    for a, b in zip(first, second):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert float(first[1].abs().sum()) > 0
