"""The lab: exact gradients of the toys against independent references, the Monte Carlo against the
exact truth and exact expectations, limits, determinism, sweeps. Statistical checks use fixed seeds and
4 standard errors."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from seqis import ESTIMATORS, Batch, run
from seqis.lab import (
    AGG,
    BitChain,
    MCResult,
    TabularAR,
    expected_gradient,
    monte_carlo,
    monte_carlo_many,
    sweep_batch_size,
    sweep_horizon,
    sweep_knob,
    sweep_lag,
)
from seqis.theory import formulas as theory

INF = math.inf
cfg = lambda name, **kw: ESTIMATORS[name].config(**kw)
TOKEN_IS = ("token_tis", cfg("token_tis", token_clip=INF))


def huang() -> BitChain:
    return BitChain(64, 40, 0.6, 0.55)


def enumerated_gradient(chain: BitChain) -> torch.Tensor:
    """dJ/dtheta by autograd over all 2^H sequences: an independent reference for the DP."""
    rollouts, _ = chain.enumerate()
    theta = chain.theta.clone().requires_grad_()
    J = (chain.logprobs(rollouts.tokens, theta).sum(-1).exp() * rollouts.reward).sum()
    (g,) = torch.autograd.grad(J, theta)
    return g


def max_z(r: MCResult, target: torch.Tensor) -> float:
    """max over parameters of |mean - target| / stderr; parameters with stderr 0 must match exactly."""
    err = (r.mean - target).abs()
    zero = r.stderr == 0
    assert torch.allclose(r.mean[zero], target[zero], atol=1e-12)
    return float((err[~zero] / r.stderr[~zero]).max()) if bool((~zero).any()) else 0.0


# ---------------------------------------------------------------------------------------------------------
# exact gradients


def test_bitchain_true_gradient_is_the_closed_form():
    g = huang().true_gradient()  # (64,) p (1 - p) P(Bin(63, 0.6) = 39)
    assert g.dtype == torch.float64 and g.shape == (64,)
    assert torch.allclose(g, torch.full((64,), theory.bitchain_true_gradient(64, 40, 0.6), dtype=torch.float64),
                          rtol=1e-12)


@pytest.mark.parametrize("reward", ["threshold", "additive", "custom"])
def test_bitchain_dp_matches_enumeration(reward):
    H = 10
    p = torch.linspace(0.2, 0.8, H, dtype=torch.float64)  # per position: the Poisson-binomial DP path
    q = torch.linspace(0.7, 0.3, H, dtype=torch.float64)
    r = torch.linspace(0, 1, H + 1, dtype=torch.float64) ** 3 if reward == "custom" else reward
    chain = BitChain(H, 6, p, q, reward=r)
    assert torch.allclose(chain.true_gradient(), enumerated_gradient(chain), rtol=1e-10, atol=1e-14)
    uniform = BitChain(H, 6, 0.3, 0.4, reward=r)  # binomial path
    assert torch.allclose(uniform.true_gradient(), enumerated_gradient(uniform), rtol=1e-10, atol=1e-14)
    rollouts, prob_mu = chain.enumerate()
    assert float(prob_mu.sum()) == pytest.approx(1.0, abs=1e-12)
    assert chain.value() == pytest.approx(float((rollouts.trainer_logprobs.sum(-1).exp() * rollouts.reward).sum()))


def test_tabular_with_two_tokens_and_no_state_is_a_bit_chain():
    # logits [0, theta_t] in every previous-token row: the AR policy is the bit chain, and the chain's
    # gradient in theta_t is the sum over rows of the AR gradient in logit (t, prev, 1)
    H, k = 5, 3
    theta = torch.tensor([0.3, -0.2, 0.8, 0.1, -0.5], dtype=torch.float64)
    logits = torch.zeros(H, 2, 2, dtype=torch.float64)
    logits[:, :, 1] = theta[:, None]
    ar = TabularAR(2, H, pi_logits=logits, mu_logits=logits * 0.5, reward=lambda s: (s.sum(-1) >= k).double())
    chain = BitChain(H, k, torch.sigmoid(theta), torch.sigmoid(theta * 0.5))
    g_ar = ar.true_gradient().view(H, 2, 2)[:, :, 1].sum(-1)
    assert torch.allclose(g_ar, chain.true_gradient(), rtol=1e-10)
    assert ar.value() == pytest.approx(chain.value(), rel=1e-12)


def test_tabular_true_gradient_matches_finite_differences():
    ar = TabularAR(3, 3, seed=4)
    g = ar.true_gradient()
    eps = 1e-6
    for i in (0, 7, 13, 26):
        d = torch.zeros(ar.dim, dtype=torch.float64)
        d[i] = eps
        plus = TabularAR(3, 3, pi_logits=(ar.theta + d).view(3, 3, 3), mu_logits=ar.mu_logits, reward=ar.seq_reward)
        minus = TabularAR(3, 3, pi_logits=(ar.theta - d).view(3, 3, 3), mu_logits=ar.mu_logits, reward=ar.seq_reward)
        assert float(g[i]) == pytest.approx((plus.value() - minus.value()) / (2 * eps), abs=1e-8)


def test_lag_constructors():
    chain = BitChain.lagged(64, 40, 0.6, lag=8, lr=1.0)
    assert torch.equal(chain.p, torch.full((64,), 0.6, dtype=torch.float64))
    assert bool((chain.q < 0.6).all()) and bool((chain.q > 0.5).all())  # walked back along a positive gradient
    assert torch.equal(BitChain.lagged(64, 40, 0.6, lag=0).q, chain.p)
    shifted = BitChain.lagged(64, 40, 0.6, lag=4, shift=0.05)
    assert torch.allclose(torch.logit(shifted.q), torch.logit(shifted.p) - 0.2)
    ar = TabularAR(3, 4, seed=2).with_lag(3, lr=2.0)
    assert torch.equal(ar.pi_logits, TabularAR(3, 4, seed=2).pi_logits)
    assert not torch.equal(ar.mu_logits, ar.pi_logits)
    assert torch.equal(TabularAR(3, 4, seed=2).with_lag(0).mu_logits, ar.pi_logits)


# ---------------------------------------------------------------------------------------------------------
# the Monte Carlo is minus the gradient of the estimator's loss


@pytest.mark.parametrize("toy", ["bit", "ar"])
@pytest.mark.parametrize("name,baseline", [("seq_tis", False), ("mis_po", False), ("token_tis", True)])
def test_batch_gradient_is_backprop_of_the_loss(toy, name, baseline):
    chain = BitChain(12, 7, 0.6, torch.linspace(0.4, 0.7, 12)) if toy == "bit" else TabularAR(3, 4, seed=1)
    c = cfg("mis_po", geo_mask_low=0.9, geo_mask_high=1.05) if name == "mis_po" else None
    B = 32
    res = monte_carlo(chain, name, c, batch_size=B, n_batches=3, seed=5, baseline=baseline,
                      memory_budget=1)  # one batch per chunk
    gen = torch.Generator().manual_seed(5)
    for b in range(3):
        rollouts = chain.sample(B, gen)
        theta = chain.theta.clone().requires_grad_()
        adv = rollouts.reward - rollouts.reward.mean() if baseline else rollouts.reward
        batch = Batch(chain.logprobs(rollouts.tokens, theta), rollouts.inference_logprobs, adv)
        run(name, batch, c, agg=AGG).loss.backward()
        assert torch.allclose(res.grads[b], -theta.grad, rtol=1e-10, atol=1e-14)


@pytest.mark.reproducibility
def test_same_seed_same_result_whatever_the_chunking():
    chain = huang()
    a = monte_carlo(chain, "seq_tis", batch_size=32, n_batches=20, seed=3)
    b = monte_carlo(chain, "seq_tis", batch_size=32, n_batches=20, seed=3, memory_budget=1)
    c = monte_carlo(chain, "seq_tis", batch_size=32, n_batches=20, seed=4)
    again = monte_carlo(chain, "seq_tis", batch_size=32, n_batches=20, seed=3)
    assert torch.equal(a.mean, again.mean) and a.mse == again.mse and torch.equal(a.grads, again.grads)
    # the CPU generator's stream does not depend on how it is chunked: the same rollouts, up to rounding
    assert torch.allclose(a.grads, b.grads, rtol=1e-12, atol=1e-15) and a.mse == pytest.approx(b.mse, rel=1e-12)
    assert not torch.allclose(a.mean, c.mean)


def test_result_fields_are_consistent():
    r = monte_carlo(huang(), "seq_tis", batch_size=16, n_batches=50, seed=0)
    assert r.mean.shape == r.true.shape == r.stderr.shape == (64,)
    assert r.batch_errors.shape == r.batch_norms.shape == (50,) and r.grads.shape == (50, 64)
    assert r.mse == pytest.approx(float(r.batch_errors.mean()), rel=1e-9)  # mse = bias2 + variance
    assert r.variance == pytest.approx(float(((r.grads - r.mean) ** 2).sum(-1).mean()), rel=1e-9)
    assert r.bias2 == pytest.approx(float(((r.mean - r.true) ** 2).sum()), rel=1e-12)
    assert torch.allclose(r.stderr, r.grads.std(0) / math.sqrt(50))
    assert {"is_clipped", "seq_weight", "mismatch_kl"} <= set(r.metrics)
    assert set(r.record()) >= {"estimator", "bias2", "variance", "mse", "stderr_mse", "noise_floor", "is_clipped"}


def test_batches_for_explore_and_float32():
    chain = huang()
    batch = chain.batch(8, seed=1)
    assert batch.shape == (8, 64) and batch.trainer_logprobs.dtype == torch.float64
    assert torch.equal(batch.advantages, chain.batch(8, seed=1).advantages)
    grouped = TabularAR(3, 4, seed=0).batch(8, seed=1, baseline_group=4).advantages.view(2, 4)
    assert torch.allclose(grouped.sum(-1), torch.zeros(2, dtype=torch.float64), atol=1e-12)
    # float32 draws other uniforms (a different stream) but estimates the same thing
    r64 = monte_carlo(chain, "seq_tis", batch_size=64, n_batches=100, seed=0)
    r32 = monte_carlo(chain, "seq_tis", batch_size=64, n_batches=100, seed=0, dtype=torch.float32)
    assert r32.mean.dtype == torch.float64
    se = (r64.stderr**2 + r32.stderr**2).sqrt()
    assert float(((r64.mean - r32.mean).abs() / se).max()) < 4.5


# ---------------------------------------------------------------------------------------------------------
# bias against the truth


def test_bitchain_seq_is_unbiased_token_is_and_pg_match_closed_forms():
    chain = huang()
    seq, tok, pg = monte_carlo_many(chain, ["seq_is", TOKEN_IS, "pg"], batch_size=64, n_batches=200, seed=0)
    true = chain.true_gradient()
    assert max_z(seq, true) < 4
    tok_mean = torch.full((64,), theory.bitchain_token_is_mean(64, 40, 0.6, 0.55), dtype=torch.float64)
    pg_mean = torch.full((64,), theory.bitchain_naive_pg_mean(64, 40, 0.6, 0.55), dtype=torch.float64)
    assert max_z(tok, tok_mean) < 4 and max_z(pg, pg_mean) < 4
    for r, published in ((tok, 0.567), (pg, 0.289)):  # the average over tokens, within 4 standard errors
        ratio, se = r.grads.mean(1) / true[0], r.grads.mean(1).std() / true[0] / math.sqrt(r.n_batches)
        assert abs(float(ratio.mean()) - published) < 4 * float(se) + 0.0005
    assert tok.bias2 > 20 * tok.noise_floor and seq.bias2 < 2 * seq.noise_floor


def test_additive_reward_makes_token_is_unbiased_on_the_chain_but_not_on_the_ar_policy():
    chain = BitChain(64, 40, 0.6, 0.55, reward="additive")
    tok = monte_carlo(chain, *TOKEN_IS, batch_size=64, n_batches=100, seed=1)
    assert max_z(tok, chain.true_gradient()) < 4
    small = BitChain(10, 6, 0.6, 0.45, reward="additive")  # exact: enumerate 2^10 sequences
    assert torch.allclose(expected_gradient(small, *TOKEN_IS), small.true_gradient(), rtol=1e-10)
    threshold = BitChain(10, 6, 0.6, 0.45)
    assert torch.allclose(expected_gradient(threshold, *TOKEN_IS),
                          torch.full((10,), theory.bitchain_token_is_mean(10, 6, 0.6, 0.45), dtype=torch.float64))
    assert torch.allclose(expected_gradient(threshold, "pg"),
                          torch.full((10,), theory.bitchain_naive_pg_mean(10, 6, 0.6, 0.45), dtype=torch.float64))
    # with state dependence the sampler also changes which states are visited: token IS stays biased
    ar = TabularAR(3, 5, seed=0, mismatch=1.0, reward="additive")
    exact = expected_gradient(ar, *TOKEN_IS)
    assert float((exact - ar.true_gradient()).norm()) > 0.05 * float(ar.true_gradient().norm())


def test_exact_expectations_on_the_ar_policy():
    ar = TabularAR(3, 4, seed=1)
    true = ar.true_gradient()
    assert torch.allclose(expected_gradient(ar, "seq_is"), true, atol=1e-12)
    for name in ("pg", "seq_tis", "token_tis", "mis_po"):
        assert float((expected_gradient(ar, name) - true).norm()) > 1e-3, name


def test_monte_carlo_matches_exact_expectation_for_every_estimator():
    # TabularAR: the exact expectation of every registered estimator, by enumeration, against its Monte Carlo
    # (mis_po gets a trajectory band this mismatch passes, else it drops every rollout and shows nothing)
    ar = TabularAR(3, 4, seed=1, mismatch=0.4, reward="threshold")
    pairs = [(n, cfg(n, geo_mask_low=0.8, geo_mask_high=1.25) if n == "mis_po" else None) for n in ESTIMATORS]
    results = monte_carlo_many(ar, pairs, batch_size=64, n_batches=100, seed=2)
    for (name, c), r in zip(pairs, results, strict=True):
        assert r.metrics["is_masked"] < 0.5 and max_z(r, expected_gradient(ar, name, c)) < 4.5, name
    seq_is = results[list(ESTIMATORS).index("seq_is")]
    assert max_z(seq_is, ar.true_gradient()) < 4.5 and seq_is.relative_bias < 0.1


def test_grpo_baseline_shrinks_the_gradient_by_one_minus_one_over_b():
    # on-policy, A = R - batch mean: E = (1 - 1/B) * true, since each rollout's own reward sits in the mean
    chain = BitChain(16, 10, 0.6, 0.6)
    B = 4
    r = monte_carlo(chain, "seq_is", batch_size=B, n_batches=2000, seed=0, baseline=True)
    assert max_z(r, (1 - 1 / B) * chain.true_gradient()) < 4
    plain = monte_carlo(chain, "seq_is", batch_size=B, n_batches=2000, seed=0)
    assert r.variance < plain.variance


# ---------------------------------------------------------------------------------------------------------
# limits: open clips and bands are the references, exactly, on the same rollouts

LIMITS = [
    (("seq_tis", cfg("seq_tis", seq_clip=INF)), ("seq_is", None)),
    (("seq_mis", cfg("seq_mis", geo_mask_low=0.0, geo_mask_high=INF)), ("seq_is", None)),
    (("seq_mis_product", cfg("seq_mis_product", seq_clip=INF)), ("seq_is", None)),
    (("geo_mask", cfg("geo_mask", geo_mask_low=0.0, geo_mask_high=INF)), ("pg", None)),
    (("mis_po", cfg("mis_po", token_mask_low=0.0, token_mask_high=INF, geo_mask_low=0.0, geo_mask_high=INF)),
     ("pg", None)),
    (("max_mask", cfg("max_mask", token_mask_low=0.0, token_mask_high=INF)), ("pg", None)),
    (("icepop", cfg("icepop", token_mask_low=0.0, token_mask_high=INF)), TOKEN_IS),
    (("geo_mask", cfg("geo_mask", geo_mask_low=0.0, geo_mask_high=INF, token_clip=INF)), TOKEN_IS),
]


@pytest.mark.parametrize("toy", ["bit", "ar"])
def test_open_clips_and_bands_reduce_to_the_references(toy):
    chain = BitChain(32, 20, 0.6, 0.5) if toy == "bit" else TabularAR(3, 4, seed=3, mismatch=1.0)
    for limit, reference in LIMITS:
        a, b = monte_carlo_many(chain, [limit, reference], batch_size=16, n_batches=20, seed=0)
        assert torch.allclose(a.mean, b.mean, rtol=1e-12, atol=0), limit[0]
        assert a.variance == pytest.approx(b.variance, rel=1e-10)


# ---------------------------------------------------------------------------------------------------------
# sweeps


def test_sweep_knob_and_progress():
    seen = []
    df = sweep_knob(huang(), "seq_tis", "seq_clip", [1.0, 2.0, 8.0, INF], batch_size=32, n_batches=50, seed=0,
                    progress=lambda f, msg: seen.append((f, msg)))
    assert isinstance(df, pd.DataFrame) and len(df) == 4
    assert list(df.columns[:6]) == ["estimator", "sweep", "x", "bias2", "variance", "mse"]
    assert list(df["x"]) == [1.0, 2.0, 8.0, INF] and set(df["estimator"]) == {"seq_tis"}
    assert df["bias2"].iloc[0] > df["bias2"].iloc[-1]  # clipping at 1 is biased; C = inf is seq IS
    assert seen and seen[-1][0] == pytest.approx(1.0) and all(0 <= f <= 1 for f, _ in seen)
    with pytest.raises(ValueError, match="no knob 'token_clip'"):
        sweep_knob(huang(), "seq_tis", "token_clip", [1.0], batch_size=4, n_batches=2)


def test_batch_size_frontier_biased_plateau_seq_is_keeps_falling():
    sizes = [4, 16, 64, 256, 1024]
    df = sweep_batch_size(huang(), ["seq_is", "pg"], sizes, n_batches=40, seed=0)
    assert len(df) == 10 and list(df.loc[df.estimator == "pg", "x"]) == sizes
    seq, pg = (df[df.estimator == n].set_index("x") for n in ("seq_is", "pg"))
    assert seq.loc[4, "mse"] / seq.loc[1024, "mse"] > 50  # ~ Var / B: falls by ~256
    assert seq.loc[256, "mse"] / seq.loc[1024, "mse"] > 2.5  # still falling
    assert pg.loc[256, "mse"] / pg.loc[1024, "mse"] < 1.5 and pg.loc[1024, "mse"] < 1.2 * pg.loc[1024, "bias2"]
    for frame in (seq, pg):  # Var(B) * B is one number; bias2 is the same at every size
        vb = frame["variance"] * frame.index
        assert vb.max() / vb.min() < 2
        assert frame["bias2"].max() == pytest.approx(frame["bias2"].min(), rel=1e-9)
        assert (frame["frontier"] / frame["mse"]).between(0.6, 1.6).all()


def test_batch_size_sweep_with_baseline_and_bad_sizes():
    df = sweep_batch_size(BitChain(16, 10, 0.6, 0.55), ["seq_tis"], [2, 8], n_batches=20, seed=0, baseline=True)
    assert list(df["x"]) == [2, 8] and df["baseline"].all()
    with pytest.raises(ValueError, match="least common multiple"):
        sweep_batch_size(huang(), ["pg"], [997, 991], n_batches=2)


def test_horizon_and_lag_sweeps():
    seen = []
    df = sweep_horizon(BitChain(16, 10, 0.6, 0.55), ["seq_is", "seq_tis"], [8, 32], batch_size=32,
                       n_batches=20, seed=0, progress=lambda f, m: seen.append(f))
    assert len(df) == 4 and list(df["x"]) == [8, 8, 32, 32] and df["chain"].str.contains("k=20").any()
    assert seen == sorted(seen) and seen[-1] == pytest.approx(1.0)
    lag = sweep_lag(huang(), ["pg", "seq_is"], [0, 6], batch_size=32, n_batches=20, seed=0)
    on = lag[lag.x == 0].set_index("estimator")
    assert on.loc["pg", "mse"] == on.loc["seq_is", "mse"]  # on-policy every weight is 1
    off = lag[lag.x == 6].set_index("estimator")
    assert off.loc["pg", "bias2"] > on.loc["pg", "bias2"]


# ---------------------------------------------------------------------------------------------------------
# validation


def test_invalid_toys_and_arguments():
    with pytest.raises(ValueError, match="strictly between 0 and 1"):
        BitChain(8, 4, 1.0, 0.5)
    with pytest.raises(ValueError, match=r"\(8,\) tensor"):
        BitChain(8, 4, torch.full((7,), 0.5), 0.5)
    with pytest.raises(ValueError, match="threshold"):
        BitChain(8, 9, 0.5, 0.5)
    with pytest.raises(ValueError, match="reward"):
        BitChain(8, 4, 0.5, 0.5, reward="sum")
    with pytest.raises(ValueError, match="one p and one q"):
        BitChain(8, 4, torch.linspace(0.2, 0.8, 8), 0.5).with_horizon(16)
    with pytest.raises(ValueError, match="horizon <= 20"):
        BitChain(21, 4, 0.5, 0.5).enumerate()
    with pytest.raises(ValueError, match="vocab"):
        TabularAR(5, 3)
    with pytest.raises(ValueError, match="horizon"):
        TabularAR(2, 7)
    with pytest.raises(ValueError, match="pi_logits must have shape"):
        TabularAR(2, 3, pi_logits=torch.zeros(3, 2))
    with pytest.raises(ValueError, match="batch_size and n_batches"):
        monte_carlo(huang(), "pg", batch_size=0, n_batches=3)
    with pytest.raises(ValueError, match="unknown estimator"):
        monte_carlo(huang(), "nope", batch_size=2, n_batches=3)
    with pytest.raises(ValueError, match="takes a SeqTISConfig"):
        monte_carlo(huang(), "seq_tis", cfg("pg"), batch_size=2, n_batches=3)


# ---------------------------------------------------------------------------------------------------------
# CUDA


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("toy", ["bit", "ar"])
def test_cuda_agrees_with_cpu_within_sampling_error(toy):
    chain = huang() if toy == "bit" else TabularAR(3, 4, seed=1)
    mis_po = cfg("mis_po", geo_mask_low=0.8, geo_mask_high=1.25)  # a band that keeps rollouts with reward
    for name, c in (("seq_is", None), ("seq_tis", None), ("mis_po", mis_po)):
        cpu = monte_carlo(chain, name, c, batch_size=256, n_batches=100, seed=0)
        gpu = monte_carlo(chain, name, c, batch_size=256, n_batches=100, seed=0, device="cuda")
        assert gpu.mean.device.type == "cpu" and torch.equal(gpu.true, cpu.true)
        se = (cpu.stderr**2 + gpu.stderr**2).sqrt()
        ok = se > 0
        assert bool(ok.any()) and float(((gpu.mean - cpu.mean).abs()[ok] / se[ok]).max()) < 4.5, name
        again = monte_carlo(chain, name, c, batch_size=256, n_batches=100, seed=0, device="cuda")
        assert torch.equal(gpu.mean, again.mean)
