"""Score centering in the lab (seqis.lab.centering, seqis.lab.head_lm; issue 42 item 5).

The references here are closed forms derived in the modules' docstrings, written again from the formula in float64:
plain REINFORCE's drift under a constant reward r is r (q - p) per position, a token rule f's is r [q f(p / q) (1 - p)
- (1 - q) f((1 - p) / (1 - q)) p], score centering's is 0; with a count reward SC (f = 1) follows the sampler's own
policy gradient, so its expected gradient is the true gradient of a chain whose p is the sampler's q, and plain
REINFORCE's is that plus J(q) (q - p). On the generator, the whole-vocabulary centered gradient in the logits is
A / N [f(rho_y) (e_y - p) - sum_v q_v f(rho_v) (e_v - p)] per token (A / N (e_y - q) for f = 1).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from seqis.lab import BitChain, TabularAR, train, train_expected
from seqis.lab.centering import CORRECTIONS, SETTINGS, Setting, drift_path, sc_drift, sc_training
from seqis.lab.chain import binary_head
from seqis.lab.head_lm import SC, TIS_SC, HeadLM, head_batch, head_error_table, logit_gradient
from seqis.lab.policies import SamplerFault

GRID_P = [0.1, 0.3, 0.5, 0.8, 0.95]
GRID_Q = [0.05, 0.2, 0.5, 0.7, 0.99]


@pytest.fixture(autouse=True)
def one_thread():
    """These tests run many small evaluations; one thread is faster than two on a shared machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def token_rule_drift(p: float, q: float, f, r: float = 1.0) -> float:
    """r E_{a~q}[f(p_a / q_a) (a - p)] for one bit: the derivation in seqis.lab.centering's docstring."""
    return r * (q * f(p / q) * (1 - p) - (1 - q) * f((1 - p) / (1 - q)) * p)


def test_the_bit_head_is_the_whole_vocabulary():
    logp = torch.log(torch.tensor([[0.3, 0.9]], dtype=torch.float64))
    logq = torch.log(torch.tensor([[0.6, 1.0]], dtype=torch.float64))  # the second: the sampler cannot miss
    head = binary_head(logp, logq)
    assert head["topk_ids"].tolist() == [[[0, 1], [0, -1]]]
    torch.testing.assert_close(head["topk_trainer_logprobs"][0, 0].exp().sum(), torch.tensor(1.0, dtype=torch.float64))
    torch.testing.assert_close(head["topk_inference_logprobs"][0, 0].exp(),
                               torch.tensor([0.6, 0.4], dtype=torch.float64))


@pytest.mark.parametrize("horizon", [1, 6])
def test_under_a_constant_reward_plain_reinforce_drifts_by_r_times_q_minus_p_and_sc_not_at_all(horizon):
    p, q = np.meshgrid(GRID_P, GRID_Q)
    df = sc_drift(p=p.ravel(), q=q.ravel(), horizon=horizon, reward=2.5)
    by = {name: part.reset_index(drop=True) for name, part in df.groupby("correction")}
    plain = by["none"]
    np.testing.assert_allclose(plain.drift, 2.5 * (plain.q - plain.p), rtol=1e-12, atol=1e-14)
    assert (plain.drift.abs() > 0.1).sum() >= 15  # it moves wherever p and q differ
    tis = by["token TIS"]
    want = [token_rule_drift(a, b, lambda x: min(x, 2.0), 2.5) for a, b in zip(tis.p, tis.q, strict=True)]
    np.testing.assert_allclose(tis.drift, want, rtol=1e-12, atol=1e-14)
    assert (tis.drift.abs() > 1e-3).sum() >= 5  # where the cap bites (q < p / 2 or 1 - q < (1 - p) / 2)
    for name in ("SC", "SC + TIS"):
        np.testing.assert_allclose(by[name].drift, 0.0, atol=1e-13)


