"""Score centering over the sampler's top-k head (seqis/core/compose.py Centering; plain.add_centering, which both
evaluators call; tests/test_score_centering_fast.py holds the fast one to the plain one).

The reference below is written from the formula in docs (DESIGN.md, "The sampler's head"), one token and one slot at
a time in float64, sharing no code with the evaluator; a wrong rule f or tail floor in the evaluator fails it (the
mutation test breaks f on purpose). Then the identities the paper and verl's own tests state: the coefficient is 0
on policy and with untruncated IS (f = x); under a constant reward the expected centered gradient is 0 while plain
REINFORCE's is not (exact here: the head is the whole vocabulary); verl's tail model (alpha = rho f(1 / rho)); the
exact variant over a replayed support. Last, the head on `Batch` (validation named by row, token and slot) and the
export to verl.
"""

from __future__ import annotations

import math

import pytest
import torch
import yaml

from seqis import Batch, Composition, Weight, run
from seqis.core.compose import SAFETY_BOUND, Centering
from seqis.export import export, export_all

RULES = [Centering("none"), Centering("truncate", high=2.0), Centering("band", low=0.5, high=5.0),
         Centering("clamp", low=0.8, high=1.2), Centering("truncate", high=2.0, sampler_floor=None, trainer_floor=1e-6)]


def head_batch(seed: int = 0, B: int = 4, T: int = 6, V: int = 12, K: int = 5, drift: float = 0.3,
               dtype=torch.float64) -> tuple[Batch, torch.Tensor, torch.Tensor]:
    """A batch whose tokens come from a vocabulary of V: the trainer's and the sampler's full distributions (B, T, V)
    as logits a drift apart, the sampled token and the sampler's top-K head at each position; ragged loss mask; the
    head's trainer log-probs require grad (the loss reaches them), as do the sampled tokens'."""
    g = torch.Generator().manual_seed(seed)
    logits_q = torch.randn(B, T, V, generator=g, dtype=dtype) * 2
    logits_p = logits_q + drift * torch.randn(B, T, V, generator=g, dtype=dtype)
    log_q, log_p = logits_q.log_softmax(-1), logits_p.log_softmax(-1)  # (B, T, V)
    y = torch.multinomial(log_q.exp().reshape(-1, V), 1, generator=g).reshape(B, T)  # (B, T) sampled from q
    ids = log_q.topk(K, -1).indices  # (B, T, K) the sampler's head
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    ids = torch.where(mask[..., None], ids, torch.full_like(ids, -1))  # empty slots off the loss tokens
    batch = Batch(log_p.gather(-1, y[..., None])[..., 0].clone().requires_grad_(),
                  log_q.gather(-1, y[..., None])[..., 0], torch.randn(B, generator=g, dtype=dtype), mask,
                  topk_ids=ids, topk_inference_logprobs=log_q.gather(-1, ids.clamp(min=0)),
                  topk_trainer_logprobs=log_p.gather(-1, ids.clamp(min=0)).clone().requires_grad_())
    return batch, log_p, log_q


