"""The trainer: exact J and gradient against plain references, the vectorised estimate against the
formula on one run alone, exact expectations, lag semantics, seeds, chunking, faults, stop, errors.
(The published orderings are in test_train_orderings.py.)"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from seqis import ESTIMATORS, PRESETS, Batch, Composition, Weight, run
from seqis.lab import BitChain, TabularAR
from seqis.lab.poisson_binomial import count_distribution, value_and_gradient
from seqis.lab.policies import ChainPolicy, SamplerFault, TabularPolicy
from seqis.lab.streams import Streams
from seqis.lab.train import AGG, _estimate, _pairs, label_of, train, train_lags

INF = math.inf
TOKEN_IS = ("token_tis", ESTIMATORS["token_tis"].config(token_clip=INF))


def dp_counts(p: torch.Tensor) -> torch.Tensor:
    """P(count = c) by the textbook recursion over positions, one policy (H,) -> (H + 1,)."""
    dist = torch.zeros(len(p) + 1, dtype=torch.float64)
    dist[0] = 1.0
    for t, pt in enumerate(p.tolist()):
        dist[1 : t + 2] = dist[1 : t + 2] * (1 - pt) + dist[: t + 1] * pt
        dist[0] *= 1 - pt
    return dist


def others(p: torch.Tensor, t: int) -> torch.Tensor:
    """P(count of the bits other than t = c), (H,)."""
    return dp_counts(torch.cat([p[:t], p[t + 1 :]]))


# ---------------------------------------------------------------------------------------------------------
# exact J and gradient


@pytest.mark.parametrize("H", [1, 2, 3, 7, 33])
def test_count_distribution_and_gradient_match_the_dp(H):
    g = torch.Generator().manual_seed(H)
    p = torch.rand(3, H, generator=g, dtype=torch.float64) * 0.98 + 0.01  # (R, H)
    f = torch.rand(H + 1, generator=g, dtype=torch.float64)
    J, dJdp = value_and_gradient(p, f)
    for r in range(3):
        dist = dp_counts(p[r])
        assert torch.allclose(count_distribution(p)[r], dist, atol=1e-14)
        assert J[r].item() == pytest.approx(float(dist @ f), abs=1e-14)
        for t in range(H):  # dJ/dp_t = E f(O + 1) - E f(O), O the other bits' count
            o = others(p[r], t)
            assert dJdp[r, t].item() == pytest.approx(float(o @ (f[1:] - f[:-1])), abs=1e-13)


def test_gradient_is_the_finite_difference_at_a_long_horizon():
    p = torch.sigmoid(torch.linspace(-2, 2, 300, dtype=torch.float64))[None]  # (1, 300)
    f = (torch.arange(301) >= 170).double()
    _, dJdp = value_and_gradient(p, f)
    for t in (0, 150, 299):
        e = torch.zeros_like(p)
        e[0, t] = 1e-6
        fd = (value_and_gradient(p + e, f, gradient=False)[0] - value_and_gradient(p - e, f, gradient=False)[0]) / 2e-6
        assert dJdp[0, t].item() == pytest.approx(fd.item(), rel=1e-6, abs=1e-12)


def test_policies_give_the_toys_exact_values_and_gradients():
    chain = BitChain(20, 12, torch.linspace(0.3, 0.7, 20), 0.5)
    J, g = ChainPolicy(chain).value_and_gradient(chain.theta[None])
    assert J.item() == pytest.approx(chain.value(), abs=1e-13)
    assert torch.allclose(g[0], chain.true_gradient(), atol=1e-13)
    toy = TabularAR(3, 4, seed=2)
    J, g = TabularPolicy(toy).value_and_gradient(toy.theta[None])
    assert J.item() == pytest.approx(toy.value(), abs=1e-13)
    assert torch.allclose(g[0], toy.true_gradient(), atol=1e-13)


# ---------------------------------------------------------------------------------------------------------
# the vectorised estimate against the formula on one run alone


def one_run_gradient(name, cfg, a, logp, logq, reward, p):
    """g = minus the gradient in theta of the estimator's loss on this run's own batch, by autograd:
    d log pi(a_t) / d theta_t = a_t - p_t, so g_t = -sum_b (d loss / d log pi_bt) (a_bt - p_t)."""
    leaf = logp.clone().requires_grad_()
    (dlogp,) = torch.autograd.grad(run(name, Batch(leaf, logq, reward), cfg, agg=AGG).loss, leaf)
    return -(dlogp * (a - p)).sum(0)


SELF_NORMALISED = Composition(Weight("sequence", self_normalize=True))  # weights / the batch's mean weight


@pytest.mark.parametrize("estimator", ["seq_is", TOKEN_IS, "geo_is", "seq_tis", "mis_po", "icepop", SELF_NORMALISED,
                                       "prime-rl/default", "slime/mis", "verl/bypass_pg_geo_rs"])
def test_each_run_gets_the_gradient_it_would_get_alone(estimator):
    chain = BitChain(24, 14, 0.5, 0.5)
    policy = ChainPolicy(chain)
    g = torch.Generator().manual_seed(0)
    theta = torch.randn(6, 24, generator=g, dtype=torch.float64) * 0.3  # (R, H): 3 lags x 2 seeds
    theta_mu = theta - 0.2 * torch.rand(6, 24, generator=g, dtype=torch.float64)
    streams = Streams([0, 1], "cpu")
    draw = lambda stream, tail: streams.uniform(0, stream, tail, torch.float64).repeat(3, *([1] * len(tail)))
    pair = estimator if isinstance(estimator, tuple) else (estimator, None)
    est, _ = _estimate(policy, _pairs([pair]), theta, theta_mu, draw, 32, torch.float64, 6)
    a, logp, logq, reward = policy.rollouts(theta, theta_mu, draw, 32, torch.float64)
    for r in range(6):
        want = one_run_gradient(*pair, a[r], logp[r], logq[r], reward[r], torch.sigmoid(theta[r]))
        assert torch.allclose(est[r], want, atol=1e-12), r


def test_tabular_score_is_the_autograd_gradient_of_the_log_probs():
    toy = TabularAR(3, 4, seed=1)
    policy = TabularPolicy(toy)
    g = torch.Generator().manual_seed(1)
    theta = toy.theta.expand(2, -1) + 0.3 * torch.randn(2, toy.dim, generator=g, dtype=torch.float64)
    streams = Streams([5], "cpu")
    draw = lambda stream, tail: streams.uniform(0, stream, tail, torch.float64).repeat(2, *([1] * len(tail)))
    tokens, _, _, _ = policy.rollouts(theta, theta, draw, 16, torch.float64)
    coef = torch.randn(2, 16, 4, generator=g, dtype=torch.float64)
    got = policy.score(tokens, coef, theta)
    for r in range(2):
        th = theta[r].clone().requires_grad_()
        (want,) = torch.autograd.grad((coef[r] * toy.logprobs(tokens[r], th)).sum(), th)
        assert torch.allclose(got[r], want, atol=1e-12)


# ---------------------------------------------------------------------------------------------------------
# exact expectations (batch_size=None)


def test_exact_expected_gradients_are_the_closed_forms():
    """Bit chain, pi ahead of mu: sequence IS is unbiased; token IS uses P_mu for the other bits; naive PG
    gives q (1 - p) P_mu(O >= k - 1) - (1 - q) p P_mu(O >= k) (docs/literature.md, Huang's bit chain)."""
    H, k = 10, 6
    chain = BitChain(H, k, 0.5, 0.5)
    p = torch.linspace(0.35, 0.75, H, dtype=torch.float64)
    q = p - 0.08
    theta, theta_mu = torch.logit(p)[None], torch.logit(q)[None]
    pairs = [("seq_is", None), TOKEN_IS, ("pg", None)]
    policy = ChainPolicy(chain)
    ests = [_estimate(policy, _pairs([pr]), theta, theta_mu, None, None, torch.float64, 1)[0][0] for pr in pairs]
    true = ChainPolicy(chain).value_and_gradient(theta)[1][0]
    assert torch.allclose(ests[0], true, atol=1e-12)
    for t in range(H):
        o_mu = others(q, t)  # (H,) P_mu(O = c)
        assert ests[1][t].item() == pytest.approx(float(p[t] * (1 - p[t]) * o_mu[k - 1]), abs=1e-12)
        naive = q[t] * (1 - p[t]) * o_mu[k - 1 :].sum() - (1 - q[t]) * p[t] * o_mu[k:].sum()
        assert ests[2][t].item() == pytest.approx(float(naive), abs=1e-12)


def gradient_ascent(chain: BitChain, steps: int, lr: float) -> list[float]:
    """J along theta <- theta + lr dJ/dtheta, by the chain's own DP."""
    theta, values = chain.theta.clone(), []
    for _ in range(steps + 1):
        c = BitChain(chain.horizon, chain.threshold, torch.sigmoid(theta), 0.5)
        values.append(c.value())
        theta = theta + lr * c.true_gradient()
    return values


def test_exact_sequence_is_follows_gradient_ascent_at_any_lag():
    chain = BitChain(8, 5, torch.linspace(0.3, 0.6, 8), 0.5)
    want = gradient_ascent(chain, 12, 2.0)
    res = train_lags(chain, ["seq_is", TOKEN_IS], [0, 4], steps=12, lr=2.0, batch_size=None, seeds=1)
    for r in res:
        assert np.allclose(r.J[0, 0], want, rtol=0, atol=1e-12)  # unbiased whatever the lag
    assert np.allclose(res[0].J[1, 0], want, rtol=0, atol=1e-12)  # on-policy every weight is 1
    assert np.allclose(res[1].J[1, 0, :2], want[:2], rtol=0, atol=1e-12)  # update 0 is on-policy
    assert abs(res[1].J[1, 0, 2] - want[2]) > 1e-6  # update 1 samples theta0: token IS is biased


def test_tabular_exact_on_policy_training_is_gradient_ascent():
    toy = TabularAR(2, 3, seed=3)
    res = train(toy, ["seq_is", "pg"], steps=5, lr=1.0, lag=0, batch_size=None, seeds=1)
    theta, want = toy.theta.clone(), []
    for _ in range(6):
        J, g = TabularPolicy(toy).value_and_gradient(theta[None])
        want.append(J.item())
        theta = theta + g[0]
    assert np.allclose(res.J[:, 0], [want, want], rtol=0, atol=1e-12)
    assert np.allclose(res.cosine, 1.0) and np.allclose(res.kept, 1.0)


def test_sampled_updates_average_to_the_exact_one():
    """One update from theta0 (lag 0): the mean of J_1 - J_0 over 64 seeds matches the exact update's to
    first order, within 4 standard errors."""
    chain = BitChain(16, 10, 0.5, 0.5)
    lr = 0.5
    exact = train(chain, "seq_is", steps=1, lr=lr, lag=0, batch_size=None).J[0, 0]
    sampled = train(chain, "seq_is", steps=1, lr=lr, lag=0, batch_size=64, seeds=64).J[0]
    gain = sampled[:, 1] - sampled[:, 0]
    # J is smooth: the mean gain equals the exact step's gain up to the curvature times the estimate's spread
    assert abs(gain.mean() - (exact[1] - exact[0])) < 4 * gain.std(ddof=1) / 8 + 2e-4


# ---------------------------------------------------------------------------------------------------------
# contract, seeds, chunking, stop


def test_result_shapes_labels_and_first_value():
    chain = BitChain(32, 20, 0.5, 0.5)
    res = train(chain, ["seq_is", TOKEN_IS, "geo_is"], steps=5, lr=1.0, lag=2, batch_size=16, seeds=3)
    assert res.J.shape == (3, 3, 6) and res.J.dtype == np.float64
    assert res.estimators == ["seq_is", "token_tis(token_clip=inf)", "geo_is"]
    assert res.seeds == [0, 1, 2] and res.lag == 2 and not res.stopped
    assert np.allclose(res.J[:, :, 0], chain.value())
    for name in ("grad_norm", "true_norm", "cosine", "kept"):
        assert getattr(res, name).shape == (3, 3, 5) and np.isfinite(getattr(res, name)).all()
    assert len(res.frame()) == 9
    assert label_of(("seq_tis", ESTIMATORS["seq_tis"].config())) == "seq_tis"
    trl = PRESETS["trl/sequence_mask"]
    assert label_of(("trl/sequence_mask", trl.config)) == "trl/sequence_mask"
    moved = trl.config.replace(vllm_importance_sampling_clip_max=2.0)
    assert label_of(("trl/sequence_mask", moved)) == "trl/sequence_mask(vllm_importance_sampling_clip_max=2)"
    assert label_of(SELF_NORMALISED) == SELF_NORMALISED.describe()


@pytest.mark.reproducibility
def test_a_seed_reproduces_alone_in_a_sweep_and_in_any_chunking():
    chain = BitChain(24, 15, 0.5, 0.5)
    kw = dict(steps=6, lr=3.0, batch_size=32)
    many = train_lags(chain, ["seq_is", "geo_is"], [0, 3], seeds=[4, 7, 9], **kw)
    alone = train(chain, "geo_is", lag=3, seeds=[7], **kw)
    assert np.array_equal(many[1].J[1, 1], alone.J[0, 0])
    chunked = train_lags(chain, ["seq_is", "geo_is"], [0, 3], seeds=[4, 7, 9], memory_budget=1, **kw)
    assert all(np.array_equal(a.J, b.J) for a, b in zip(many, chunked, strict=True))
    assert not np.array_equal(many[1].J[0, 0], many[1].J[0, 1])  # seeds differ
    assert np.array_equal(many[0].J[0], many[0].J[1])  # lag 0: every weight is 1, common random numbers


# (toy, estimators, batch size, fault, optimizer): the batch sizes put a seed alone and the sweep in different
# regimes of seqis.lab.fixed.row_blocks (one thread, all threads); a penalised preset (prime-rl's
# KL) and a self-normalised one (slime/mis) go run by run; seq_is's weights amplify a last-bit difference
# into J within a few updates (up to 1e-7 here before the arithmetic was fixed)
REPRO_CASES = [
    (BitChain(27, 13, 0.5, 0.5), ["seq_is", "seq_tis"], 27, None, "sgd"),
    (BitChain(7, 3, 0.5, 0.5), ["seq_mis", "prime-rl/default"], 13, SamplerFault(precision="bf16"), "adam"),
    (BitChain(40, 20, 0.5, 0.5), ["token_tis", "slime/mis"], 150, SamplerFault(top_p=0.9), "sgd"),
    (BitChain(64, 32, 0.5, 0.5), ["seq_is", "mis_po"], 90, None, "sgd"),
    (TabularAR(3, 4, seed=1), ["geo_is", "seq_is"], 37, SamplerFault(top_p=0.9), "sgd"),
]


@pytest.mark.reproducibility
@pytest.mark.parametrize("case", range(len(REPRO_CASES)))
def test_a_seed_reproduces_bitwise_whatever_shares_its_tensors(case):
    chain, names, B, fault, optimizer = REPRO_CASES[case]
    kw = dict(steps=4, lr=3.0, batch_size=B, fault=fault, optimizer=optimizer)
    many = train_lags(chain, names, [0, 3], seeds=[5, 7, 9], **kw)
    alone = train(chain, names[1], lag=3, seeds=[7], **kw)
    assert np.array_equal(many[1].J[1, 1], alone.J[0, 0]), np.abs(many[1].J[1, 1] - alone.J[0, 0]).max()
    chunked = train_lags(chain, names, [0, 3], seeds=[5, 7, 9], memory_budget=1, **kw)
    assert all(np.array_equal(a.J, b.J) for a, b in zip(many, chunked, strict=True))


@pytest.mark.reproducibility
def test_streams_are_uniform_and_independent_across_seeds():
    u = Streams([0, 1, 2**40 + 1], "cpu").uniform(3, "tokens", (20000,), torch.float64)  # (3, 20000)
    assert float(u.min()) >= 0 and float(u.max()) < 1
    assert abs(float(u.mean()) - 0.5) < 4 * math.sqrt(1 / 12 / u.numel())
    z = (u - 0.5) * math.sqrt(12)
    for i, j in ((0, 1), (0, 2), (1, 2)):
        assert abs(float((z[i] * z[j]).mean())) < 4 / math.sqrt(20000)
    again = Streams([2**40 + 1], "cpu").uniform(3, "tokens", (20000,), torch.float64)
    assert torch.equal(again[0], u[2])
    streams = Streams([0], "cpu")
    assert not torch.equal(streams.uniform(4, "tokens", (8,)), streams.uniform(3, "tokens", (8,)))


def naive_pg(p: torch.Tensor, q: torch.Tensor, k: int) -> torch.Tensor:
    """E_mu of the uncorrected estimate: q (1 - p) P_mu(O >= k - 1) - (1 - q) p P_mu(O >= k), per position."""
    out = torch.empty_like(p)
    for t in range(len(p)):
        o = others(q, t)
        out[t] = q[t] * (1 - p[t]) * o[k - 1 :].sum() - (1 - q[t]) * p[t] * o[k:].sum()
    return out


@pytest.mark.parametrize("lag", [0, 1, 3])
def test_update_s_samples_from_theta_s_minus_lag(lag):
    """Exact naive PG under lag K against the same recursion written out: theta_{s+1} = theta_s +
    lr E_{theta_max(s - K, 0)}[estimate]."""
    chain = BitChain(6, 4, torch.linspace(0.3, 0.5, 6), 0.5)
    thetas = [chain.theta.clone()]
    for s in range(8):
        p, q = torch.sigmoid(thetas[s]), torch.sigmoid(thetas[max(s - lag, 0)])
        thetas.append(thetas[s] + 3.0 * naive_pg(p, q, 4))
    want = [BitChain(6, 4, torch.sigmoid(th), 0.5).value() for th in thetas]
    res = train(chain, "pg", steps=8, lr=3.0, lag=lag, batch_size=None)
    assert np.allclose(res.J[0, 0], want, rtol=0, atol=1e-13)


def test_stop_and_progress():
    calls, fractions = [], []
    stop = lambda: calls.append(1) or len(calls) >= 3
    res = train(BitChain(16, 10, 0.5, 0.5), ["seq_is", "pg"], steps=10, lr=1.0, lag=0, batch_size=8, seeds=2,
                should_stop=stop, progress=lambda f, m: fractions.append(f))
    assert res.stopped
    assert np.isfinite(res.J[:, :, :4]).all() and np.isnan(res.J[:, :, 4:]).all()
    assert np.allclose(res.final, res.J[:, :, 3]) and fractions and 0 < fractions[-1] <= 1


def test_adam_steps_by_about_lr_and_a_baseline_centres_the_reward():
    chain = BitChain(16, 9, 0.5, 0.5)
    res = train(chain, "pg", steps=1, lr=0.05, lag=0, batch_size=64, optimizer="adam")
    sgd = train(chain, "pg", steps=1, lr=0.05, lag=0, batch_size=64)
    assert res.grad_norm[0, 0, 0] == sgd.grad_norm[0, 0, 0]  # the same estimate, a different step
    # Adam's first step is lr * g / |g| per coordinate: J moves by about lr * sum |dJ/dtheta_t| (first order)
    true = ChainPolicy(chain).value_and_gradient(chain.theta[None])[1][0]
    assert res.J[0, 0, 1] - res.J[0, 0, 0] == pytest.approx(0.05 * float(true.abs().sum()), rel=0.5)
    # on-policy with a baseline: g = (1/B) sum_b (R_b - mean R) (a_b - p)
    policy, streams = ChainPolicy(chain), Streams([0], "cpu")
    draw = lambda stream, tail: streams.uniform(0, stream, tail, torch.float64)
    theta = chain.theta[None]
    est, _ = _estimate(policy, _pairs(["pg"]), theta, theta, draw, 64, torch.float64, 1, baseline=True)
    a, _, _, reward = policy.rollouts(theta, theta, draw, 64, torch.float64)
    adv = reward[0] - reward[0].mean()
    assert torch.allclose(est[0], (adv[:, None] * (a[0] - 0.5)).mean(0), atol=1e-12)


# ---------------------------------------------------------------------------------------------------------
# sampler faults


def test_top_p_never_samples_the_minority_bit_and_reports_certainty():
    chain = BitChain(8, 4, torch.tensor([0.97, 0.5, 0.02, 0.6, 0.5, 0.5, 0.5, 0.5]), 0.5)
    policy = ChainPolicy(chain, SamplerFault(top_p=0.95))
    theta = chain.theta[None]
    streams = Streams([0], "cpu")
    draw = lambda stream, tail: streams.uniform(0, stream, tail, torch.float64)
    a, logp, logq, _ = policy.rollouts(theta, theta, draw, 4000, torch.float64)
    assert bool((a[0, :, 0] == 1).all()) and bool((a[0, :, 2] == 0).all())
    assert bool((logq[0, :, 0] == 0).all()) and bool((logq[0, :, 2] == 0).all())
    assert torch.allclose(logq[0, :, 1:2], logp[0, :, 1:2])  # inside the nucleus nothing changes


def test_precision_noise_has_the_preset_size():
    chain = BitChain(64, 32, 0.5, 0.5)
    policy = ChainPolicy(chain, SamplerFault(precision="bf16"))
    theta = chain.theta[None]
    streams = Streams([0], "cpu")
    draw = lambda stream, tail: streams.uniform(0, stream, tail, torch.float64)
    _, logp, logq, _ = policy.rollouts(theta, theta, draw, 500, torch.float64)
    l = logp - logq  # logit noise d moves log P(a) by about d (1 - P(a)) = d / 2 at p = 1/2
    assert float(l.std()) == pytest.approx(0.1 / 2, rel=0.05)


# ---------------------------------------------------------------------------------------------------------
# bad input


@pytest.mark.parametrize("kwargs, match", [
    (dict(estimators=["no_such"]), "unknown estimator"),
    (dict(estimators=[("seq_tis", ESTIMATORS["seq_is"].config())]), "SeqTISConfig"),
    (dict(estimators=[]), "estimators is empty"),
    (dict(lag=-1), "lags >= 0"),
    (dict(lr=math.nan), "finite lr"),
    (dict(batch_size=0), "batch_size must be >= 1"),
    (dict(seeds=[]), "seeds must be"),
    (dict(optimizer="rmsprop"), "optimizer must be one of"),
    (dict(baseline=True, batch_size=1), "baseline=True needs"),
])
def test_bad_arguments_are_refused_by_name(kwargs, match):
    args = dict(estimators=["seq_is"], steps=2, lr=1.0, lag=0, batch_size=4, seeds=1) | kwargs
    with pytest.raises(ValueError, match=match):
        train(BitChain(8, 4, 0.5, 0.5), **args)


def test_bad_faults_and_toys_are_refused():
    with pytest.raises(ValueError, match="precision must be"):
        SamplerFault(precision="fp4")
    with pytest.raises(ValueError, match="top_p must lie"):
        SamplerFault(top_p=0.0)
    with pytest.raises(ValueError, match="top_p fault only"):
        train(TabularAR(2, 3), "seq_is", steps=1, lr=1.0, lag=0, batch_size=4, fault=SamplerFault(precision="bf16"))
    with pytest.raises(ValueError, match="horizon <= 16"):
        train(BitChain(20, 10, 0.5, 0.5), "seq_is", steps=1, lr=1.0, lag=0, batch_size=None)
    with pytest.raises(ValueError, match="self-normalised"):
        train(BitChain(8, 4, 0.5, 0.5), SELF_NORMALISED, steps=1, lr=1.0, lag=0, batch_size=None)
    with pytest.raises(ValueError, match="BitChain or a TabularAR"):
        train("chain", "seq_is", steps=1, lr=1.0, lag=0, batch_size=4)


# ---------------------------------------------------------------------------------------------------------
# the sweeps and the published numbers


def test_published_sweeps_are_slices_of_the_lag_figure():
    """The horizon sweep's H = 1024 points are figure 1's B = 2048, K = 500; the batch sweep is its K = 500
    column (so both used lag 500), to the figure's 4 digits."""
    from seqis.lab import huang2026 as h

    col = h.LAGS.index(500)
    for label in ("Sequence IS", "Token IS", "GeoMean IS"):
        assert h.HORIZON[label][1024] == pytest.approx(h.LAG[label][h.BATCHES.index(2048)][col], abs=1.5e-4)
    seq = [row[col] for row in h.LAG["Sequence IS"]]
    assert np.allclose(h.BATCH["Sequence IS"], seq, atol=1.5e-4)
    df = h.frame()
    assert set(df["figure"]) == {"horizon", "batch", "lag"} and len(df) == 12 + 50 + 150
    assert set(h.ESTIMATOR_OF) >= set(h.HORIZON) | set(h.BATCH)


def test_sweep_rows_and_summary():
    from seqis.lab import train_sweeps

    small = train_sweeps.SweepSettings(horizon=16, lr=3.0, steps=4, batch_size=8, seeds=2, values=(0, 2))
    df = train_sweeps.sweep("lag", small)
    assert len(df) == 3 * 2 * 2 and set(df["x"]) == {0, 2} and df["final_J"].between(0, 1).all()
    s = train_sweeps.summary(df)
    assert len(s) == 6 and (s["low"] <= s["mean"]).all() and (s["mean"] <= s["high"]).all()
    by_b = train_sweeps.sweep("batch", small.with_(values=(4, 8), estimators=("Sequence IS",)))
    assert sorted(set(by_b["x"])) == [4, 8]
    with pytest.raises(ValueError, match="what must be one of"):
        train_sweeps.sweep("depth", small)
    collapse = train_sweeps.COLLAPSE.with_(horizon=16, steps=3, seeds=1, values=(8,))
    assert collapse.optimizer == "adam" and collapse.baseline
    assert len(train_sweeps.sweep("batch", collapse)) == 2
