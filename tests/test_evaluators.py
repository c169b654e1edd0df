"""Three computations of every correction agree: each estimator's own `reference` (the formula in its file), the
plain evaluator of its composition (evaluators/plain.py, the definition) and the fast evaluator (evaluators/fast.py,
every form it can take); and for every preset, the plain and the fast evaluator.

Batches are hypothesis-drawn and ragged: float32 and float64, NaN / -inf / finite padding, empty rollouts,
prompt tokens inside the loss span, per-rollout and per-token advantages (some exactly 0), log-ratios from 0 to
catastrophic (a few tokens far out). Compositions are drawn too, from every part compose.py has (test_reference's
`compositions`: VESPO's gamma, M2PO's batch rule, rules that leave the normaliser, ...). A wrong formula fails:
the last tests break a reference and fast paths on purpose and check that the comparison catches it.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import configs, examples
from test_reference import compositions  # the reference test's draws: each part a helper adds is drawn here too

from seqis import AGGREGATIONS, ESTIMATORS, PRESETS, Batch, run
from seqis.core.compose import BatchRule, Composition, Criterion, Weight
from seqis.core.ratios import Ratios
from seqis.evaluators import fast as fast_module
from seqis.evaluators import rules
from seqis.evaluators.plain import evaluate
from seqis.registry import needs_head, resolve


@st.composite
def batches(draw, B_max=7, T_max=11):
    B, T = draw(st.integers(1, B_max)), draw(st.integers(1, T_max))
    dtype = draw(st.sampled_from([torch.float64, torch.float32]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    scale = draw(st.sampled_from([0.0, 1e-3, 0.05, 0.5, 3.0]))
    lengths = torch.randint(0, T + 1, (B,), generator=g)
    mask = torch.arange(T)[None, :] < lengths[:, None]  # (B, T)
    if draw(st.booleans()):
        mask[:, 0] = False  # a prompt token before the loss tokens
    inference = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    trainer = inference + scale * torch.randn(B, T, generator=g, dtype=torch.float64)
    if draw(st.booleans()):  # catastrophic tokens: a few far out of every band, either way
        hit = torch.rand(B, T, generator=g) < 0.08
        trainer = torch.where(hit, trainer + torch.where(torch.rand(B, T, generator=g) < 0.5, -8.0, 5.0), trainer)
    pad_t = draw(st.sampled_from([-math.inf, math.nan, 0.0, 5.0]))
    pad_i = draw(st.sampled_from([math.nan, -math.inf, 0.0]))
    shape = (B, T) if draw(st.booleans()) else (B,)
    adv = torch.randn(shape, generator=g, dtype=torch.float64)
    if draw(st.booleans()):
        adv = torch.where(torch.rand(shape, generator=g) < 0.25, 0.0, adv)  # some advantages exactly 0
    trainer = torch.where(mask, trainer, torch.tensor(pad_t, dtype=torch.float64)).to(dtype)
    inference = torch.where(mask, inference, torch.tensor(pad_i, dtype=torch.float64)).to(dtype)
    return Batch(trainer.requires_grad_(), inference, adv.to(dtype), mask)


def tolerance(batch: Batch) -> dict:
    return dict(rtol=1e-9, atol=1e-12) if batch.trainer_logprobs.dtype == torch.float64 else dict(rtol=1e-5,
                                                                                                 atol=1e-6)


def same_weights(got: tuple, want: tuple, batch: Batch, what: str) -> None:
    """(weights, kept) against (weights, kept)."""
    assert got[1].equal(want[1]), f"{what}: kept\n{got[1]}\nwant\n{want[1]}"
    torch.testing.assert_close(got[0].double(), want[0].double(), **tolerance(batch), msg=f"{what}: weights")


def same_output(a, b, batch: Batch, what: str) -> None:
    """Every part of two outputs: masks, weights, gradient, metrics and per-rollout values (valid rollouts)."""
    tol = tolerance(batch)
    assert set(a.masks) == set(b.masks), f"{what}: masks {sorted(a.masks)} vs {sorted(b.masks)}"
    for k in a.masks:
        assert a.masks[k].equal(b.masks[k]), f"{what}: mask {k}"
    torch.testing.assert_close(a.weights, b.weights, **tol, msg=f"{what}: weights")
    (ga,) = torch.autograd.grad(a.loss, batch.trainer_logprobs)
    (gb,) = torch.autograd.grad(b.loss, batch.trainer_logprobs)
    torch.testing.assert_close(ga, gb, **tol, msg=f"{what}: gradient")
    sa, sb = a.scalars(), b.scalars()
    assert sa.keys() == sb.keys(), f"{what}: metrics {sorted(sa)} vs {sorted(sb)}"
    kl = abs(sb["mismatch_kl"])
    for k in sa:  # a difference of k3 sums rounds on the scale of the batch's k3
        assert math.isclose(sa[k], sb[k], rel_tol=tol["rtol"] * 10, abs_tol=tol["atol"] * (1 + kl) * 10), \
            f"{what}: {k} {sa[k]} vs {sb[k]}"
    valid = b.rollouts["length"] > 0
    for k in a.rollouts:
        torch.testing.assert_close(a.rollouts[k][valid].double(), b.rollouts[k][valid].double(), **tol,
                                   msg=f"{what}: rollouts {k}")


# the fast evaluator's forms: CPU shortcuts, the GPU's passes (shortcuts off), token rules always in the sparse
# rows form, never sparse
FORMS = [dict(), dict(shortcuts=False), dict(sparse_share=1.0), dict(sparse_share=-1.0)]
FORM_IDS = ["cpu", "passes", "sparse", "dense"]


def fast(comp, batch: Batch, agg: str, form: dict):
    r = Ratios.of(batch, **form)
    return fast_module.evaluate_many({comp: 1}, batch, agg, r)[comp][0]


def fast_agrees(comp, batch: Batch, agg: str, form: dict, want, what: str) -> None:
    """The fast evaluator in this form gives `want` (its lazy parts, the gradient among them, made in it too)."""
    same_output(fast(comp, batch, agg, form), want, batch, what)


@pytest.mark.parametrize("name", list(ESTIMATORS))
@settings(max_examples=examples(25), deadline=None)
@given(batch=batches(), data=st.data())
def test_reference_plain_and_fast_agree_for_every_estimator(name, batch, data):
    cfg = data.draw(configs(name, adv_taus=(1.0, 0.5)))
    agg = data.draw(st.sampled_from(AGGREGATIONS))
    comp = resolve(name, cfg)
    plain = evaluate(comp, batch, agg)
    # the reference is float64 by definition: it meets the plain evaluator in float64, where a band edge is
    # exact (float32's rounding tolerance at an edge is the evaluators' own, held equal below)
    wide = batch if batch.trainer_logprobs.dtype == torch.float64 else Batch(
        batch.trainer_logprobs.detach().double(), batch.inference_logprobs.double(), batch.advantages.double(),
        batch.loss_mask)
    plain64 = plain if wide is batch else evaluate(comp, wide, agg)
    same_weights((plain64.weights, plain64.masks["kept"]), ESTIMATORS[name].reference(batch, cfg), wide,
                 f"{name} plain vs its reference")
    fast_agrees(comp, batch, agg, data.draw(st.sampled_from(FORMS)), plain, f"{name} fast vs plain")


@pytest.mark.parametrize("key", sorted(k for k in PRESETS if not needs_head(k)))  # SC: test_score_centering_fast
@settings(max_examples=examples(10), deadline=None)
@given(batch=batches(), agg=st.sampled_from(AGGREGATIONS), form=st.sampled_from(FORMS))
def test_plain_and_fast_agree_for_every_preset(key, batch, agg, form):
    comp = resolve(key)
    assert fast_module.supports(comp), f"{key} has a part the fast evaluator lacks"  # run_many's row needs all fast
    fast_agrees(comp, batch, agg, form, evaluate(comp, batch, agg), f"{key} fast vs plain")


@settings(max_examples=examples(150), deadline=None)
@given(comp=compositions(), batch=batches(), agg=st.sampled_from(AGGREGATIONS), form=st.sampled_from(FORMS))
def test_plain_and_fast_agree_on_any_composition(comp, batch, agg, form):
    if fast_module.supports(comp):
        fast_agrees(comp, batch, agg, form, evaluate(comp, batch, agg), f"{comp.describe()} fast vs plain")
    else:
        same_output(run(comp, batch, agg=agg), evaluate(comp, batch, agg), batch, f"{comp.describe()} vs plain")


def test_a_composition_the_fast_evaluator_lacks_runs_on_the_plain_one(monkeypatch):
    # the registry hands a composition with a part fast.supports does not know to the plain evaluator
    monkeypatch.setattr(fast_module, "supports", lambda comp: False)
    monkeypatch.setattr(fast_module, "evaluate_many", None)  # never called
    batch = _acting_batch(torch.float64, per_token=False)
    for key in ("trl/vespo", "areal/m2po"):
        out, plain = run(key, batch), evaluate(resolve(key), batch)
        assert torch.equal(out.weights, plain.weights) and torch.equal(out.masks["kept"], plain.masks["kept"])


# ------------------------------------------------------------------------------------------------------
# the parts decided over the whole batch or scaling the normaliser, where they act


def _acting_batch(dtype, per_token: bool, B=16, T=12) -> Batch:
    """Small noise, one rollout far off (mean e^|l| above 2), catastrophic tokens in two others, two tokens of
    equal l^2 (a tie M2PO may cut), an empty rollout, NaN padding."""
    g = torch.Generator().manual_seed(7)
    lengths = torch.randint(3, T + 1, (B,), generator=g)
    lengths[0] = 0
    mask = torch.arange(T)[None, :] < lengths[:, None]
    inference = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    l = 0.05 * torch.randn(B, T, generator=g, dtype=torch.float64)
    l[1, :3] = torch.tensor([1.5, -1.2, 1.1])  # rollout 1: mean e^|l| above 2 once its length is 3
    lengths[1] = 3
    l[4, 2], l[9, 0] = 2.5, -2.5  # a tie in l^2, exact: l = -0.5 - (-3) and -5.5 - (-3)
    inference[4, 2] = inference[9, 0] = -3.0
    l[6, 1] = 4.0  # above every token clip
    mask = torch.arange(T)[None, :] < lengths[:, None]
    trainer = torch.where(mask, inference + l, math.nan)
    adv = torch.randn((B, T) if per_token else (B,), generator=g, dtype=torch.float64)
    return Batch(trainer.to(dtype).requires_grad_(), inference.to(dtype), adv.to(dtype), mask)


ACTING = {
    "m2po": Composition(Weight("token"), (Criterion("ratio", "token", high=5.0),), batch_rule=BatchRule(0.04)),
    "m2po alone": Composition(Weight("none"), batch_rule=BatchRule(0.12)),  # drops l = 4 and one of the tie
    "m2po dropping nothing": Composition(Weight("sequence"), batch_rule=BatchRule(5.0)),
    "vespo": Composition(Weight("sequence", token_clip=3.0, gamma=(2.0, 3.0, 3.0, 2.0)), log_ratio_clamp=20.0),
    # knobs not exact in float32: the plain evaluator keeps them in float64 (torch.where on python floats rounds)
    "vespo, knobs inexact in float32": Composition(Weight("sequence", gamma=(0.3, 0.7, 1.3, 0.1))),
    "rollout rule leaving N": Composition(Weight("token", clip=5.0), (
        Criterion("exp_abs_log_ratio", "mean", high=2.0, leaves_normaliser=True),)),
    "token rule leaving N, with M2PO": Composition(Weight("geometric"), (
        Criterion("k2", "token", high=1.0, advantage="positive", leaves_normaliser=True),
        Criterion("exp_abs_log_ratio", "max", high=10.0, leaves_normaliser=True)), batch_rule=BatchRule(0.04)),
}


@pytest.mark.parametrize("form", FORMS, ids=FORM_IDS)
@pytest.mark.parametrize("per_token", [False, True], ids=["rollout advantages", "token advantages"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name", list(ACTING))
def test_the_batch_rule_gamma_and_normaliser_where_they_act(name, dtype, per_token, form):
    comp, batch = ACTING[name], _acting_batch(dtype, per_token)
    plain = evaluate(comp, batch)
    kept = plain.masks["kept"]
    # the batch does what the case is for: something dropped (or, at M2PO's threshold 5, nothing)
    assert (batch.loss_mask & ~kept).any() == (name not in ("vespo", "vespo, knobs inexact in float32",
                                                            "m2po dropping nothing")), name
    if name == "m2po alone":  # the cut falls inside the tie: the first in batch order goes
        assert kept[4, 2].item() is False and kept[9, 0].item() is True and (~kept & batch.loss_mask).sum() == 2
    for agg in AGGREGATIONS:
        fast_agrees(comp, batch, agg, form, evaluate(comp, batch, agg), f"{name} ({agg})")


@pytest.mark.parametrize("T", [4096, 1000, 333])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_statistics_made_in_blocks_of_rows_equal_one_pass(T, dtype):
    # the statistics the fast evaluator takes from the definition's own elementwise code, made in blocks of rows
    # (several blocks at these sizes; the drawn batches above fit in one): the same values to the bit, nan
    # where a log-prob above 0 makes a probability above 1
    from seqis.evaluators.plain import statistic as plain_statistic

    g = torch.Generator().manual_seed(T)
    B = (1 << 19) // T  # 8 or 9 blocks
    mask = torch.arange(T)[None, :] < torch.randint(0, T + 1, (B,), generator=g)[:, None]
    inference = -torch.rand(B, T, generator=g, dtype=torch.float64).pow(4) * 4
    trainer = torch.where(mask, inference + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64), -math.inf)
    batch = Batch(trainer.to(dtype), inference.to(dtype), torch.randn(B, generator=g, dtype=dtype), mask)
    r, cache = Ratios.of(batch), fast_module.Cache()
    logp, logq = cache.logp(r), cache.logq(r)
    for name in ("exp_abs_log_ratio", "abs_ratio_minus_one", "binary_kl", "binary_kl_mu", "logit_gradient"):
        want = plain_statistic(name, r.log_ratio, logp, logq).masked_fill(~mask, 0.0)
        torch.testing.assert_close(rules.statistic(r, cache, name), want, rtol=0, atol=0, equal_nan=True,
                                   msg=name)


# ------------------------------------------------------------------------------------------------------
# a wrong formula fails


def _any_disagreement(check) -> bool:
    """Whether check(batch) fails on any of 40 fixed ragged batches (log-ratio scale 0.5)."""
    for seed in range(40):
        g = torch.Generator().manual_seed(seed)
        B, T = 6, 9
        mask = torch.arange(T)[None, :] < torch.randint(1, T + 1, (B,), generator=g)[:, None]
        inference = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
        trainer = (inference + 0.5 * torch.randn(B, T, generator=g, dtype=torch.float64)).requires_grad_()
        batch = Batch(trainer, inference, torch.randn(B, generator=g, dtype=torch.float64), mask)
        try:
            check(batch)
        except AssertionError:
            return True
    return False


def test_a_wrong_reference_fails():
    # geo_is's weight written with the product ratio exp(S_j) instead of the geometric exp(S_j / T_j)
    spec = ESTIMATORS["geo_is"]
    cfg = spec.config()

    def wrong(batch, cfg):
        m = batch.loss_mask
        l = torch.where(m, batch.trainer_logprobs.detach().double() - batch.inference_logprobs.double(), 0.0)
        w = torch.exp(l.sum(-1).clamp(max=40.0))
        return torch.where(m, w[:, None], 0.0), m.clone()

    def check(reference):
        return lambda batch: same_weights((lambda o: (o.weights, o.masks["kept"]))(evaluate(resolve("geo_is"), batch)),
                                          reference(batch, cfg), batch, "geo_is")

    assert not _any_disagreement(check(spec.reference)), "the right formula agrees"
    assert _any_disagreement(check(wrong)), "a wrong formula must fail the comparison"


def test_a_wrong_normaliser_fails(monkeypatch):
    # the tokens a rule takes out of the count N counted one too many: N / (N_after - 1)
    comp = ACTING["rollout rule leaving N"]
    batch = _acting_batch(torch.float64, per_token=False)
    same_output(fast(comp, batch, "token-mean", {}), evaluate(comp, batch), batch, "right")
    real = fast_module.left_out
    monkeypatch.setattr(fast_module, "left_out", lambda *a: (lambda n: None if n is None else n + 1)(real(*a)))
    with pytest.raises(AssertionError):
        same_output(fast(comp, batch, "token-mean", {}), evaluate(comp, batch), batch, "wrong")


def test_a_wrong_fast_path_fails(monkeypatch):
    # the fast path's truncation made one clip too lax: min(w, 1.1 C) instead of min(w, C)
    comp = resolve("seq_tis")
    check = lambda batch: same_output(fast(comp, batch, "token-mean", {}), evaluate(comp, batch), batch, "seq_tis")
    assert not _any_disagreement(check), "the fast path agrees"
    real = fast_module.capped_exp
    monkeypatch.setattr(fast_module, "capped_exp", lambda x, clip=math.inf, exact=False: real(x, clip * 1.1, exact))
    assert _any_disagreement(check), "a wrong fast path must fail the comparison"
