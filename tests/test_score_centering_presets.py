"""Every score-centering preset against a plain float64 reference of its framework's formula, written here slot by
slot from the framework's code (each row of FORMULAS: the sampled token's weight, the head's f, the tail floors or
the replayed support); a wrong f or tail floor in a preset fails a test. Then the frameworks' own test values (verl
at c6236f5: tests/trainer/ppo/test_score_centering.py), and the identities: the coefficient is 0 on policy and with
untruncated IS, and under a constant reward the expected centered gradient is 0 while plain REINFORCE's is not.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from test_score_centering import head_batch
from test_score_centering import reference as formula

from seqis import PRESETS, Batch, run
from seqis.core.compose import Centering
from seqis.presets.nemo_rl import NemoRLConfig
from seqis.registry import head_fields, lacking, needs_head, runnable, skipped_note

INF = math.inf
one = lambda x: 1.0
trunc = lambda hi: lambda x: min(x, hi)
clamp = lambda lo, hi: lambda x: min(max(x, lo), hi)
band = lambda lo, hi: lambda x: x if lo <= x <= hi else 0.0
V6, N6 = dict(sampler_floor=1e-6, trainer_floor=1e-6), dict(sampler_floor=None, trainer_floor=1e-6)
M6 = dict(sampler_floor=0.0, trainer_floor=1e-6)
# key -> (the sampled token's weight, the head's f and tail floors), from each framework's code; the float64 loops of
# test_score_centering.reference read the Centering written here (rule, edges, floors), never the preset's
FORMULAS = {
    "verl/bypass_pg_sc": (one, Centering("none", **V6)),  # score_centering_weight_fn(None): ones; eps 1e-6 both
    "verl/bypass_pg_token_tis_sc": (trunc(2.0), Centering("truncate", high=2.0, **V6)),  # ratio.clamp(max=upper)
    "verl/bypass_pg_token_icepop_sc": (band(0.5, 5.0), Centering("band", low=0.5, high=5.0, **V6)),  # "0.5_5.0"
    "nemo-rl/tis-score-centering": (clamp(0.0, 2.0), Centering("clamp", low=0.0, high=2.0, **N6)),  # max(1 - P, 1e-6)
    "nemo-rl/icepop-score-centering": (band(0.5, 5.0), Centering("band", low=0.5, high=5.0, **N6)),
    "miles/score_centering": (one, Centering("none", **M6)),  # trainer tail clamp_min(1e-6), sampler's clamp_min(0)
    "miles/score_centering_tis": (clamp(0.0, 2.0), Centering("clamp", low=0.0, high=2.0, **M6)),
    "skyrl/token_tis_score_centering": (trunc(2.0), Centering("truncate", high=2.0, **V6)),  # TAIL_MASS_FLOOR
    "vime/score_centering": (one, Centering("none", **V6)),
    "vime/score_centering_tis": (clamp(0.0, 2.0), Centering("clamp", low=0.0, high=2.0, **V6)),
    "vime/score_centering_icepop": (band(0.5, 2.0), Centering("band", low=0.5, high=2.0, **V6)),  # vime's [0.5, 2]
}
# key -> (the sampled token's weight and its keep rule, the head's coefficient q f(p'/q) on the support, minus p')
EXACT = {
    "miles/score_centering_exact": lambda p, q: q,  # f = 1 (no --use-tis)
    "prime-rl/ipo_score_centering": lambda p, q: q * min(p / q, 1e4) * (abs(p - q) <= 0.3),  # IPO's own weight
}
EXACT_TOKEN_W = {"miles/score_centering_exact": lambda p, q: 1.0,  # the sampled token's weight, of (p, q)
                 "prime-rl/ipo_score_centering": lambda p, q: min(p / q, 1e4) * (abs(p - q) <= 0.3)}


def test_every_score_centering_preset_is_in_a_table_here():
    centered = {k for k in PRESETS if needs_head(k)}
    assert centered == set(FORMULAS) | set(EXACT)


def reference(batch: Batch, token_w, sc: Centering):
    """(d loss / d trainer_logprobs, d loss / d topk_trainer_logprobs) of token-mean REINFORCE with weight
    token_w(rho_t) plus A_t sum_H c_v log p_v (test_score_centering.reference's float64 loops)."""
    return formula(batch, sc, token_w)[1:]


def grads(key, batch):
    out = run(key, batch)
    return torch.autograd.grad(out.loss, (batch.trainer_logprobs, batch.topk_trainer_logprobs))


@pytest.mark.parametrize("key", list(FORMULAS))
@pytest.mark.parametrize("seed, drift", [(0, 0.3), (1, 1.0)])
def test_a_modelled_tail_preset_is_its_frameworks_formula_slot_by_slot(key, seed, drift):
    batch, _, _ = head_batch(seed, K=3, drift=drift)  # a small head: tails of 0.1-0.9, ratios past 2 and below 0.5
    want_tok, want_head = reference(batch, *FORMULAS[key])
    got_tok, got_head = grads(key, batch)
    torch.testing.assert_close(got_tok, want_tok, rtol=1e-9, atol=1e-13)
    torch.testing.assert_close(got_head, want_head, rtol=1e-9, atol=1e-13)


@pytest.mark.parametrize("key", list(FORMULAS))
def test_a_wrong_floor_or_f_fails_the_reference(key):
    """The table bites: the same batch against the formula with the other frameworks' floors or another f differs
    (a head covering nearly everything makes the floors matter: tails below 1e-6)."""
    token_w, sc = FORMULAS[key]
    batch = _nearly_whole_head(7)
    got = grads(key, batch)[1]
    torch.testing.assert_close(got, reference(batch, token_w, sc)[1], rtol=1e-9, atol=1e-13)
    floors = lambda c: (c.sampler_floor or 0.0, c.trainer_floor)  # no sampler floor and 0 agree on a valid head
    others = {floors(c) for _, c in FORMULAS.values()} - {floors(sc)}
    assert others  # every preset has a framework with other floors to be told apart from
    for s, t in others:
        other = dataclasses.replace(sc, sampler_floor=s, trainer_floor=t)
        assert not torch.allclose(got, reference(batch, token_w, other)[1], rtol=1e-6, atol=1e-12), (s, t)
    skewed, _, _ = head_batch(3, K=3, drift=1.0)
    wrong_f = Centering("truncate", high=1.5, sampler_floor=sc.sampler_floor, trainer_floor=sc.trainer_floor)
    assert not torch.allclose(grads(key, skewed)[1], reference(skewed, token_w, wrong_f)[1], rtol=1e-6, atol=1e-12)


def _nearly_whole_head(seed: int, V: int = 6) -> Batch:
    """Heads of V - 1 of V tokens whose left-out token carries under 1e-6 of the sampler's mass and more of the
    trainer's (or the other way): the floors decide rho."""
    g = torch.Generator().manual_seed(seed)
    B, T = 3, 4
    lq = torch.randn(B, T, V, generator=g, dtype=torch.float64)
    lq[..., -1] = -30.0  # the sampler's tail: e^-30 of the mass, below every floor
    lp = lq + 0.5 * torch.randn(B, T, V, generator=g, dtype=torch.float64)
    lp[..., -1] = torch.where(torch.arange(B)[:, None] == 0, -30.0, -3.0)  # row 0: both tails tiny
    log_q, log_p = lq.log_softmax(-1), lp.log_softmax(-1)
    ids = torch.arange(V - 1).expand(B, T, V - 1)
    advantages = torch.randn(B, generator=g, dtype=torch.float64)
    return Batch(log_p[..., 0].clone().requires_grad_(), log_q[..., 0], advantages,
                 topk_ids=ids, topk_inference_logprobs=log_q[..., :-1],
                 topk_trainer_logprobs=log_p[..., :-1].clone().requires_grad_())


def _support_batch(seed: int, V: int = 8, drift: float = 0.4) -> Batch:
    """A top-p sampler: its support (the head's True slots) replayed, the trainer renormalised on it for the
    sampled token (as Miles and prime-rl feed it), the head's trainer log-probs over the whole vocabulary."""
    g = torch.Generator().manual_seed(seed)
    B, T = 4, 5
    lq = torch.randn(B, T, V, generator=g, dtype=torch.float64) * 1.5
    lp = lq + drift * torch.randn(B, T, V, generator=g, dtype=torch.float64)
    support = torch.rand(B, T, V, generator=g) < 0.7
    support[..., 0] = True  # the sampled token, slot 0
    log_q = lq.masked_fill(~support, -INF).log_softmax(-1)  # the processed sampler on its support
    log_p = lp.log_softmax(-1)
    renorm = log_p - torch.logsumexp(log_p.masked_fill(~support, -INF), -1, keepdim=True)
    return Batch(renorm[..., 0].clone().requires_grad_(), log_q[..., 0], torch.randn(B, generator=g,
                 dtype=torch.float64), topk_ids=torch.arange(V).expand(B, T, V),
                 topk_inference_logprobs=log_q.masked_fill(~support, 0.0),
                 topk_trainer_logprobs=log_p.clone().requires_grad_(), topk_support=support)


def exact_reference(batch: Batch, coef, token_w):
    """d loss / d topk_trainer_logprobs of A sum_S coef(p'_v, q_v) log p'_v, p'_v = p_v / P_S (the chain rule
    through the renormalisation by hand: d log p'_u / d log p_v = 1[u = v] - p'_v), and the sampled token's grad."""
    B, T, K = batch.topk_ids.shape
    N = int(batch.loss_mask.sum())
    g_head = torch.zeros(B, T, K, dtype=torch.float64)
    g_tok = torch.zeros(B, T, dtype=torch.float64)
    for j in range(B):
        A = float(batch.advantages[j])
        for t in range(T):
            if not batch.loss_mask[j, t]:
                continue
            S = [k for k in range(K) if batch.topk_support[j, t, k] and batch.topk_ids[j, t, k] >= 0]
            p = {k: math.exp(float(batch.topk_trainer_logprobs[j, t, k].detach())) for k in S}
            P = sum(p.values())
            pn = {k: p[k] / P for k in S}
            q = {k: math.exp(float(batch.topk_inference_logprobs[j, t, k])) for k in S}
            c = {k: coef(pn[k], q[k]) for k in S}
            total = sum(c.values())
            for k in S:
                g_head[j, t, k] = A * (c[k] - pn[k] * total) / N
            lp, lq = float(batch.trainer_logprobs[j, t].detach()), float(batch.inference_logprobs[j, t])
            g_tok[j, t] = -token_w(math.exp(lp), math.exp(lq)) * A / N
    return g_tok, g_head


@pytest.mark.parametrize("key", list(EXACT))
@pytest.mark.parametrize("seed", [0, 1])
def test_an_exact_support_preset_is_its_frameworks_formula_slot_by_slot(key, seed):
    """The frameworks add sum_S q f log p' without seqis's - p' (the gradient is the same: sum p' grad log p' is
    0), so the gradients are compared."""
    batch = _support_batch(seed)
    want_tok, want_head = exact_reference(batch, EXACT[key], EXACT_TOKEN_W[key])
    got_tok, got_head = grads(key, batch)
    torch.testing.assert_close(got_head, want_head, rtol=1e-9, atol=1e-13)
    torch.testing.assert_close(got_tok, want_tok, rtol=1e-9, atol=1e-13)


def test_prime_rls_trust_region_drops_head_tokens_that_moved():
    """With drift, some support tokens move more than 0.3 in probability: their coefficient q min(p/q, R) is 0
    (prime-rl's 1[|p - q| <= eps]); without the rule the gradient differs."""
    batch = _support_batch(2, drift=2.0)
    got = grads("prime-rl/ipo_score_centering", batch)[1]
    _, kept_all = exact_reference(batch, lambda p, q: q * min(p / q, 1e4), lambda p, q: 0.0)
    assert not torch.allclose(got, kept_all, rtol=1e-6, atol=1e-12)


def test_verls_weight_fn_values():
    """verl's test_weight_fn_matches_tis_and_icepop_rules (verl-project/verl@c6236f5): on ratios [0.1, 0.7, 1, 3, 9]
    None gives 1, token 2.0 gives min(x, 2), token "0.5_5.0" gives [0, 0.7, 1, 3, 0]."""
    ratio = torch.tensor([0.1, 0.7, 1.0, 3.0, 9.0], dtype=torch.float64)
    f = {k: PRESETS[k].compose().centering.f(ratio).tolist() for k in FORMULAS if k.startswith("verl/")}
    assert f["verl/bypass_pg_sc"] == [1.0] * 5
    assert f["verl/bypass_pg_token_tis_sc"] == [0.1, 0.7, 1.0, 2.0, 2.0]
    assert f["verl/bypass_pg_token_icepop_sc"] == [0.0, 0.7, 1.0, 3.0, 0.0]


def test_verls_tail_model_gradient_is_the_full_vocabulary_centering_of_q_hat():
    """verl's test_topk_correction_gradient_matches_tail_model: with k < V the gradient of the correction equals
    that of sum_v sg(q_hat_v) log p_v, q_hat = q on the head and rho p on the tail (f = 1), through the logits."""
    g = torch.Generator().manual_seed(3)
    V, k = 13, 5
    theta = torch.randn(2, V, generator=g, dtype=torch.float64, requires_grad=True)
    log_q = torch.randn(2, V, generator=g, dtype=torch.float64).log_softmax(-1)
    ids = log_q.topk(k, -1).indices  # (2, k)
    log_p = theta.log_softmax(-1)
    batch = Batch(torch.zeros(2, 1, dtype=torch.float64, requires_grad=True), torch.zeros(2, 1, dtype=torch.float64),
                  torch.ones(2, dtype=torch.float64), topk_ids=ids[:, None], topk_inference_logprobs=log_q.gather(
                      -1, ids)[:, None], topk_trainer_logprobs=log_p.gather(-1, ids)[:, None])
    (got,) = torch.autograd.grad(run("verl/bypass_pg_sc", batch).loss * 2, theta)  # token-mean over 2 tokens
    p = log_p.exp().detach()
    in_head = torch.zeros(2, V, dtype=torch.bool).scatter_(1, ids, True)
    rho = (1 - log_q.exp().gather(-1, ids).sum(-1)) / (1 - p.gather(-1, ids).sum(-1))
    q_hat = torch.where(in_head, log_q.exp(), rho[:, None] * p)
    (want,) = torch.autograd.grad((q_hat * theta.log_softmax(-1)).sum(), theta)
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("key", list(FORMULAS))
def test_on_policy_every_presets_coefficient_is_zero(key):
    batch, _, _ = head_batch(3, drift=0.0)
    out = run(key, batch)
    assert float(out.head_weights.abs().max()) < 1e-12


@pytest.mark.parametrize("key", list(EXACT))
def test_on_policy_an_exact_presets_coefficient_is_zero(key):
    batch = _support_batch(4, drift=0.0)
    ids, q, p, support = batch.head()
    p = torch.where(support, q, p).detach()  # the trainer equals the sampler on the support
    renorm = p - torch.logsumexp(p.masked_fill(~support, -INF), -1, keepdim=True)
    on = Batch(renorm[..., 0].clone().requires_grad_(), batch.inference_logprobs, batch.advantages,
               topk_ids=ids, topk_inference_logprobs=q, topk_trainer_logprobs=renorm.requires_grad_(),
               topk_support=support)
    assert float(run(key, on).head_weights.abs().max()) < 1e-12


def test_nemo_rls_untruncated_is_makes_the_coefficient_zero():
    """NeMo-RL's API page: "Untruncated IS makes this coefficient zero": IS on, no truncation, score centering on."""
    batch, _, _ = head_batch(5)
    cfg = NemoRLConfig(score_centering=True)
    assert float(run("nemo-rl/tis-score-centering", batch, cfg).head_weights.abs().max()) < 1e-12


def _expected_gradient(key: str | None, V: int = 7) -> torch.Tensor:
    """d/d theta of the expected loss under a constant reward when tokens come from the sampler q, the head the
    whole vocabulary: one rollout per token v weighted by q_v (the expectation exactly)."""
    g = torch.Generator().manual_seed(7)
    theta = torch.randn(V, generator=g, dtype=torch.float64, requires_grad=True)
    log_q = (torch.randn(V, generator=g, dtype=torch.float64) * 0.5).log_softmax(-1)
    log_p = theta.log_softmax(-1)
    batch = Batch(log_p[:, None], log_q[:, None].detach(), log_q.exp().detach() * V,
                  topk_ids=torch.arange(V).expand(V, 1, V), topk_inference_logprobs=log_q.detach().expand(V, 1, V),
                  topk_trainer_logprobs=log_p.expand(V, 1, V))
    out = run(key or "verl/disabled", batch)
    (grad,) = torch.autograd.grad(out.loss, theta)
    return grad


@pytest.mark.parametrize("key", list(FORMULAS))
def test_under_a_constant_reward_every_centered_expected_gradient_is_zero(key):
    """verl's test_drift_cancels_under_constant_reward for every modelled-tail preset (f weighs the sampled token and
    the head alike, so E_q[f grad log p] - sum (q f - alpha p) grad log p = alpha sum p grad log p = 0)."""
    assert float(_expected_gradient(None).abs().max()) > 1e-3  # plain REINFORCE drifts
    torch.testing.assert_close(_expected_gradient(key), torch.zeros(7, dtype=torch.float64), atol=1e-12, rtol=0)


def test_the_registry_says_which_fields_a_correction_needs_and_which_a_batch_lacks():
    bare = Batch(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2))
    assert head_fields("verl/bypass_pg_is") == () and not needs_head("token_tis")
    assert head_fields("verl/bypass_pg_sc") == Batch.HEAD
    assert head_fields("miles/score_centering_exact") == (*Batch.HEAD, "topk_support")
    assert lacking("verl/bypass_pg_sc", bare) == Batch.HEAD
    with_head, _, _ = head_batch(0)
    assert lacking("verl/bypass_pg_sc", with_head) == ()
    assert lacking("prime-rl/ipo_score_centering", with_head) == ("topk_support",)
    ok, skipped = runnable(["token_tis", "verl/bypass_pg_sc", "prime-rl/ipo_score_centering"], with_head)
    assert ok == ["token_tis", "verl/bypass_pg_sc"] and skipped == {"prime-rl/ipo_score_centering": ("topk_support",)}
    assert "prime-rl/ipo_score_centering" in skipped_note(skipped) and "topk_support" in skipped_note(skipped)
    with pytest.raises(ValueError, match=r"prime-rl/ipo_score_centering needs .* this batch lacks topk_support"):
        run("prime-rl/ipo_score_centering", with_head)


def test_verls_refusals_and_its_own_export():
    from seqis.export import export
    from seqis.presets.verl import VerlConfig

    for kw in (dict(bypass_mode=False, loss_type="reinforce"), dict(bypass_mode=True, loss_type="ppo_clip"),
               dict(bypass_mode=True, loss_type="reinforce", rollout_is="sequence"),
               dict(bypass_mode=True, loss_type="reinforce", rollout_is="token", rollout_is_batch_normalize=True)):
        with pytest.raises(ValueError, match="score_centering"):
            VerlConfig(score_centering=True, **kw)
    snip = export("verl/bypass_pg_token_icepop_sc", "verl")
    assert snip.expressible and "score_centering: true" in snip.text and "topk_log_probs: 128" in snip.text
    assert "rollout_is_batch_normalize" in snip.text and "ppo_clip" in snip.text  # the refusals, as comments