def reference(batch: Batch, sc: Centering, weight, whole: bool = False) -> tuple[float, torch.Tensor, torch.Tensor]:
    """(loss, d loss / d trainer_logprobs, d loss / d topk_trainer_logprobs) of weight(rho_t) REINFORCE plus the
    centering term, token-mean, in plain float64 loops: the formula, slot by slot. whole: the head is the whole
    vocabulary, so there is no tail to model (alpha = 1: c_v = q_v f(p_v / q_v) - p_v, the exact-support form)."""
    f = {"none": lambda x: 1.0, "truncate": lambda x: min(x, sc.high),
         "band": lambda x: x if sc.low <= x <= sc.high else 0.0,
         "clamp": lambda x: min(max(x, sc.low), sc.high)}[sc.rule]
    B, T = batch.shape
    N = int(batch.loss_mask.sum())
    loss, g_tok, g_head = 0.0, torch.zeros(B, T, dtype=torch.float64), torch.zeros(batch.topk_ids.shape,
                                                                                  dtype=torch.float64)
    for j in range(B):
        A = float(batch.advantages[j])
        for t in range(T):
            if not batch.loss_mask[j, t]:
                continue
            lp, lq = float(batch.trainer_logprobs[j, t].detach()), float(batch.inference_logprobs[j, t])
            w = weight(math.exp(lp - lq))
            loss += -w * A * lp / N
            g_tok[j, t] = -w * A / N
            slots = [k for k in range(batch.topk_ids.shape[-1]) if batch.topk_ids[j, t, k] >= 0]
            p = {k: math.exp(float(batch.topk_trainer_logprobs[j, t, k].detach())) for k in slots}
            q = {k: math.exp(float(batch.topk_inference_logprobs[j, t, k])) for k in slots}
            # the tail masses, never below 0 (a head summing past 1 is rounding), floored; rho their ratio
            tail_q = max(1 - sum(q.values()), sc.sampler_floor or 0.0)
            tail_p = max(1 - sum(p.values()), sc.trainer_floor or 0.0)
            rho = 1.0 if whole else tail_q / tail_p  # no tail (whole): alpha = 1
            big = 1e300  # a sampler's tail of 0: alpha is the limit of rho f(1 / rho), f(x) / x for large x
            alpha = rho * f(1 / rho) if rho else f(big) / big
            for k in slots:
                c = q[k] * f(p[k] / q[k]) - alpha * p[k]
                loss += A * c * math.log(p[k]) / N
                g_head[j, t, k] = A * c / N
    return loss, g_tok, g_head


