"""Synthetic batches: every scenario's statistics against its definition, reproducible seeds, validated knobs.

Statistical checks use a fixed seed and compare against the definition within a few standard errors
(a failing seed may be bumped once, never twice).
"""

import dataclasses
import math

import pytest
import torch

from seqis import Batch, diagnostics, knobs
from seqis.samplers.scenarios import (
    MAX_LEN,
    PRECISION_EPS,
    SCENARIOS,
    ScenarioConfig,
    config,
    describe,
    lagged_policies,
    make_batch,
    sample_lengths,
)

FIXED = dict(lengths="fixed", n_rollouts=64, max_len=1024)  # 65536 loss tokens


def log_ratio(b: Batch) -> torch.Tensor:
    """(n_tokens,) l_t over loss tokens, in float64."""
    return (b.trainer_logprobs.double() - b.inference_logprobs.double())[b.loss_mask]


def within(x: float, target: float, se: float, k: float = 4.0):
    assert abs(x - target) <= k * se, f"{x} is not {target} within {k} standard errors ({se})"


# ---------------------------------------------------------------------------------------------------------
# every scenario


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_scenario_builds_a_valid_batch(name):
    b = make_batch(name, seed=0)
    B, T = b.shape
    cfg = SCENARIOS[name]()
    assert B == cfg.n_rollouts and T <= cfg.max_len
    assert b.trainer_logprobs.dtype == torch.float32 and b.advantages.shape == (B,)
    for key in ("group_id", "reward", "length"):
        assert len(b.metadata[key]) == B
    assert b.loss_mask.sum(-1).tolist() == b.metadata["length"]
    # the mask is a prefix: rollout j's tokens are positions 0 .. length_j - 1
    lengths = torch.tensor(b.metadata["length"])
    assert torch.equal(b.loss_mask, torch.arange(T)[None, :] < lengths[:, None])
    for x in (b.trainer_logprobs, b.inference_logprobs):
        assert torch.isfinite(x).all() and (x[b.loss_mask] <= 0).all()
    assert set(b.metadata["reward"]) <= {0.0, 1.0}
    d = diagnostics(b)
    assert d["n_tokens"] == sum(b.metadata["length"])


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_same_seed_same_batch_other_seed_other_batch(name):
    a, b, c = make_batch(name, seed=5), make_batch(name, seed=5), make_batch(name, seed=6)
    for f in ("trainer_logprobs", "inference_logprobs", "advantages", "loss_mask"):
        assert torch.equal(getattr(a, f), getattr(b, f)), f
    assert a.metadata == b.metadata
    assert not (a.shape == c.shape and torch.equal(a.inference_logprobs, c.inference_logprobs))


def test_global_rng_is_neither_used_nor_disturbed():
    torch.manual_seed(0)
    before = torch.rand(3)
    torch.manual_seed(0)
    a = make_batch("policy_lag", seed=1)
    after = torch.rand(3)  # make_batch drew nothing from the global generator
    torch.manual_seed(123)
    b = make_batch("policy_lag", seed=1)
    assert torch.equal(before, after) and torch.equal(a.trainer_logprobs, b.trainer_logprobs)


def test_device_and_dtype():
    a = make_batch("gaussian", seed=2, device="cpu", dtype=torch.float64)
    assert a.trainer_logprobs.dtype == torch.float64 and a.advantages.dtype == torch.float64
    b = make_batch("gaussian", seed=2)
    assert torch.allclose(a.trainer_logprobs.float(), b.trainer_logprobs)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_same_seed_same_batch_on_gpu():
    a, b = make_batch("precision", seed=3), make_batch("precision", seed=3, device="cuda")
    assert b.device.type == "cuda"
    for f in ("trainer_logprobs", "inference_logprobs", "advantages", "loss_mask"):
        assert torch.equal(getattr(a, f), getattr(b, f).cpu()), f


def test_config_object_with_overrides():
    cfg = SCENARIOS["gaussian"](s=0.1, n_rollouts=16)
    a = make_batch(cfg, seed=1, max_len=64)
    b = make_batch("gaussian", seed=1, s=0.1, n_rollouts=16, max_len=64)
    assert torch.equal(a.trainer_logprobs, b.trainer_logprobs)
    assert config("gaussian", s=0.2).s == 0.2


