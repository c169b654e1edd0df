"""Properties of every registered estimator (driven by ESTIMATORS), then hand-computed cases.

float64 throughout, so equalities are tight. A hypothesis batch has ragged lengths, empty rollouts,
-inf / NaN padding and log-ratios from tiny to catastrophic.
"""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import configs, examples

from seqis import AGGREGATIONS, ESTIMATORS, PRESETS, SEED_ESTIMATORS, Batch, diagnostics, run, run_many
from seqis.core.ratios import MAX_LOG_WEIGHT
from seqis.registry import needs_head

NAMES = list(ESTIMATORS)
# the properties that hold for any correction run at its defaults: every estimator and every preset
ALL = NAMES + sorted(k for k in PRESETS if not needs_head(k))  # these batches carry no head (SC: its own file)
D = torch.float64


def make_batch(B=6, T=9, *, seed=0, scale=0.3, per_token_adv=False, pad=-math.inf, empty=True):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0 if empty else 1, T + 1, (B,), generator=g)
    mask = torch.arange(T)[None, :] < lengths[:, None]  # (B, T)
    inference = -torch.rand(B, T, generator=g, dtype=D) * 3
    trainer = inference + scale * torch.randn(B, T, generator=g, dtype=D)
    trainer = torch.where(mask, trainer, torch.tensor(pad, dtype=D))
    inference = torch.where(mask, inference, torch.tensor(math.nan, dtype=D))
    adv = torch.randn(B, T, generator=g, dtype=D) if per_token_adv else torch.randn(B, generator=g, dtype=D)
    return Batch(trainer.requires_grad_(), inference, adv, mask)


@st.composite
def batches(draw):
    B = draw(st.integers(1, 6))
    T = draw(st.integers(1, 12))
    seed = draw(st.integers(0, 2**16))
    scale = draw(st.sampled_from([0.0, 1e-3, 0.05, 0.5, 3.0, 50.0]))
    pad = draw(st.sampled_from([-math.inf, math.nan, 0.0, 7.0]))
    return make_batch(B, T, seed=seed, scale=scale, pad=pad, per_token_adv=draw(st.booleans()))


def grad_of(out, batch):
    (g,) = torch.autograd.grad(out.loss, batch.trainer_logprobs)
    return g


def adv_bt(batch):
    a = batch.advantages
    return (a[:, None] if a.dim() == 1 else a).expand(batch.shape)


# ------------------------------------------------------------------------------------------------------
# properties over the whole registry


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=examples(40), deadline=None)
@given(batch=batches(), data=st.data())
def test_autograd_gradient_is_minus_weights_times_advantage(name, batch, data):
    cfg = data.draw(configs(name))
    out = run(name, batch, cfg)
    N = max(int(batch.loss_mask.sum()), 1)
    expected = -out.weights * adv_bt(batch) * cfg.adv_tau / N
    expected = torch.where(batch.loss_mask, expected, torch.zeros((), dtype=D))
    torch.testing.assert_close(grad_of(out, batch), expected, rtol=1e-12, atol=1e-300)
    # everything finite, weights detached and zero off the kept mask
    assert torch.isfinite(out.loss)
    assert torch.isfinite(out.weights).all()
    assert not out.weights.requires_grad
    assert (out.weights[~out.masks["kept"]] == 0).all()
    for k, v in out.metrics.items():
        assert math.isfinite(float(v)), k
    for k, m in out.masks.items():
        assert m.dtype == torch.bool and not (m & ~batch.loss_mask).any(), k
    if "clipped" in out.masks:  # the per-rollout flag (a row max where it can) agrees with the mask
        assert out.rollouts["clipped"].equal(out.masks["clipped"].any(-1))


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("agg", AGGREGATIONS)
def test_every_aggregation_matches_its_normaliser(name, agg):
    batch = make_batch(seed=3)
    out = run(name, batch, agg=agg)
    m = batch.loss_mask
    lengths = m.sum(-1).to(D)
    n_valid = int((lengths > 0).sum())
    if agg == "token-mean":
        scale = 1 / m.sum().to(D)
    elif agg == "kept-token-mean":
        scale = 1 / out.masks["kept"].sum().clamp(min=1).to(D)
    elif agg == "seq-mean-token-mean":
        scale = (1 / (lengths.clamp(min=1) * n_valid))[:, None]
    else:
        scale = 1 / n_valid
    expected = torch.where(m, -out.weights * adv_bt(batch) * scale, torch.zeros((), dtype=D))
    torch.testing.assert_close(grad_of(out, batch), expected, rtol=1e-12, atol=1e-300)