def gradients(out, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.autograd.grad(out.loss, (batch.trainer_logprobs, batch.topk_trainer_logprobs))


def composition(sc: Centering) -> tuple[Composition, object]:
    """The composition of REINFORCE whose IS weight is the centering's own rule (as verl's presets pair them), and
    that weight as a float function for the reference."""
    if sc.rule == "none":
        return Composition(Weight("none"), centering=sc), lambda r: 1.0
    if sc.rule == "truncate":
        return Composition(Weight("token", clip=sc.high), centering=sc), lambda r: min(r, sc.high)
    if sc.rule == "band":
        return (Composition(Weight("token", band=(sc.low, sc.high)), centering=sc),
                lambda r: r if sc.low <= r <= sc.high else 0.0)
    return Composition(Weight("token", clip=sc.high, clip_low=sc.low), centering=sc), \
        lambda r: min(max(r, sc.low), sc.high)


@pytest.mark.parametrize("sc", RULES, ids=lambda sc: sc.describe())
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_loss_and_both_gradients_equal_the_formula_slot_by_slot(sc, seed):
    batch, _, _ = head_batch(seed)
    comp, weight = composition(sc)
    out = run(comp, batch)
    want_loss, want_tok, want_head = reference(batch, sc, weight)
    g_tok, g_head = gradients(out, batch)
    assert float(out.loss.detach()) == pytest.approx(want_loss, rel=1e-9, abs=1e-12)
    torch.testing.assert_close(g_tok, want_tok, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(g_head, want_head, rtol=1e-9, atol=1e-12)
    # head_weights: the head's counterpart of weights, d loss / d log p_v = -head_weights * A / N
    N = batch.loss_mask.sum()
    torch.testing.assert_close(-out.head_weights * batch.advantages[:, None, None] / N, want_head, rtol=1e-9,
                               atol=1e-12)


def test_a_wrong_rule_or_floor_fails_the_formula(monkeypatch):
    """The check bites: the evaluator with f broken (TIS's cap moved) or the tail floors dropped disagrees."""
    batch, _, _ = head_batch(0, K=3, drift=1.0)  # a small head (tails of 0.1-0.9) and ratios past TIS's cap
    sc = Centering("truncate", high=2.0)
    comp, weight = composition(sc)
    want = reference(batch, sc, weight)[2]
    torch.testing.assert_close(gradients(run(comp, batch), batch)[1], want, rtol=1e-9, atol=1e-15)
    monkeypatch.setattr(Centering, "f", lambda self, x: x.clamp(max=1.5))
    assert not torch.allclose(gradients(run(comp, batch), batch)[1], want, rtol=1e-6, atol=1e-15)
    monkeypatch.undo()
    floored = Composition(comp.weight, centering=Centering("truncate", high=2.0, sampler_floor=0.9, trainer_floor=0.9))
    assert not torch.allclose(gradients(run(floored, batch), batch)[1], want, rtol=1e-6, atol=1e-15)


def test_on_policy_the_coefficient_is_zero():
    batch, _, _ = head_batch(3, drift=0.0)
    for sc in RULES:
        out = run(composition(sc)[0], batch)
        torch.testing.assert_close(out.head_weights, torch.zeros_like(out.head_weights), atol=1e-12, rtol=0)
        assert out.scalars()["sc_correction"] == pytest.approx(0.0, abs=1e-12)


def test_with_untruncated_is_the_coefficient_is_zero():
    """f = x (a clamp that never bites): q f(p / q) = p and alpha = rho (1 / rho) = 1, so c = p - p = 0."""
    batch, _, _ = head_batch(4)
    out = run(Composition(Weight("token"), centering=Centering("clamp", low=0.0, high=math.inf)), batch)
    torch.testing.assert_close(out.head_weights, torch.zeros_like(out.head_weights), atol=1e-12, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("sc", RULES[:4], ids=lambda sc: sc.rule)
def test_a_whole_vocabulary_head_without_floors_has_no_tail(sc, dtype):
    """Both floors None and the head the whole vocabulary: both tail masses are 0 (or rounding), rho_tail = 0 / 0
    was NaN. With no tail the term is the exact-support form, alpha = 1; the float64 formula says so, and the
    exact variant over an all-True support has the same coefficients."""
    bare = Centering(sc.rule, low=sc.low, high=sc.high, sampler_floor=None, trainer_floor=None)
    batch, _, _ = head_batch(2, V=9, K=9, drift=0.5, dtype=dtype)
    comp, weight = composition(bare)
    out = run(comp, batch)
    g_tok, g_head = gradients(out, batch)
    assert torch.isfinite(g_head).all() and torch.isfinite(out.loss.detach())
    wide = Batch(batch.trainer_logprobs.detach().double().requires_grad_(), batch.inference_logprobs.double(),
                 batch.advantages.double(), batch.loss_mask, topk_ids=batch.topk_ids,
                 topk_inference_logprobs=batch.topk_inference_logprobs.double(),
                 topk_trainer_logprobs=batch.topk_trainer_logprobs.detach().double())
    _, want_tok, want_head = reference(wide, bare, weight, whole=True)
    tol = dict(rtol=1e-9, atol=1e-12) if dtype == torch.float64 else dict(rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(g_tok.double(), want_tok, **tol)
    torch.testing.assert_close(g_head.double(), want_head, **tol)
    support = torch.ones(batch.topk_ids.shape, dtype=torch.bool)
    exact = Batch(batch.trainer_logprobs.detach().requires_grad_(), batch.inference_logprobs, batch.advantages,
                  batch.loss_mask, topk_ids=batch.topk_ids, topk_inference_logprobs=batch.topk_inference_logprobs,
                  topk_trainer_logprobs=batch.topk_trainer_logprobs.detach().requires_grad_(), topk_support=support)
    ecomp = Composition(comp.weight, centering=Centering(sc.rule, low=sc.low, high=sc.high, exact=True))
    torch.testing.assert_close(run(ecomp, exact).head_weights, out.head_weights, **tol)  # the same c_v


def test_untruncated_is_over_a_whole_vocabulary_head_is_zero_with_only_the_trainer_floored():
    """NeMo-RL's floors (the trainer's tail only) with f = x on a head of the whole vocabulary: the sampler's tail is 0
    or rounding either side of it. rho = 0 made alpha 0 * inf = NaN, a tail under 0 made alpha 0 (c = p); the tail is
    never below 0 and alpha takes its limit, 1, so the coefficient is 0 ("untruncated IS makes it zero")."""
    sc = Centering("clamp", low=0.0, high=math.inf, sampler_floor=None, trainer_floor=1e-6)
    for seed in range(4):
        batch, _, _ = head_batch(seed, V=9, K=9, drift=0.5)
        out = run(Composition(Weight("token"), centering=sc), batch)
        torch.testing.assert_close(out.head_weights, torch.zeros_like(out.head_weights), atol=1e-12, rtol=0)
        assert math.isfinite(float(out.loss.detach()))


def expected_gradient(sc: Centering | None, V: int = 7, support: torch.Tensor | None = None):
    """d/d theta of the expected loss under a constant reward (A = 1) when tokens come from the sampler q: one
    position, one rollout per token v weighted by q_v (the expectation, exactly), the head the whole vocabulary (or
    the replayed support, where the sampler truncated and the trainer's log-probs are renormalised on it)."""
    g = torch.Generator().manual_seed(7)
    theta = torch.randn(V, generator=g, dtype=torch.float64, requires_grad=True)
    logits_q = torch.randn(V, generator=g, dtype=torch.float64)
    if support is not None:
        logits_q = logits_q.masked_fill(~support, -math.inf)
    log_q = logits_q.log_softmax(-1)  # (V,)
    log_p = theta.log_softmax(-1)  # (V,) the trainer, differentiable in theta
    sampled = log_p if support is None else (log_p - torch.logsumexp(log_p[support], 0))  # what the trainer logs
    rows = torch.arange(V) if support is None else support.nonzero().squeeze(1)  # the tokens the sampler can draw
    n = len(rows)
    ids = torch.arange(V).expand(n, 1, V)  # (n, 1, V) the head: every token
    batch = Batch(sampled[rows][:, None], log_q[rows][:, None].detach(), log_q[rows].exp().detach() * n,
                  topk_ids=ids, topk_inference_logprobs=log_q.detach().expand(n, 1, V).clone(),
                  topk_trainer_logprobs=log_p.expand(n, 1, V),
                  topk_support=None if support is None else support.expand(n, 1, V).clone())
    comp = Composition(Weight("none"), centering=sc)
    # token-mean over n tokens with A_v = q_v n: the loss is sum_v q_v (per-sample loss), its expectation
    (grad,) = torch.autograd.grad(run(comp, batch).loss, theta)
    return grad


def test_a_constant_reward_moves_plain_reinforce_but_not_the_centered_gradient():
    """verl's test_drift_cancels_under_constant_reward, through seqis: the sampler's expected score is not 0 under
    the trainer (drift); the centered one is (the head is the whole vocabulary, so the tail model is exact)."""
    assert expected_gradient(None).abs().max() > 1e-3
    torch.testing.assert_close(expected_gradient(Centering("none")), torch.zeros(7, dtype=torch.float64),
                               atol=1e-12, rtol=0)


def test_the_exact_variant_cancels_the_drift_over_a_replayed_support():
    support = torch.tensor([True, True, False, True, False, True, True])
    assert expected_gradient(None, support=support).abs().max() > 1e-3
    torch.testing.assert_close(expected_gradient(Centering("none", exact=True), support=support),
                               torch.zeros(7, dtype=torch.float64), atol=1e-12, rtol=0)


def test_the_tail_model_is_verls_alpha_rho_f_of_one_over_rho():
    """One position, a head of 3 of 6 tokens: C_t = sum over H of (q f(p / q) - alpha p) log p with rho the tail
    masses' ratio and alpha = rho * f(1 / rho) (verl's test_composed_correction_uses_alpha_rho_f_one_over_rho)."""
    g = torch.Generator().manual_seed(5)
    head_p = torch.randn(6, generator=g, dtype=torch.float64).log_softmax(-1)[:3]
    head_q = torch.randn(6, generator=g, dtype=torch.float64).log_softmax(-1)[:3]
    batch = Batch(head_p[:1][None].clone(), head_q[:1][None], torch.ones(1, dtype=torch.float64),
                  topk_ids=torch.arange(3).view(1, 1, 3), topk_inference_logprobs=head_q.view(1, 1, 3),
                  topk_trainer_logprobs=head_p.view(1, 1, 3))
    out = run(Composition(Weight("token", clip=2.0), centering=Centering("truncate", high=2.0)), batch)
    rho = (1 - head_q.exp().sum()) / (1 - head_p.exp().sum())
    alpha = rho * torch.clamp(1 / rho, max=2.0)
    residual = head_q.exp() * (head_p - head_q).exp().clamp(max=2.0) - alpha * head_p.exp()
    assert out.scalars()["sc_correction"] == pytest.approx(float((residual * head_p).sum()), rel=1e-12)
    assert out.scalars()["sc_sampler_head_mass"] == pytest.approx(float(head_q.exp().sum()), rel=1e-12)
    assert out.scalars()["sc_train_head_mass"] == pytest.approx(float(head_p.exp().sum()), rel=1e-12)


def test_a_batch_without_a_head_is_refused_by_the_correction_s_name():
    batch, _, _ = head_batch(0)
    bare = Batch(batch.trainer_logprobs.detach(), batch.inference_logprobs, batch.advantages, batch.loss_mask)
    with pytest.raises(ValueError, match=r"this composition needs the sampler's top-k head.*topk_ids"):
        run(Composition(Weight("none"), centering=Centering()), bare)


def test_the_head_travels_with_select_and_to():
    batch, _, _ = head_batch(0)
    part = batch.select([2, 0])
    assert part.has_head and torch.equal(part.topk_ids, batch.topk_ids[[2, 0]])
    assert batch.to("cpu").has_head and "top-5 sampler head" in repr(batch)


@pytest.mark.parametrize("change, match", [
    (dict(topk_trainer_logprobs=None), r"needs topk_ids, topk_inference_logprobs, topk_trainer_logprobs together"),
    (dict(topk_ids="short"), r"Batch.topk_inference_logprobs must be a \(4, 6, K\) tensor"),
    (dict(topk_ids="float"), r"topk_ids must hold integer token ids"),
    (dict(topk_ids="below"), r"row 0, token 0, slot 1: topk_ids is -2"),
    (dict(topk_inference_logprobs="nan"), r"row 1, token 0, slot 3: topk_inference_logprobs is nan"),
])
def test_a_bad_head_is_refused_naming_the_field_row_token_and_slot(change, match):
    batch, _, _ = head_batch(0)
    kw = dict(topk_ids=batch.topk_ids, topk_inference_logprobs=batch.topk_inference_logprobs,
              topk_trainer_logprobs=batch.topk_trainer_logprobs.detach())
    for name, how in change.items():
        x = kw[name]
        if how is None:
            kw[name] = None
        elif how == "short":
            kw[name] = x[..., :2]
        elif how == "float":
            kw[name] = x.double()
        elif how == "below":
            kw[name] = x.clone()
            kw[name][0, 0, 1] = -2
        else:
            kw[name] = x.clone()
            kw[name][1, 0, 3] = math.nan
    with pytest.raises(ValueError, match=match):
        Batch(batch.trainer_logprobs.detach(), batch.inference_logprobs, batch.advantages, batch.loss_mask, **kw)


def test_padding_slots_and_positions_may_hold_anything():
    batch, _, _ = head_batch(0)
    ids, q = batch.topk_ids.clone(), batch.topk_inference_logprobs.clone()
    q[ids < 0] = math.nan  # empty slots
    q[~batch.loss_mask] = math.inf  # off the loss mask
    again = Batch(batch.trainer_logprobs.detach(), batch.inference_logprobs, batch.advantages, batch.loss_mask,
                  topk_ids=ids, topk_inference_logprobs=q, topk_trainer_logprobs=batch.topk_trainer_logprobs)
    out = run(Composition(Weight("token", clip=2.0), centering=Centering("truncate", high=2.0)), again)
    assert math.isfinite(float(out.loss))


def test_verl_export_writes_score_centering_and_refuses_what_verl_cannot_run():
    comp = Composition(Weight("token", band=(0.5, 5.0)), log_ratio_clamp=SAFETY_BOUND,
                       centering=Centering("band", low=0.5, high=5.0))
    snip = export(comp, "verl")
    doc = yaml.safe_load(snip.text)
    rc = doc["algorithm"]["rollout_correction"]
    assert rc["score_centering"] is True and rc["bypass_mode"] is True and rc["loss_type"] == "reinforce"
    assert [float(x) for x in rc["rollout_is_threshold"].split("_")] == [0.5, 5.0]
    actor = doc["actor_rollout_ref"]["actor"]["policy_loss"]
    assert actor["loss_mode"] == "bypass_mode" and actor["rollout_correction"]["score_centering"] is True
    assert doc["actor_rollout_ref"]["rollout"]["topk_log_probs"] == 128 and "FSDP" in snip.text
    for refused in (Composition(Weight("sequence", clip=2.0), centering=Centering("truncate", high=2.0)),
                    Composition(Weight("token", clip=3.0), centering=Centering("truncate", high=2.0)),
                    Composition(Weight("none"), centering=Centering("none", exact=True)),
                    Composition(Weight("none"), centering=Centering("none", trainer_floor=None))):
        assert not export(refused, "verl").expressible, refused.describe()
    others = {k: s for k, s in export_all(comp).items() if k != "verl"}
    # through a composition only Miles also writes score centering (its floors differ: a NOTE); the rest say so
    assert {k for k, s in others.items() if s.expressible} == {"miles"}, others
    assert not others["miles"].exact and any("tail mass" in u for u in others["miles"].uncarried)
    assert all("centering" in s.text for k, s in others.items() if k != "miles")


# ---------------------------------------------------------------------------------------------------------
# the head in files: every format and layout save_batch writes, vLLM's dicts, verl's names, capture


def _same_head(a: Batch, b: Batch) -> None:
    """Two batches' heads agree on every filled slot of a loss token (float32 in files)."""
    slots = (a.topk_ids >= 0) & a.loss_mask[..., None]
    K = a.topk_ids.shape[-1]
    assert torch.equal(torch.where(slots, a.topk_ids, -1), torch.where(slots, b.topk_ids[..., :K], -1))
    for name in ("topk_inference_logprobs", "topk_trainer_logprobs"):
        x, y = getattr(a, name).detach().float(), getattr(b, name).detach().float()[..., :K]
        torch.testing.assert_close(torch.where(slots, x, 0.0), torch.where(slots, y, 0.0))


@pytest.mark.parametrize("suffix, layout", [(".parquet", "rows"), (".jsonl", "rows"), (".json", "rows"),
                                            (".pt", "rows"), (".npz", "padded"), (".safetensors", "padded"),
                                            (".pt", "padded")])
def test_the_head_round_trips_through_every_file_and_the_correction_reads_it_back(tmp_path, suffix, layout):
    from seqis.io import load_batch, save_batch

    batch, _, _ = head_batch(5, dtype=torch.float32)
    path = tmp_path / f"head{suffix}"
    save_batch(batch, path, layout=layout)
    back = load_batch(path)
    assert back.has_head
    _same_head(batch, back)
    comp = Composition(Weight("token", clip=2.0), centering=Centering("truncate", high=2.0))
    assert run(comp, back).scalars()["sc_correction"] == pytest.approx(run(comp, batch).scalars()["sc_correction"],
                                                                       rel=1e-5, abs=1e-7)


def test_vllms_top_logprobs_and_verls_names_are_read(tmp_path):
    """vLLM's {token_id: logprob} per position (a number, or its Logprob as {"logprob": ...}) gives the sampler's ids
    and log-probs; verl's rollout_topk_ids / rollout_topk_log_probs are the same head under verl's names."""
    import json

    from seqis.io import load_batch

    rows = [{"trainer_logprobs": [-0.5, -1.0], "inference_logprobs": [-0.6, -0.9], "advantages": 1.0,
             "topk_logprobs": [{"7": -0.6, "3": {"logprob": -1.2, "rank": 2}}, {"1": -0.9}],
             "topk_trainer_logprobs": [[-0.5, -1.1], [-1.0]]},
            {"trainer_logprobs": [-0.2], "inference_logprobs": [-0.3], "advantages": -1.0,
             "topk_logprobs": [[[4, -0.3], [5, -2.0]]], "topk_trainer_logprobs": [[-0.2, -1.9]]}]
    path = tmp_path / "vllm.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    b = load_batch(path)
    assert b.topk_ids.tolist() == [[[7, 3], [1, -1]], [[4, 5], [-1, -1]]]
    assert b.topk_inference_logprobs[0, 0].tolist() == pytest.approx([-0.6, -1.2])
    assert b.topk_trainer_logprobs[1, 0].tolist() == pytest.approx([-0.2, -1.9])
    padded = tmp_path / "verl.npz"
    np = pytest.importorskip("numpy")
    np.savez(padded, old_log_probs=np.array([[-0.5, -1.0]]), rollout_log_probs=np.array([[-0.6, -0.9]]),
             advantages=np.array([1.0]), rollout_topk_ids=np.array([[[7, 3], [1, 2]]]),
             rollout_topk_log_probs=np.array([[[-0.6, -1.2], [-0.9, -1.5]]]),
             topk_trainer_logprobs=np.array([[[-0.5, -1.1], [-1.0, -1.4]]]))
    v = load_batch(padded)
    assert v.topk_ids.tolist() == [[[7, 3], [1, 2]]] and v.topk_inference_logprobs.shape == (1, 2, 2)


@pytest.mark.parametrize("row, match", [
    ({"topk_ids": [[1, 2], [3, "x"]]}, r"row 0, token 1, slot 1: column 'topk_ids' is 'x', not a token id"),
    ({"topk_ids": [[1, 2]]}, r"row 0: column 'topk_ids' has 1 positions; the rollout has 2"),
    ({"topk_logprobs": [{"1": -0.5}, {"a": -0.1}]}, r"row 0, token 1, slot 0: column 'topk_logprobs' holds"),
    ({"topk_inference_logprobs": [[-0.1, None], [-0.2, -0.3]]}, r"row 0, token 0, slot 1: topk_inference_logprobs"),
])
def test_a_bad_head_in_a_file_is_refused_naming_the_column_row_token_and_slot(tmp_path, row, match):
    import json

    from seqis.io import BatchFormatError, load_batch

    base = {"trainer_logprobs": [-0.5, -1.0], "inference_logprobs": [-0.6, -0.9], "advantages": 1.0,
            "topk_ids": [[1, 2], [3, 4]], "topk_inference_logprobs": [[-0.1, -2.0], [-0.2, -0.3]],
            "topk_trainer_logprobs": [[-0.1, -2.1], [-0.2, -0.4]]}
    if "topk_logprobs" in row:
        base = {k: v for k, v in base.items() if k not in ("topk_ids", "topk_inference_logprobs")}
        base["topk_trainer_logprobs"] = [[-0.5], [-1.0]]
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({**base, **row}) + "\n")
    with pytest.raises(BatchFormatError, match=match):
        load_batch(path)


def test_capture_writes_the_head_and_a_packed_layout_refuses_it(tmp_path):
    from seqis.io import load_batch, save_batch
    from seqis.io.capture import capture

    batch, _, _ = head_batch(6, dtype=torch.float32)
    path = capture(tmp_path / "step_1.parquet", trainer_logprobs=batch.trainer_logprobs,
                   inference_logprobs=batch.inference_logprobs, advantages=batch.advantages,
                   loss_mask=batch.loss_mask, topk_ids=batch.topk_ids,
                   topk_inference_logprobs=batch.topk_inference_logprobs,
                   topk_trainer_logprobs=batch.topk_trainer_logprobs)
    _same_head(batch, load_batch(path))
    with pytest.raises(ValueError, match="packed layout .* cannot carry the sampler's head"):
        save_batch(batch, tmp_path / "packed.npz", layout="packed")


def test_the_readmes_score_centering_example_runs_on_a_batch_with_a_head():
    import re
    from pathlib import Path

    text = (Path(__file__).parent.parent / "README.md").read_text()
    block = re.search(r"```python\n(from seqis import Composition, Weight, run\n.*?)```", text, flags=re.S).group(1)
    batch, _, _ = head_batch(8)
    scope: dict = {"batch": batch}
    exec(compile(block, "README.md", "exec"), scope)
    out = scope["out"]
    assert out.head_weights.shape == batch.topk_ids.shape and "sc_correction" in out.metrics