def test_with_a_constant_reward_plain_reinforce_walks_away_and_sc_stays_put():
    """The path the Lessons screen draws: plain REINFORCE follows logit += lr r (sigmoid(logit + b) - sigmoid(logit))
    towards the sampler's side, update after update; SC never moves."""
    df = drift_path(p0=0.6, logit_bias=-1.0, steps=40, lr=2.0, reward=1.5)
    plain = df[df.correction == "none"].p.to_numpy()
    theta, want = math.log(0.6 / 0.4), [0.6]
    sig = lambda x: 1 / (1 + math.exp(-x))
    for _ in range(40):
        theta += 2.0 * 1.5 * (sig(theta - 1.0) - sig(theta))
        want.append(sig(theta))
    np.testing.assert_allclose(plain, want, rtol=1e-10)
    assert plain[-1] < 0.05 and (np.diff(plain) < 0).all()
    for name in ("SC", "SC + TIS"):
        np.testing.assert_allclose(df[df.correction == name].p, 0.6, atol=1e-12)


def test_sequence_is_has_no_drift_either_and_geo_is_has():
    df = sc_drift(["seq_is", "geo_is"], p=[0.3, 0.8], q=[0.6, 0.4], horizon=5)
    seq, geo = df[df.correction == "seq_is"], df[df.correction == "geo_is"]
    np.testing.assert_allclose(seq.drift, 0.0, atol=1e-13)
    assert (geo.drift.abs() > 1e-3).all()


@pytest.mark.parametrize("p, q", [(0.5, 0.3), (0.4, 0.6), (0.7, 0.65)])
def test_with_a_count_reward_sc_follows_the_sampler_s_gradient_and_plain_adds_the_drift(p, q):
    """SC (f = 1): E_mu[A (a_t - q)] = dJ/dtheta at p := q; plain: that + J(q) (q - p)."""
    H, k = 12, 7
    df = sc_drift({"none": CORRECTIONS["none"], "SC": CORRECTIONS["SC"]}, p=p, q=q, horizon=H, reward=1.0)
    # a constant reward is the threshold chain with k = 0; here the reward is 1[count >= k]: train_expected's path
    from seqis.lab.mean_field import expected_gradient_counts
    from seqis.lab.train import _pairs

    pairs = _pairs([CORRECTIONS["none"], CORRECTIONS["SC"]])
    chain_q = BitChain(H, k, q, q)
    theta = torch.logit(torch.tensor([p, p], dtype=torch.float64))
    theta_mu = torch.logit(torch.tensor([q, q], dtype=torch.float64))
    g, _ = expected_gradient_counts(pairs, theta, theta_mu, chain_q.count_reward, 1)
    sampler_gradient = float(chain_q.true_gradient()[0])
    assert float(g[1]) == pytest.approx(sampler_gradient, rel=1e-10, abs=1e-15)
    assert float(g[0]) == pytest.approx(sampler_gradient + chain_q.value() * (q - p), rel=1e-10, abs=1e-15)
    assert len(df) == 2


def test_exact_training_with_sc_equals_training_over_every_sequence():
    """train_expected's sum over counts against train(batch_size=None)'s enumeration of all 2^H sequences, under a
    biased and lagging sampler, for the four corrections: two exact paths through different code."""
    chain = BitChain(7, 4, 0.45, 0.45)
    ests = list(CORRECTIONS.values())
    fault = SamplerFault(logit_bias=-0.4)
    got = train_expected(chain, ests, steps=10, lr=3.0, lags=[0, 3], fault=fault)
    want = [train(chain, ests, steps=10, lr=3.0, lag=lag, batch_size=None, fault=fault) for lag in (0, 3)]
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a.J, b.J, rtol=1e-10, atol=1e-13)
        np.testing.assert_allclose(a.grad_norm, b.grad_norm, rtol=1e-8, atol=1e-12)