@pytest.mark.parametrize("name", ALL)
def test_on_policy_every_kept_weight_is_one_and_nothing_dropped(name):
    batch = make_batch(seed=1, scale=0.0, empty=False)
    out = run(name, batch)
    m = batch.loss_mask
    assert out.masks["kept"].equal(m), "on-policy nothing is dropped"
    torch.testing.assert_close(out.weights[m], torch.ones(int(m.sum()), dtype=D))
    s = out.scalars()
    assert s["is_masked"] == 0 and s["mismatch_kl"] == 0
    assert s.get("is_clipped", 0.0) == 0 and s.get("is_traj_masked", 0.0) == 0


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("pad", [math.inf, -math.inf, math.nan, 123.0])
def test_padding_values_change_nothing(name, pad):
    a = make_batch(seed=2, pad=0.0)
    tl = torch.where(a.loss_mask, a.trainer_logprobs.detach(), torch.tensor(pad, dtype=D)).requires_grad_()
    il = torch.where(a.loss_mask, a.inference_logprobs, torch.tensor(pad, dtype=D))
    b = Batch(tl, il, a.advantages, a.loss_mask)
    oa, ob = run(name, a), run(name, b)
    assert torch.isfinite(ob.loss)
    torch.testing.assert_close(oa.loss, ob.loss)
    torch.testing.assert_close(oa.weights, ob.weights)
    torch.testing.assert_close(grad_of(oa, a), grad_of(ob, b))
    assert oa.scalars() == ob.scalars()


@pytest.mark.parametrize("name", ALL)
def test_inputs_are_not_mutated(name):
    batch = make_batch(seed=4, pad=math.nan)
    before = [x.detach().clone() for x in (batch.trainer_logprobs, batch.inference_logprobs, batch.advantages)]
    mask = batch.loss_mask.clone()
    run(name, batch).loss.backward()
    after = (batch.trainer_logprobs.detach(), batch.inference_logprobs, batch.advantages)
    for x, y in zip(before, after):
        assert x.equal(y) or (x.isnan() == y.isnan()).all() and x[~x.isnan()].equal(y[~y.isnan()])
    assert batch.loss_mask.equal(mask)


@pytest.mark.parametrize("name", ALL)
def test_permuting_rollouts_permutes_per_rollout_outputs(name):
    batch = make_batch(B=8, seed=5, scale=0.4)
    perm = torch.randperm(8, generator=torch.Generator().manual_seed(0))
    pb = Batch(batch.trainer_logprobs.detach()[perm].requires_grad_(), batch.inference_logprobs[perm],
               batch.advantages[perm], batch.loss_mask[perm])
    oa, ob = run(name, batch), run(name, pb)
    torch.testing.assert_close(oa.weights[perm], ob.weights)
    for k in oa.rollouts:
        torch.testing.assert_close(oa.rollouts[k][perm], ob.rollouts[k], msg=k)
    for k in oa.masks:
        assert oa.masks[k][perm].equal(ob.masks[k]), k
    torch.testing.assert_close(oa.loss, ob.loss)