# ---------------------------------------------------------------------------------------------------------
# lengths, LLM-like log-probs, GRPO advantages


def test_lengths_fixed_uniform_long_tail():
    fixed = make_batch("gaussian", seed=0, lengths="fixed", max_len=300)
    assert set(fixed.metadata["length"]) == {300}
    g = torch.Generator().manual_seed(0)
    uni = sample_lengths(config("gaussian", lengths="uniform", n_rollouts=2048, min_len=100, max_len=300), g).double()
    assert uni.min() >= 100 and uni.max() <= 300
    within(float(uni.mean()), 200.0, math.sqrt((201**2 - 1) / 12 / 2048))
    tail = sample_lengths(config("gaussian", n_rollouts=4096, min_len=16, max_len=8192), g).double()
    assert tail.min() >= 16 and tail.max() <= 8192
    assert float(tail.median()) < 8192 / 4  # most are short: the median is about min + span / 8
    assert 0.005 < float((tail == 8192).double().mean()) < 0.05  # a few reach the maximum (about 2%)


def test_lengths_up_to_32k():
    b = make_batch("gaussian", seed=0, n_rollouts=2, lengths="fixed", max_len=MAX_LEN)
    assert b.shape == (2, MAX_LEN)
    with pytest.raises(ValueError, match="max_len must be at most 32768"):
        config("gaussian", max_len=MAX_LEN + 1)


def test_llm_shaped_inference_logprobs():
    b = make_batch("drift", seed=0, ratio=1.0, branch_frac=0.2, **FIXED)  # l = 0: both are the base log-probs
    lp = b.inference_logprobs.double()[b.loss_mask]
    branch = lp < -0.5
    n = lp.numel()
    within(float(branch.double().mean()), 0.2, math.sqrt(0.2 * 0.8 / n))
    certain = lp[~branch]
    assert certain.min() >= -1e-2 - 1e-9 and certain.max() <= -1e-3 + 1e-9
    assert lp[branch].min() >= -8 - 1e-6 and lp[branch].max() <= -1 + 1e-6
    # log-uniform magnitude: the median branching log-prob is -sqrt(8) = -2.83
    within(float(lp[branch].median()), -math.sqrt(8), 0.02)