def test_sampled_training_with_sc_averages_to_the_exact_gradient():
    """The Monte Carlo trainer's SC estimate of one update is unbiased: its mean over many seeds is the exact one."""
    chain = BitChain(6, 3, 0.5, 0.5)
    fault = SamplerFault(logit_bias=-0.7)
    sc = CORRECTIONS["SC"]
    (exact,) = train_expected(chain, [sc], steps=1, lr=1.0, lags=[0], fault=fault)
    mc = train(chain, [sc], steps=1, lr=1.0, lag=0, batch_size=256, seeds=64, fault=fault, dtype=torch.float64)
    # one update from theta0 at lr 1: J after it is J(theta0 + g); compare g through the norms per position
    g_exact = exact.grad_norm[0, 0, 0] / math.sqrt(6)
    g_mc = mc.grad_norm[0, :, 0] / math.sqrt(6)  # |g| of each seed's estimate (the same sign here: g > 0)
    assert abs(g_mc.mean() - g_exact) < 4 * g_mc.std() / math.sqrt(len(g_mc)) + 1e-3


def test_a_centered_correction_on_a_toy_without_a_bit_head_is_refused():
    with pytest.raises(ValueError, match="score centering needs the sampler's head.*BitChain only"):
        train(TabularAR(3, 3), [CORRECTIONS["SC"]], steps=1, lr=1.0, lag=0, batch_size=8)
    with pytest.raises(ValueError, match="logit_bias is a bit's"):
        train(TabularAR(3, 3), ["seq_is"], steps=1, lr=1.0, lag=0, batch_size=8, fault=SamplerFault(logit_bias=1.0))
    with pytest.raises(ValueError, match="logit_bias only"):
        train_expected(BitChain(4, 2, 0.5, 0.5), ["pg"], steps=1, lr=1.0, lags=[0], fault=SamplerFault(top_p=0.9))


@pytest.fixture(scope="module")
def training():
    before = torch.get_num_threads()  # (set up before the function-scoped one_thread)
    torch.set_num_threads(1)
    try:
        return sc_training(SETTINGS, chain=BitChain(32, 21, 0.5, 0.5), steps=150, lr=10.0, marks=(50,))
    finally:
        torch.set_num_threads(before)


def _final(df, setting, correction):
    return float(df[(df.setting == setting) & (df.correction == correction)]["J@150"].iloc[0])


def test_training_under_a_biased_sampler_plain_stalls_and_sc_converges(training):
    """The paper's claim on the bit chain: b = -0.5 against the reward, plain REINFORCE's drift E_mu[A] (q - p) meets
    the reward's pull and it stalls below 0.8; SC removes the drift and reaches J > 0.999 (as does token TIS, which
    has no drift here: its cap never bites); towards the reward (b = +0.5) the drift helps plain REINFORCE."""
    b = SETTINGS[0].name
    assert _final(training, b, "none") < 0.8
    for name in ("SC", "token TIS", "SC + TIS", "sequence IS"):
        assert _final(training, b, name) > 0.999
    towards = SETTINGS[1].name
    assert _final(training, towards, "none") > _final(training, towards, "SC")


def test_what_does_not_reproduce_sc_plus_tis_is_token_tis_where_the_cap_never_bites(training):
    """SC + TIS's coefficient is 0 where no ratio reaches the cap (the f = x identity), so on the bit chain it
    trains exactly as token TIS under lag: the paper's 'SC + IS beats IS alone under staleness' has nothing to act
    on; and a sampler so biased that it never reaches the reward (b = -1) stalls every per-token correction."""
    for setting in (SETTINGS[3].name, SETTINGS[4].name):
        a = training[(training.setting == setting) & (training.correction == "token TIS")]
        b = training[(training.setting == setting) & (training.correction == "SC + TIS")]
        np.testing.assert_allclose(a[["J@50", "J@150"]].to_numpy(), b[["J@50", "J@150"]].to_numpy(), rtol=1e-12)
    strong = SETTINGS[2].name
    for name in CORRECTIONS:
        assert _final(training, strong, name) < 0.1
    assert _final(training, strong, "sequence IS") > 0.99  # the exact expectation: an infinite batch


def test_under_lag_sc_beats_plain_reinforce(training):
    lag = SETTINGS[3].name
    row = lambda c: training[(training.setting == lag) & (training.correction == c)].iloc[0]
    assert row("SC")["first J>=0.9"] < row("none")["first J>=0.9"]