@pytest.mark.parametrize("name", ALL)
def test_run_many_equals_run(name):
    batch = make_batch(seed=6)
    many = run_many(ALL, batch)  # token weights on the shared profile here, dense alone: sums in another order
    one = run(name, batch)
    torch.testing.assert_close(many[name].weights, one.weights)
    torch.testing.assert_close(many[name].loss, one.loss)
    assert many[name].scalars() == pytest.approx(one.scalars(), rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("per_token_adv", [False, True])
def test_a_second_backward_gives_the_same_gradient(name, per_token_adv):
    # the first backward hands out the gradient the forward built; retain_graph=True must still work
    batch = make_batch(seed=8, per_token_adv=per_token_adv)
    out = run(name, batch)
    (g1,) = torch.autograd.grad(out.loss, batch.trainer_logprobs, retain_graph=True)
    g1 = g1.clone()
    (g2,) = torch.autograd.grad(out.loss * 2, batch.trainer_logprobs)
    torch.testing.assert_close(g2, 2 * g1, rtol=1e-12, atol=0)


@pytest.mark.parametrize("name", ALL)
def test_weights_and_masks_read_before_or_after_backward_agree(name):
    # weights and masks are built on first read; the backward consumes the forward's own tensors
    batch = make_batch(seed=9)
    early = run(name, batch)
    w, masks = early.weights.clone(), {k: m.clone() for k, m in early.masks.items()}
    grad_of(early, batch)
    late = run(name, batch)
    grad_of(late, batch)
    torch.testing.assert_close(late.weights, w, rtol=0, atol=0)
    assert list(late.masks) == list(masks) and all(late.masks[k].equal(m) for k, m in masks.items())


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("S", [800.0, -800.0])
def test_extreme_summed_log_ratio_gives_finite_loss_and_gradient(name, S):
    T = 100
    inference = torch.full((2, T), -1.0, dtype=D)
    trainer = (inference + S / T).clamp(max=0.0).requires_grad_()  # per-token l = +-8 (clamped to log pi <= 0)
    batch = Batch(trainer, inference, torch.tensor([1.0, -1.0], dtype=D))
    out = run(name, batch)
    g = grad_of(out, batch)
    assert torch.isfinite(out.loss) and torch.isfinite(g).all() and torch.isfinite(out.weights).all()
    assert all(math.isfinite(v) for v in out.scalars().values())


@pytest.mark.parametrize("name", ALL)
def test_no_loss_tokens_gives_zero_loss_with_working_backward(name):
    B, T = 3, 5
    tl = torch.full((B, T), -math.inf, dtype=D).requires_grad_()
    batch = Batch(tl, torch.zeros(B, T, dtype=D), torch.ones(B, dtype=D), torch.zeros(B, T, dtype=torch.bool))
    out = run(name, batch)
    assert float(out.loss.detach()) == 0.0
    out.loss.backward()
    assert (tl.grad == 0).all()
    assert all(v == 0.0 for v in out.scalars().values())


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_inputs_are_computed_in_float32(name, dtype):
    ref = make_batch(seed=7, scale=0.05, pad=0.0)
    tl = ref.trainer_logprobs.detach().to(dtype).requires_grad_()
    batch = Batch(tl, ref.inference_logprobs.nan_to_num(0.0).to(dtype), ref.advantages.to(dtype), ref.loss_mask)
    out = run(name, batch)
    assert out.weights.dtype == torch.float32
    out.loss.backward()
    assert tl.grad.dtype == dtype and torch.isfinite(tl.grad.float()).all()


# ------------------------------------------------------------------------------------------------------
# hand-computed cases (one rollout of 4 tokens unless said otherwise)


def one_rollout(l, adv=1.0, mask=None):
    """A batch whose log-ratios are exactly `l` (inference log-probs -1)."""
    l = torch.tensor([l], dtype=D)
    inference = torch.full_like(l, -1.0)
    trainer = (inference + l).requires_grad_()
    m = None if mask is None else torch.tensor([mask])
    return Batch(trainer, inference, torch.tensor([adv], dtype=D), m)


def test_seq_tis_clipped_weight_is_minus_two_times_adv():
    # S = 4 * 0.5 = 2 > log 2: w = e^2 = 7.39 is clipped to C = 2; grad = -2 * adv / N = -2 * 3 / 4
    b = one_rollout([0.5, 0.5, 0.5, 0.5], adv=3.0)
    out = run("seq_tis", b)
    torch.testing.assert_close(grad_of(out, b), torch.full((1, 4), -2.0 * 3.0 / 4, dtype=D))
    assert out.scalars()["is_clipped"] == 1.0 and out.scalars()["seq_weight"] == 2.0
    assert out.masks["clipped"].all() and bool(out.rollouts["clipped"][0])


def test_seq_tis_below_clip_is_the_product_weight():
    # S = 0.1 + 0.2 - 0.1 + 0 = 0.2 < log 2: weight e^0.2 on every token
    b = one_rollout([0.1, 0.2, -0.1, 0.0])
    out = run("seq_tis", b)
    torch.testing.assert_close(out.weights, torch.full((1, 4), math.exp(0.2), dtype=D))
    assert out.scalars()["is_clipped"] == 0.0


def test_seq_mis_untempered_in_region_weight():
    # S = 4 * 0.2 = 0.8, geometric ratio e^0.2 = 1.22 in [0.5, 2]: weight e^0.8, grad -e^0.8 * adv / 4
    b = one_rollout([0.2, 0.2, 0.2, 0.2], adv=-1.5)
    out = run("seq_mis", b)
    torch.testing.assert_close(grad_of(out, b), torch.full((1, 4), -math.exp(0.8) * -1.5 / 4, dtype=D))
    assert out.scalars()["seq_weight"] == pytest.approx(math.exp(0.8))


def test_seq_mis_e40_guard_at_summed_log_ratio_800():
    # 100 tokens of l = 8: geometric ratio e^8 is out of the band, so widen it; S = 800 -> weight e^40
    l = [8.0] * 100
    b = one_rollout(l)
    cfg = ESTIMATORS["seq_mis"].config(geo_mask_low=0.0, geo_mask_high=math.inf)
    out = run("seq_mis", b, cfg)
    torch.testing.assert_close(out.weights, torch.full((1, 100), math.exp(MAX_LOG_WEIGHT), dtype=D))
    assert torch.isfinite(grad_of(out, b)).all()


def test_geo_mask_inside_band_is_the_score_function():
    # geometric ratio exp(mean(0.3, -0.1, 0.2, 0)) = e^0.1 in [0.5, 2]: weight 1, grad -adv / N
    b = one_rollout([0.3, -0.1, 0.2, 0.0], adv=2.0)
    out = run("geo_mask", b)
    torch.testing.assert_close(grad_of(out, b), torch.full((1, 4), -2.0 / 4, dtype=D))
    assert out.scalars()["is_masked"] == 0.0


@pytest.mark.parametrize("l", [[-0.8] * 4, [0.8] * 4])
def test_geo_mask_rejects_both_sides_with_zero_gradient_that_still_backpropagates(l):
    # exp(-0.8) = 0.449 < 0.5 and exp(0.8) = 2.23 > 2: dropped; the loss is still differentiable
    b = one_rollout(l)
    out = run("geo_mask", b)
    assert out.loss.requires_grad
    assert (grad_of(out, b) == 0).all()
    s = out.scalars()
    assert s["is_masked"] == 1.0 and s["unmasked_mismatch_kl"] == 0.0
    k3 = math.expm1(l[0]) - l[0]
    assert s["masked_mismatch_kl"] == pytest.approx(k3)


def test_geo_mask_token_clip_hybrid_weight():
    # gate passes (mean 0.175); token weights min(rho_t, 1.5): e^0.6 = 1.82 -> 1.5, e^0.1, e^0, e^0 (l = 0)
    b = one_rollout([0.6, 0.1, 0.0, 0.0])
    cfg = ESTIMATORS["geo_mask"].config(token_clip=1.5)
    out = run("geo_mask", b, cfg)
    torch.testing.assert_close(out.weights, torch.tensor([[1.5, math.exp(0.1), 1.0, 1.0]], dtype=D))
    assert not out.weights.requires_grad
    assert out.masks["clipped"].tolist() == [[True, False, False, False]]


def test_geo_mask_token_clip_hybrid_gives_a_rejected_rollout_nothing():
    # rollout 0 passes the gate (l = 0.1 each); rollout 1 (l = -3 each, geometric e^-3 < 0.5) is rejected:
    # its token weights min(rho_t, 2) = e^-3 must not survive the gate
    t = torch.tensor([[0.0, 0.0], [-3.0, -3.0]], dtype=D)
    i = torch.tensor([[-0.1, -0.1], [0.0, 0.0]], dtype=D)
    b = Batch(t.requires_grad_(), i, torch.ones(2, dtype=D))
    out = run("geo_mask", b, ESTIMATORS["geo_mask"].config(token_clip=2.0))
    torch.testing.assert_close(out.weights, torch.tensor([[math.exp(0.1)] * 2, [0.0, 0.0]], dtype=D))
    assert (grad_of(out, b)[1] == 0).all() and out.rollouts["accepted"].tolist() == [True, False]


def test_mis_po_score_function_with_per_token_drops():
    # token band [0.5, 2] in log space [-0.693, 0.693]: l = 0.9 is dropped. Trajectory over all 5 tokens:
    # S = 0.9 - 0.9 + 0.001 - 0.001 + 0 = 0, geometric ratio 1 in [0.996, 1.001]: kept.
    b = one_rollout([0.9, -0.9, 0.001, -0.001, 0.0], adv=1.0)
    out = run("mis_po", b)
    expected_kept = [[False, False, True, True, True]]
    assert out.masks["kept"].tolist() == expected_kept
    torch.testing.assert_close(grad_of(out, b), -torch.tensor(expected_kept, dtype=D) / 5)
    s = out.scalars()
    assert s["is_token_masked"] == pytest.approx(2 / 5) and s["is_traj_masked"] == 0.0
    assert s["is_masked"] == pytest.approx(2 / 5)


def test_mis_po_trajectory_band_drops_the_whole_rollout():
    # mean log-ratio 0.002 > log 1.001 = 0.0009995: every token dropped
    b = one_rollout([0.002] * 4)
    out = run("mis_po", b)
    assert not out.masks["kept"].any() and out.masks["traj_masked"].all()
    assert out.scalars()["is_traj_masked"] == 1.0 and out.scalars()["is_token_masked"] == 0.0


def test_masks_are_computed_over_loss_tokens_only():
    # the padded token holds l = 50 (far out of every band) but is not a loss token: no effect
    b = one_rollout([0.0, 0.0, 50.0], mask=[True, True, False])
    for name in SEED_ESTIMATORS:
        out = run(name, b)
        assert out.masks["kept"].tolist() == [[True, True, False]], name
        assert out.scalars()["is_masked"] == 0.0, name
        assert float(out.rollouts["length"][0]) == 2


def test_mismatch_kl_is_k3_over_loss_tokens():
    l = [0.1, -0.2, 0.05]
    b = one_rollout(l)
    expected = sum(math.expm1(x) - x for x in l) / 3
    assert run("pg", b).scalars()["mismatch_kl"] == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_mismatch_kl_is_exact_k3_far_past_the_weight_cap(dtype):
    # k3 = rho - 1 - l exactly up to the dtype's overflow: a token at l = 80 reports e^80 - 81 = 5.54e34 (the old
    # cap at l = 40 gave 2.35e17), while its weight keeps the e^40 cap
    l = torch.tensor([[80.0, 0.1], [0.1, 0.1]], dtype=dtype)
    b = Batch(l.clone().requires_grad_(), torch.zeros_like(l), torch.ones(2, dtype=dtype))
    big, small = math.expm1(80) - 80, math.expm1(0.1) - 0.1
    assert run("pg", b).scalars()["mismatch_kl"] == pytest.approx((big + 3 * small) / 4, rel=1e-6)
    assert diagnostics(b)["kl_k3"] == pytest.approx((big + 3 * small) / 4, rel=1e-6)
    out = run("token_tis", b, ESTIMATORS["token_tis"].config(token_clip=math.inf))
    assert out.weights[0, 0] == pytest.approx(math.exp(MAX_LOG_WEIGHT), rel=1e-5)
    s = out.scalars()
    assert s["unmasked_mismatch_kl"] == pytest.approx((big + 3 * small) / 4, rel=1e-6)
    assert s["masked_mismatch_kl"] == 0.0


@pytest.mark.parametrize("name, knob", [("token_tis", "token_clip"), ("prefix_is", "prefix_clip"),
                                        ("geo_mask", "token_clip")])
@pytest.mark.parametrize("clip", [0.3, 1.0, 1.2, 3.0])
def test_clipped_rollouts_agree_with_the_clipped_mask_on_both_sides_of_ratio_1(name, knob, clip):
    # a clip >= 1 finds clipped rollouts by a row max (padding holds 0 or repeats a loss token's value);
    # below 1 a zero on padding would exceed it, so the mask is built. Gaps in the mask included.
    batch = make_batch(B=8, T=9, seed=16, scale=0.5, pad=math.nan)
    mask = batch.loss_mask.clone()
    mask[:, 0] = False  # a prompt token before the loss tokens
    mask[:, 4] = False  # and one in the middle
    b = Batch(batch.trainer_logprobs, batch.inference_logprobs, batch.advantages, mask)
    extra = {"geo_mask_low": 0.0, "geo_mask_high": math.inf} if name == "geo_mask" else {}
    out = run(name, b, ESTIMATORS[name].config(**{knob: clip}, **extra))
    flags = out.masks["clipped"].any(-1)
    assert out.rollouts["clipped"].equal(flags)
    assert 0 < int(flags.sum()) or clip == 3.0  # the case clips something


def test_token_tis_icepop_prefix_and_max_mask_by_hand():
    l = [0.9, -0.9, 1.8, 0.1]
    b = one_rollout(l)
    e = [math.exp(x) for x in l]  # 2.46, 0.41, 6.05, 1.105
    w = run("token_tis", b).weights[0].tolist()  # min(rho, 2)
    assert w == pytest.approx([2.0, e[1], 2.0, e[3]])
    w = run("icepop", b).weights[0].tolist()  # rho in [0.5, 5]: 0.41 and 6.05 dropped
    assert w == pytest.approx([e[0], 0.0, 0.0, e[3]])
    cfg = ESTIMATORS["prefix_is"].config(prefix_clip=5.0)
    w = run("prefix_is", b, cfg).weights[0].tolist()  # exp(cumsum) = e^0.9, e^0, e^1.8 -> 5 (clip), e^1.9 -> 5
    assert w == pytest.approx([e[0], 1.0, 5.0, 5.0])
    assert not run("max_mask", b).masks["kept"].any()  # 2.46 > 2: the whole rollout goes


def test_seq_mis_product_and_geo_is_by_hand():
    b = one_rollout([0.3, 0.3, 0.3])  # S = 0.9: w = 2.46 > 2 -> dropped by the product criterion
    assert not run("seq_mis_product", b).masks["kept"].any()
    b = one_rollout([0.2, 0.2, 0.2])  # S = 0.6: w = 1.82 <= 2 -> kept with weight 1.82
    assert run("seq_mis_product", b).weights[0].tolist() == pytest.approx([math.exp(0.6)] * 3)
    cfg = ESTIMATORS["geo_is"].config(geo_clip=1.1)  # geometric e^0.2 = 1.22 clipped to 1.1
    assert run("geo_is", b, cfg).weights[0].tolist() == pytest.approx([1.1] * 3)


# ------------------------------------------------------------------------------------------------------
# limits


def test_seq_tis_with_a_huge_clip_equals_seq_is():
    batch = make_batch(seed=8, scale=0.5)
    a = run("seq_tis", batch, ESTIMATORS["seq_tis"].config(seq_clip=1e30))
    b = run("seq_is", batch)
    torch.testing.assert_close(a.weights, b.weights)
    torch.testing.assert_close(grad_of(a, batch), grad_of(b, batch))


@pytest.mark.parametrize("name", ["geo_mask", "mis_po", "max_mask"])
def test_filters_with_infinite_bands_equal_pg(name):
    batch = make_batch(seed=9, scale=2.0)
    wide = {f: 0.0 for f in ("geo_mask_low", "token_mask_low")} | {f: math.inf for f in
                                                                     ("geo_mask_high", "token_mask_high")}
    cfg_cls = ESTIMATORS[name].config
    cfg = cfg_cls(**{k: v for k, v in wide.items() if k in cfg_cls.__dataclass_fields__})
    a, b = run(name, batch, cfg), run("pg", batch)
    torch.testing.assert_close(a.weights, b.weights)
    torch.testing.assert_close(grad_of(a, batch), grad_of(b, batch))


def test_seq_mis_with_infinite_band_equals_seq_is():
    batch = make_batch(seed=10, scale=0.5)
    cfg = ESTIMATORS["seq_mis"].config(geo_mask_low=0.0, geo_mask_high=math.inf)
    torch.testing.assert_close(run("seq_mis", batch, cfg).weights, run("seq_is", batch).weights)


# ------------------------------------------------------------------------------------------------------
# validation errors


@pytest.mark.parametrize(
    "name, knobs, message",
    [
        ("seq_tis", dict(seq_clip=0.0), "seq_clip must be > 0.0, got 0.0"),
        ("seq_tis", dict(seq_clip=-1.0), "seq_clip must be > 0.0, got -1.0"),
        ("seq_tis", dict(seq_clip=math.nan), "seq_clip must be a number, got nan"),
        ("seq_tis", dict(seq_clip="2"), "seq_clip must be a number, got '2'"),
        ("seq_tis", dict(adv_tau=0.0), "adv_tau must be > 0.0, got 0.0"),
        ("seq_tis", dict(adv_tau=math.inf), "adv_tau must be finite, got inf"),
        ("seq_mis", dict(geo_mask_low=2.0, geo_mask_high=0.5),
         "geo_mask_low must be below geo_mask_high, got 2.0 >= 0.5"),
        ("seq_mis", dict(geo_mask_low=-0.1), "geo_mask_low must be >= 0.0, got -0.1"),
        ("geo_mask", dict(token_clip=0.0), "token_clip must be > 0.0, got 0.0"),
        ("geo_mask", dict(geo_mask_low=1.0, geo_mask_high=1.0), "geo_mask_low must be below geo_mask_high"),
        ("mis_po", dict(token_mask_low=3.0), "token_mask_low must be below token_mask_high, got 3.0 >= 2.0"),
        ("mis_po", dict(geo_mask_high=0.9), "geo_mask_low must be below geo_mask_high, got 0.996 >= 0.9"),
        ("token_tis", dict(token_clip=None), "token_clip must be a number, got None"),
        ("icepop", dict(token_mask_high=-1.0), "token_mask_high must be > 0.0, got -1.0"),
        ("geo_is", dict(geo_clip=-math.inf), "geo_clip must be > 0.0, got -inf"),
        ("max_mask", dict(token_mask_low=True), "token_mask_low must be a number, got True"),
    ],
)
def test_config_validation_messages(name, knobs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ESTIMATORS[name].config(**knobs)


def test_defaults_are_the_seed_knobs():
    assert ESTIMATORS["seq_tis"].config().as_dict() == {"adv_tau": 1.0, "seq_clip": 2.0}
    assert ESTIMATORS["seq_mis"].config().as_dict() == {"adv_tau": 1.0, "geo_mask_low": 0.5, "geo_mask_high": 2.0}
    assert ESTIMATORS["geo_mask"].config().as_dict() == {
        "adv_tau": 1.0, "geo_mask_low": 0.5, "geo_mask_high": 2.0, "token_clip": None}
    assert ESTIMATORS["mis_po"].config().as_dict() == {
        "adv_tau": 1.0, "token_mask_low": 0.5, "token_mask_high": 2.0, "geo_mask_low": 0.996, "geo_mask_high": 1.001}
    assert ESTIMATORS["icepop"].config().as_dict() == {"adv_tau": 1.0, "token_mask_low": 0.5, "token_mask_high": 5.0}
    assert ESTIMATORS["geo_is"].config().geo_clip == math.inf
    assert ESTIMATORS["prefix_is"].config().prefix_clip == math.inf
    assert SEED_ESTIMATORS == ("seq_tis", "seq_mis", "geo_mask", "mis_po")


@pytest.mark.parametrize("name", NAMES)
def test_every_estimator_reports_its_metrics_and_a_summary(name):
    required = {
        "seq_tis": {"mismatch_kl", "is_clipped", "seq_log_ratio", "geo_log_ratio", "seq_weight"},
        "seq_mis": {"masked_mismatch_kl", "unmasked_mismatch_kl", "is_masked", "seq_log_ratio", "geo_log_ratio",
                    "seq_weight"},
        "geo_mask": {"masked_mismatch_kl", "unmasked_mismatch_kl", "is_masked", "geo_log_ratio"},
        "mis_po": {"masked_mismatch_kl", "unmasked_mismatch_kl", "is_masked", "is_token_masked", "is_traj_masked",
                   "geo_log_ratio"},
    }.get(name, set()) | {"mismatch_kl"}
    out = run(name, make_batch(seed=11))
    assert required <= set(out.metrics)
    spec = ESTIMATORS[name]
    assert spec.summary and spec.formula and spec.section("Source") and spec.section("Trades")
    assert set(out.rollouts) == {"length", "seq_log_ratio", "geo_log_ratio", "weight", "accepted", "clipped",
                                 "kept_fraction"}


def test_run_refuses_unknown_names_configs_and_aggregations():
    batch = make_batch()
    with pytest.raises(ValueError, match="unknown estimator 'nope'"):
        run("nope", batch)
    with pytest.raises(ValueError, match="seq_tis takes a SeqTISConfig, got SeqMISConfig"):
        run("seq_tis", batch, ESTIMATORS["seq_mis"].config())
    with pytest.raises(ValueError, match="agg must be one of"):
        run("seq_tis", batch, agg="mean")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cpu_expm1_is_within_an_ulp_of_the_exact_value(dtype):
    from seqis.core.ratios import expm1

    x = torch.cat([torch.tensor([0.0, -0.0, 1e-30, -1e-30, 1e-7, 88.0, 100.0, -100.0, 700.0, -math.inf, math.inf]),
                   torch.linspace(-30, 30, 10_001), torch.randn(10_000) * 1e-4]).to(dtype)
    strided = torch.stack([x, x], 1)[:, 0]  # not contiguous
    exact = torch.expm1(x.double())
    got = expm1(strided)
    assert got.dtype == dtype and got.shape == x.shape
    finite = torch.isfinite(exact.to(dtype))
    assert got[~finite].equal(exact.to(dtype)[~finite])  # overflow to inf, -1 at -inf
    rel = ((got[finite].double() - exact[finite]).abs() / exact[finite].abs().clamp(min=1e-300))
    assert float(rel.max()) <= 2 * torch.finfo(dtype).eps


def fast_correction(name, r, cfg=None):
    """The fast evaluator's Correction of a registry estimator on a batch's Ratios (its form, its kept rows)."""
    from seqis.evaluators import fast
    from seqis.registry import resolve

    return fast.correction(r, fast.Cache(), resolve(name, cfg))


def _everything(out, batch, per_token_adv):
    """Every tensor an output gives, backward included (twice: retain_graph, then a scaled second pass)."""
    (g1,) = torch.autograd.grad(out.loss, batch.trainer_logprobs, retain_graph=True)
    g1 = g1.clone()
    (g2,) = torch.autograd.grad(out.loss * 3, batch.trainer_logprobs)
    return {"loss": out.loss.detach(), "grad": g1, "grad2": g2, "weights": out.weights,
            **{f"mask {k}": m for k, m in out.masks.items()}, **{f"metric {k}": v for k, v in out.metrics.items()},
            **{f"rollout {k}": v for k, v in out.rollouts.items()}}


@pytest.mark.parametrize("agg", AGGREGATIONS)
@settings(max_examples=examples(25), deadline=None)
@given(batch=batches(), data=st.data())
def test_mis_po_sparse_and_dense_forms_agree(agg, batch, data):
    # a token band that drops tokens in few rollouts keeps only those rows' masks (Correction.kept_rows; none
    # when no row has a token outside); forced on (share 1) and off (share -1), the two forms (rows and tokens)
    # must give the same everything
    from seqis.core.ratios import Ratios

    cfg = data.draw(configs("mis_po"))
    per_token_adv = batch.advantages.dim() == 2
    got = {}
    for share, rows_form in [(1.0, True), (-1.0, False)]:
        r = Ratios.of(batch, sparse_share=share)
        c = fast_correction("mis_po", r, cfg)
        assert c.per_token != rows_form or per_token_adv
        got[rows_form] = _everything(run_many([("mis_po", cfg)], batch, agg=agg, ratios=r)["mis_po"], batch,
                                     per_token_adv)
    assert_same_everything(got[True], got[False])


def assert_same_everything(a, b, eps=1e-16):
    assert a.keys() == b.keys()
    # a metric that is a difference of sums (masked_mismatch_kl = (k3 total - kept k3) / n) rounds on the scale
    # of the whole batch's k3; the loss and the per-rollout means are sums the two paths may add in another
    # order (per rollout, then over rollouts; or all at once), and a self-normalised weight is divided by its mean
    # on one path and multiplied by its reciprocal on the other: exact to the compute dtype's rounding (eps)
    kl_scale = 1e4 * eps * (1 + float(b["metric mismatch_kl"]))
    for k in b:
        summed = k.startswith("metric") or k in ("loss", "rollout weight")
        tol = dict(rtol=max(1e-12, 10 * eps), atol=1e-300)
        if summed:
            tol = dict(rtol=max(1e-9, 100 * eps), atol=kl_scale)
        torch.testing.assert_close(a[k], b[k], **tol, msg=k)


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("kind", ["nan padding", "catastrophic", "per-token advantages", "bf16"])
def test_the_gpu_paths_give_what_the_cpu_shortcuts_give(name, kind):
    # on the CPU, data-dependent questions (is any log-ratio non-finite? are few rollouts touched by a token
    # band? does the backward get a gradient of 1?) skip passes; a GPU runs the passes instead. Both, here on
    # the CPU (Ratios.of(..., shortcuts=False) is what a GPU batch gets).
    from seqis.core.ratios import Ratios

    batch = {"nan padding": lambda: make_batch(seed=12, pad=math.nan),
             "catastrophic": lambda: make_batch(B=20, seed=13, scale=60.0),
             "per-token advantages": lambda: make_batch(seed=14, per_token_adv=True),
             "bf16": lambda: make_batch(seed=15, pad=math.inf)}[kind]()
    if kind == "bf16":
        t = batch.trainer_logprobs.detach().bfloat16().requires_grad_()
        batch = Batch(t, batch.inference_logprobs.bfloat16(), batch.advantages.bfloat16(), batch.loss_mask)
    per_token_adv = batch.advantages.dim() == 2
    cpu = _everything(run(name, batch), batch, per_token_adv)
    gpu = _everything(run_many([name], batch, ratios=Ratios.of(batch, shortcuts=False))[name], batch, per_token_adv)
    assert_same_everything(gpu, cpu, eps=torch.finfo(torch.float32 if kind == "bf16" else D).eps)


def test_mis_po_takes_the_sparse_form_when_few_rollouts_have_a_catastrophic_token():
    from seqis.core.ratios import Ratios

    batch = make_batch(B=32, T=9, seed=11, scale=0.01, empty=False)
    tl = batch.trainer_logprobs.detach().clone()
    tl[5, 0] += 3.0  # rho = e^3 > 2: outside the token band, in one rollout of 32
    b = Batch(tl.requires_grad_(), batch.inference_logprobs, batch.advantages, batch.loss_mask)
    c = fast_correction("mis_po", Ratios.of(b))
    rows, kept = c.kept_rows.rows, c.kept_rows.keep
    assert rows.tolist() == [5] and kept[0, 0] == 0 and kept[0, 1:].eq(b.loss_mask[5, 1:].to(D)).all()
    out = run("mis_po", b)
    assert not out.masks["kept"][5, 0] and out.masks["token_masked"].nonzero().tolist() == [[5, 0]]
    assert out.scalars()["is_token_masked"] == pytest.approx(1 / int(b.loss_mask.sum()))


def _sequence_level(name):
    from seqis.core.ratios import Ratios

    c = fast_correction(name, Ratios.of(make_batch()))
    return not c.per_token


@pytest.mark.parametrize("name", [n if n in ("seq_tis", "mis_po") else pytest.param(n, marks=pytest.mark.slow)
                                  for n in NAMES if _sequence_level(n)])
def test_a_sequence_level_output_lets_the_batch_log_ratios_go(name):
    # its weights and masks are built on first read from the loss mask alone: holding the output must not
    # hold the batch's (B, T) log-ratios, log-probs and k3 terms (a training loop keeps last step's output)
    import gc
    import weakref

    from seqis.core.ratios import Ratios

    batch = make_batch(seed=10)
    r = Ratios.of(batch)
    gone = weakref.ref(r.log_ratio)
    out = run_many([name], batch, ratios=r)[name]
    grad_of(out, batch)
    del r
    gc.collect()
    assert gone() is None, "the output keeps the Ratios alive"
    assert out.weights.shape == batch.shape and out.masks["kept"].shape == batch.shape


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_ratio_on_a_band_edge_is_inside_the_band(dtype):
    # drift: every token's ratio is 1.001, mis_po's trajectory band ends at 1.001. Rounded to float32 the
    # log-probs put S/T either side of log 1.001 (it dropped 117 of 256 rollouts); within the rounding of the
    # mean it is on the edge, and the edge is inside. Just past the edge (1.0011) every rollout goes.
    from seqis.core.compose import Composition, Criterion
    from seqis.samplers.scenarios import make_batch

    b = make_batch("drift", seed=0, dtype=dtype)
    B = b.shape[0]
    assert int(run("mis_po", b).rollouts["accepted"].sum()) == B
    assert int(run("mis_po", make_batch("drift", seed=0, dtype=dtype, ratio=1.0011)).rollouts["accepted"].sum()) == 0
    # the product ratio r^T on its edge: a sum criterion, T_j times the tolerance
    T = int(b.loss_mask[0].sum())
    same_length = Batch(b.trainer_logprobs[:1], b.inference_logprobs[:1], b.advantages[:1], b.loss_mask[:1])
    product_edge = Composition(criteria=(Criterion("ratio", "sum", high=1.001**T),))
    assert bool(run(product_edge, same_length).rollouts["accepted"][0])
    past = Composition(criteria=(Criterion("ratio", "sum", high=1.0009**T),))
    assert not bool(run(past, same_length).rollouts["accepted"][0])