def test_grpo_advantages_are_reward_minus_group_mean():
    b = make_batch("gaussian", seed=4, n_rollouts=30, group_size=8)  # the last group has 6 rollouts
    gid, reward = b.metadata["group_id"], b.metadata["reward"]
    assert gid == [j // 8 for j in range(30)]
    for g in set(gid):
        idx = [j for j in range(30) if gid[j] == g]
        mean = sum(reward[j] for j in idx) / len(idx)
        for j in idx:
            assert b.advantages[j].item() == pytest.approx(reward[j] - mean, abs=1e-6)


def test_norm_std_divides_by_the_group_std():
    raw = make_batch("gaussian", seed=4, n_rollouts=64, group_size=8)
    norm = make_batch("gaussian", seed=4, n_rollouts=64, group_size=8, norm_std=True)
    r = torch.tensor(raw.metadata["reward"], dtype=torch.float64).view(8, 8)
    std = r.std(-1, keepdim=True)  # unbiased, as GRPO
    expected = (r - r.mean(-1, keepdim=True)) / (std + 1e-6)
    assert torch.allclose(norm.advantages.double().view(8, 8), expected, atol=1e-5)


def test_reward_rate_and_length_correlation():
    b = make_batch("gaussian", seed=0, n_rollouts=4096, success_rate=0.3, reward_length_corr=-0.8, max_len=256)
    r = torch.tensor(b.metadata["reward"])
    within(float(r.mean()), 0.3, math.sqrt(0.3 * 0.7 / 4096))
    log_len = torch.tensor(b.metadata["length"]).double().log()
    corr = torch.corrcoef(torch.stack([r, log_len]))[0, 1]
    assert corr < -0.4  # latent correlation -0.8, seen through a 0/1 threshold


# ---------------------------------------------------------------------------------------------------------
# the mismatch scenarios against their definitions


@pytest.mark.parametrize("s", [0.05, 0.2])
def test_gaussian_is_valid_is_noise(s):
    b = make_batch("gaussian", seed=1, s=s, **FIXED)
    l = log_ratio(b)
    n = l.numel()
    within(float(l.mean()), -s * s / 2, s / math.sqrt(n))
    within(float(l.var()), s * s, s * s * math.sqrt(2 / n))
    rho = l.exp()
    within(float(rho.mean()), 1.0, float(rho.std()) / math.sqrt(n))  # E_mu[rho] = 1
    k3 = rho - 1 - l  # per-token KL(mu || pi) = s^2 / 2
    within(float(k3.mean()), s * s / 2, float(k3.std()) / math.sqrt(n))
    assert diagnostics(b)["kl_k3"] == pytest.approx(s * s / 2, rel=0.05)


def test_drift_is_deterministic_and_not_valid_is():
    assert "NOT a valid IS model" in describe("drift")
    b = make_batch("drift", seed=0, ratio=1.001, **FIXED)
    l = log_ratio(b)
    assert torch.allclose(l, torch.full_like(l, math.log(1.001)), atol=1e-6)
    # the product ratio of a rollout of T tokens is r^T (Li's table: 2.72 at T = 1000)
    S = (b.trainer_logprobs.double() - b.inference_logprobs.double()).sum(-1)
    assert torch.allclose(S.exp(), torch.full_like(S, 1.001**1024), rtol=1e-3)


def test_catastrophic_tokens():
    cfg = dict(cat_frac=0.002, cat_size=10.0, cat_on_branch=0.9, cat_positive=0.25, s=0.0)
    b = make_batch("catastrophic", seed=0, n_rollouts=256, lengths="fixed", max_len=1024, **cfg)
    l = log_ratio(b)
    base = torch.maximum(b.trainer_logprobs, b.inference_logprobs).double()[b.loss_mask]  # the LLM-like value
    cat = l.abs() > 1.0  # catastrophes are 10 x/÷ e; the background is 0 here
    n, k = l.numel(), int(cat.sum())
    within(k / n, 0.002, math.sqrt(0.002 / n))
    on_branch = float((base[cat] <= -1.0 + 1e-6).double().mean())
    within(on_branch, 0.9, math.sqrt(0.09 / k))
    within(float((l[cat] > 0).double().mean()), 0.25, math.sqrt(0.25 * 0.75 / k))
    size = l[cat].abs()
    assert size.min() >= 10 / math.e - 1e-4 and size.max() <= 10 * math.e + 1e-4
    assert torch.equal(l[~cat], torch.zeros_like(l[~cat]))


def test_precision_noise_grows_as_probability_falls():
    b = make_batch("precision", seed=0, preset="bf16", branch_frac=0.3, **FIXED)
    l = log_ratio(b)
    base = torch.maximum(b.trainer_logprobs, b.inference_logprobs).double()[b.loss_mask]
    sigma = PRECISION_EPS["bf16"] * -torch.expm1(base)  # eps (1 - p_t)
    z = (l + sigma**2 / 2) / sigma  # standardised: N(0, 1) if l ~ N(-sigma^2/2, sigma^2)
    n = z.numel()
    within(float(z.mean()), 0.0, 1 / math.sqrt(n))
    within(float(z.var()), 1.0, math.sqrt(2 / n))
    branch = base < -0.5
    assert l[branch].abs().mean() > 50 * l[~branch].abs().mean()  # certain tokens barely move
    within(float(l.exp().mean()), 1.0, float(l.exp().std()) / math.sqrt(n))
    kl = {p: diagnostics(make_batch("precision", seed=0, preset=p))["kl_k3"] for p in PRECISION_EPS}
    assert kl["fp16"] < kl["bf16"] < kl["fp8"]
    assert 1e-4 < kl["bf16"] < 1e-3  # where bf16 engines are measured


def test_policy_lag():
    zero = make_batch("policy_lag", seed=0, lag=0)
    assert torch.equal(zero.trainer_logprobs, zero.inference_logprobs)  # no steps: pi = mu
    kls = [diagnostics(make_batch("policy_lag", seed=0, lag=k))["kl_k3"] for k in (2, 8, 16)]
    assert 0 < kls[0] < kls[1] < kls[2]
    # tokens are sampled from mu, so E_mu[pi / mu] = 1 exactly: a check of the sampler
    b = make_batch("policy_lag", seed=1, lag=16, lr=0.3, **FIXED)
    rho = log_ratio(b).exp()
    assert float(rho.std()) > 0.05
    within(float(rho.mean()), 1.0, float(rho.std()) / math.sqrt(rho.numel()))


def test_policy_lag_policies_are_log_softmaxes():
    cfg = config("policy_lag", lag=8, vocab=16, contexts=32)
    log_mu, log_pi = lagged_policies(cfg, torch.Generator().manual_seed(0))
    assert log_mu.shape == log_pi.shape == (32, 16)
    for x in (log_mu, log_pi):
        assert torch.allclose(x.exp().sum(-1), torch.ones(32, dtype=torch.float64))
    # each step raises the target's probability: the trainer's policy is the sampler's, trained
    assert (log_pi.max(-1).values - log_mu.max(-1).values).abs().max() < 8 * cfg.lr * 2


def test_policy_lag_samples_tokens_from_mu():
    # one context, four tokens: a token with log-prob v under mu must be drawn a fraction e^v of the time
    b = make_batch("policy_lag", seed=0, vocab=4, contexts=1, branch_frac=1.0, n_rollouts=16, **{
        "lengths": "fixed", "max_len": 4096})
    drawn = b.inference_logprobs.double()[b.loss_mask]
    values, counts = torch.unique(drawn, return_counts=True)
    assert len(values) == 4
    n = drawn.numel()
    assert float(values.exp().sum()) == pytest.approx(1.0, abs=1e-5)
    for v, c in zip(values.tolist(), counts.tolist()):
        p = math.exp(v)
        within(c / n, p, math.sqrt(p * (1 - p) / n))


# ---------------------------------------------------------------------------------------------------------
# knobs


def test_every_scenario_declares_its_knobs():
    base = {f.name for f in knobs(ScenarioConfig)}
    assert {"n_rollouts", "group_size", "lengths", "max_len", "min_len", "branch_frac", "branch_logp_low",
            "branch_logp_high", "reward_length_corr", "norm_std"} <= base
    for name, cls in SCENARIOS.items():
        assert issubclass(cls, ScenarioConfig) and cls.name == name
        assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen
        fields = knobs(cls)
        assert base <= {f.name for f in fields}
        assert len(fields) == len(dataclasses.fields(cls))  # every field is a knob
        for f in fields:
            assert f.metadata["help"]
            m = f.metadata
            if m["choices"] is None:
                assert m["ui"] is not None, f"{name}.{f.name} needs a slider range"
            else:
                assert f.default in m["choices"]
        line = describe(name)
        assert line and "\n" not in line
    assert config("precision").preset == "bf16"
    assert knobs(SCENARIOS["precision"])[-2].metadata["choices"] == ("fp16", "bf16", "fp8")
    assert [f.metadata["choices"] for f in knobs(ScenarioConfig) if f.name == "lengths"] == [
        ("fixed", "uniform", "long_tail")]


@pytest.mark.parametrize("overrides, message", [
    (dict(max_len=40000), "max_len must be at most 32768, got 40000"),
    (dict(min_len=600, max_len=500), "min_len must be at most max_len, got 600 > 500"),
    (dict(branch_logp_low=-0.5, branch_logp_high=-1.0), "branch_logp_low must be below branch_logp_high"),
    (dict(branch_logp_high=0.0, branch_logp_low=-8.0), "branch_logp_high must be below 0"),
    (dict(n_rollouts=0), "n_rollouts must be >= 1, got 0"),
    (dict(n_rollouts=10.5), "n_rollouts must be a whole number, got 10.5"),
    (dict(lengths="zipf"), "lengths must be one of"),
    (dict(reward_length_corr=1.5), "reward_length_corr must be in"),
    (dict(success_rate=1.0), "success_rate must be below 1"),
    (dict(s=-0.1), "s must be >= 0.0, got -0.1"),
    (dict(t=1), "gaussian has no knob t"),
])
def test_invalid_knobs_are_refused(overrides, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        make_batch("gaussian", **overrides)


def test_other_refusals():
    with pytest.raises(ValueError, match="preset must be one of"):
        config("precision", preset="fp4")
    with pytest.raises(ValueError, match="cat_frac must be in"):
        config("catastrophic", cat_frac=2.0)
    with pytest.raises(ValueError, match="unknown scenario 'nope'; known: gaussian, drift"):
        make_batch("nope")
    assert config("gaussian", n_rollouts=16.0).n_rollouts == 16  # a slider's 16.0 is the int 16
    assert isinstance(config("gaussian", n_rollouts=16.0).n_rollouts, int)


# ---------------------------------------------------------------------------------------------------------
# the tiny transformer (a few seconds at a toy size; the asset script trains the real one)


def test_tiny_lm_rollouts_have_genuine_precision_mismatch():
    from seqis.samplers.tiny_lm import TinyLMConfig, rollouts, train

    cfg = TinyLMConfig(d_model=32, n_layer=1, n_head=2, max_len=48, steps=8, batch_size=4)
    lm, lang = train(cfg, seed=0)
    bf16 = rollouts(lm, lang, n_prompts=4, group_size=4, seed=0)
    again = rollouts(lm, lang, n_prompts=4, group_size=4, seed=0)
    assert torch.equal(bf16.trainer_logprobs, again.trainer_logprobs)
    assert torch.equal(bf16.inference_logprobs, again.inference_logprobs)
    B, T = bf16.shape
    assert B == 16 and T <= 48
    assert not bf16.loss_mask[:, :2].any()  # BOS and the prompt token carry no loss
    for x in (bf16.trainer_logprobs, bf16.inference_logprobs):
        assert torch.isfinite(x).all() and (x[bf16.loss_mask] <= 0).all()
    fp32 = rollouts(lm, lang, n_prompts=4, group_size=4, seed=0, sampler_dtype=torch.float32)
    l16, l32 = log_ratio(bf16).abs(), log_ratio(fp32).abs()
    assert l32.max() < 1e-4  # same precision: only the KV cache's summation order differs
    assert l16.mean() > 10 * l32.mean() and l16.max() > 1e-3  # bf16 rounding: genuine mismatch
    adv = bf16.advantages.view(4, 4)
    assert torch.allclose(adv.sum(-1), torch.zeros(4), atol=1e-6)


def test_tiny_lm_scenario_is_the_tiny_transformer_with_its_sampler_faults():
    clean = make_batch("tiny_lm", seed=3, n_prompts=2)
    again = make_batch("tiny_lm", seed=3, n_prompts=2)
    assert torch.equal(clean.inference_logprobs, again.inference_logprobs) and clean.metadata == again.metadata
    assert set(clean.extras) == {"entropy", "token_ids"} and clean.extras["entropy"].shape == clean.shape
    assert sum(clean.metadata["kept_log_mass"]) == 0 and sum(clean.metadata["bug_tokens"]) == 0
    cut = make_batch("tiny_lm", seed=3, n_prompts=2, top_k=3, sampler_dtype="fp32")
    l = (cut.trainer_logprobs.double() - cut.inference_logprobs.double()).where(cut.loss_mask, 0.0)
    assert (l <= 1e-4).all()  # one-sided: each token's l is the log of the mass the sampler kept
    assert l.sum(-1).tolist() == pytest.approx(cut.metadata["kept_log_mass"], abs=1e-3)
    assert sum(cut.metadata["kept_log_mass"]) < -1
    late = make_batch("tiny_lm", seed=3, n_prompts=2, shift=1)  # same tokens, log-probs one position late
    assert torch.equal(late.inference_logprobs[:, 3:], clean.inference_logprobs[:, 2:-1])
    with pytest.raises(ValueError, match="top_p must be in"):
        make_batch("tiny_lm", top_p=1.5)