def test_settings_are_refused_when_wrong():
    with pytest.raises(ValueError, match="p and q must lie strictly between 0 and 1"):
        sc_drift(p=0.0, q=0.5)
    with pytest.raises(ValueError, match="logit_bias must be finite"):
        SamplerFault(logit_bias=math.inf)
    assert Setting("x").lag == 0


# ---------------------------------------------------------------------------------------------------------
# the head's size on a generator (Marin's table)


def exact_logit_gradient(draw, f) -> torch.Tensor:
    """(B, T, V) A / N [f(rho_y) (e_y - p) - sum_v q_v f(rho_v) (e_v - p)]: the centered token-mean gradient in
    the logits, whole vocabulary, written from the formula in float64."""
    log_p, log_q, y, A = draw["log_p"], draw["log_q"], draw["tokens"], draw["advantages"]
    B, T, V = log_p.shape
    p, q = log_p.exp(), log_q.exp()
    rho = (log_p - log_q).exp()
    e_y = torch.nn.functional.one_hot(y, V).double()
    f_y = f(rho.gather(-1, y[..., None]))  # (B, T, 1)
    center = (q * f(rho)).sum(-1, keepdim=True) * -p + q * f(rho)  # sum_v q_v f(rho_v) (e_v - p)
    return A[:, None, None] / (B * T) * (f_y * (e_y - p) - center)


@pytest.mark.parametrize("correction, f", [(SC, lambda r: torch.ones_like(r)), (TIS_SC, lambda r: r.clamp(max=2.0))])
def test_the_whole_vocabulary_head_gives_the_exact_centered_gradient(correction, f):
    lm = HeadLM(vocab=256, positions=6, rollouts=4, mismatch=1.0)  # a large mismatch: TIS's cap bites
    draw = lm.draw(3)
    got = logit_gradient(correction, draw, 256)
    torch.testing.assert_close(got, exact_logit_gradient(draw, f), rtol=1e-9, atol=1e-14)
    if correction is SC:  # f = 1: A / N (e_y - q)
        e_y = torch.nn.functional.one_hot(draw["tokens"], 256).double()
        want = draw["advantages"][:, None, None] / 24 * (e_y - draw["log_q"].exp())
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-14)


def test_the_head_batch_reads_the_sampler_s_top_k():
    draw = HeadLM(vocab=256, positions=3, rollouts=2).draw(0)
    batch, logits = head_batch(draw, 8)
    assert batch.topk_ids.shape == (2, 3, 8) and logits.requires_grad
    top = draw["log_q"].topk(8, -1).values
    torch.testing.assert_close(batch.topk_inference_logprobs, top)
    with pytest.raises(ValueError, match="K must lie in"):
        head_batch(draw, 257)


def test_the_error_by_head_size_falls_to_zero_at_the_whole_vocabulary():
    lm = HeadLM(vocab=512, positions=8, rollouts=8)
    table = head_error_table(lm, Ks=(1, 4, 8, 32, 128))
    assert list(table.K) == [1, 4, 8, 32, 128, 512]
    err, tail = table.sc_l1_error.to_numpy(), table.tail_mass.to_numpy()
    assert (np.diff(err) <= 1e-9).all() and (np.diff(tail) <= 0).all()  # a larger head, a smaller error and tail
    assert err[0] > 5 and err[-1] < 1e-9 and tail[-1] < 1e-12  # K = 1 is far off; the whole vocabulary exact
    assert 0.0005 < table.mismatch_l1.iloc[0] < 0.05


def test_sc_plus_tis_at_a_small_mismatch_has_no_tail_error_because_it_has_no_term():
    """At Marin's mismatch no ratio reaches TIS's cap 2: SC + TIS's coefficient is 0 at every K, so is its error."""
    table = head_error_table(HeadLM(vocab=256, positions=6, rollouts=6), Ks=(1, 8), correction=TIS_SC)
    assert (table.l1_error.abs() < 1e-9).all() and table.sc_l1_error.isna().all()
