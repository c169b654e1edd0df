"""The exact answers the Lessons page reveals, against the lab's enumeration and simulation:

- the bit chain's additive reward makes token IS unbiased (theory == enumeration), the threshold reward does not;
- the whole rollout's chi2 (the one in Li's C* = sqrt(2 (1 + chi2))) in closed form == enumeration == each toy's own;
- sequence TIS's bias and variance against its clip, summed over counts, == a plain enumeration of the formula and
  == Monte Carlo; on H = 16, k = 11, p = 0.55, q = 0.45 at B = 128 its MSE has an interior minimum near C*;
- training along the exact expected gradient by counts (seqis.lab.mean_field) == train(batch_size=None), which
  enumerates all 2^H sequences.
"""

import math

import numpy as np
import pytest
import torch

from seqis import ESTIMATORS, lab
from seqis.lab.huang2026 import ESTIMATOR_OF
from seqis.lab.mean_field import train_expected
from seqis.theory import formulas as theory


@pytest.mark.parametrize("reward", ["threshold", "additive"])
def test_bitchain_closed_forms_match_enumeration_for_both_rewards(reward):
    H, k, p, q = 10, 6, 0.6, 0.45
    chain = lab.BitChain(H, k, p, q, reward=reward)
    true = theory.bitchain_true_gradient(H, k, p, reward)
    assert torch.allclose(chain.true_gradient(), torch.full((H,), true, dtype=torch.float64), rtol=1e-12)
    token = lab.expected_gradient(chain, "token_tis", ESTIMATORS["token_tis"].config(token_clip=math.inf))
    assert torch.allclose(token, torch.full((H,), theory.bitchain_token_is_mean(H, k, p, q, reward),
                                            dtype=torch.float64), rtol=1e-10)
    naive = lab.expected_gradient(chain, "pg")
    assert torch.allclose(naive, torch.full((H,), theory.bitchain_naive_pg_mean(H, k, p, q, reward),
                                            dtype=torch.float64), rtol=1e-10)


def test_additive_reward_makes_token_is_unbiased_threshold_does_not():
    # the lesson's contrast on Huang's chain: 0.567 of the truth with 1[sum >= 40], exactly 1 with sum a_t
    true = theory.bitchain_true_gradient(64, 40, 0.6)
    assert theory.bitchain_token_is_mean(64, 40, 0.6, 0.55) / true == pytest.approx(0.5674, abs=1e-4)
    additive = theory.bitchain_true_gradient(64, 40, 0.6, "additive")
    assert additive == pytest.approx(0.6 * 0.4, rel=1e-12)
    assert theory.bitchain_token_is_mean(64, 40, 0.6, 0.55, "additive") == pytest.approx(additive, rel=1e-12)
    with pytest.raises(ValueError, match="reward must be one of"):
        theory.bitchain_true_gradient(8, 4, 0.5, "random")


def test_sequence_chi2_closed_form_matches_enumeration_and_the_toys():
    chain = lab.BitChain(12, 7, 0.55, 0.45)
    rollouts, prob_mu = chain.enumerate()
    w = (rollouts.trainer_logprobs - rollouts.inference_logprobs).sum(-1).exp()  # (2^H,)
    enumerated = float((prob_mu * w * w).sum()) - 1
    assert theory.bitchain_chi2(12, 0.55, 0.45) == pytest.approx(enumerated, rel=1e-10)
    assert chain.seq_chi2() == pytest.approx(enumerated, rel=1e-10)
    tab = lab.TabularAR(3, 4, seed=1, mismatch=0.5)
    pi = tab._pi_logp.sum(-1).exp()
    mu = tab._mu_logp.sum(-1).exp()
    assert tab.seq_chi2() == pytest.approx(float((pi * pi / mu).sum()) - 1, rel=1e-10)
    # Li's C* on the lesson's toy: chi2 = 0.885 (whole rollout), C* = 1.94
    assert theory.seq_tis_best_clip(theory.bitchain_chi2(16, 0.55, 0.45)) == pytest.approx(1.9415, abs=1e-4)


def _enumerated_error(H, k, p, q, C, B):
    """The plain formula by enumeration: g_t = min(w, C) R (a_t - p) on every one of the 2^H sequences."""
    chain = lab.BitChain(H, k, p, q)
    r, prob = chain.enumerate()
    w = (r.trainer_logprobs - r.inference_logprobs).sum(-1).exp()  # (N,)
    g = torch.clamp(w, max=C)[:, None] * r.reward[:, None] * (r.tokens.double() - p)  # (N, H)
    mean = (prob[:, None] * g).sum(0)  # (H,)
    second = (prob[:, None] * g * g).sum(0)
    true = chain.true_gradient()
    return float(((mean - true) ** 2).sum()), float((second - mean**2).sum()) / B


@pytest.mark.parametrize("C", [0.5, 1.5, 4.0, math.inf])
def test_seq_tis_error_matches_enumeration(C):
    bias2, var = theory.bitchain_seq_tis_error(10, 6, 0.6, 0.45, C, batch_size=32)
    want_bias2, want_var = _enumerated_error(10, 6, 0.6, 0.45, C, 32)
    assert bias2 == pytest.approx(want_bias2, rel=1e-9, abs=1e-15)
    assert var == pytest.approx(want_var, rel=1e-9)
    if C == math.inf:  # untruncated sequence IS: unbiased
        assert bias2 < 1e-25


def test_seq_tis_error_matches_monte_carlo_and_has_an_interior_optimum_near_li():
    toy = dict(H=16, k=11, p=0.55, q=0.45)
    C = np.round(np.arange(0.05, 8.0, 0.01), 2)
    bias2, var = theory.bitchain_seq_tis_error(*toy.values(), C, batch_size=128)
    mse = bias2 + var
    best = C[mse.argmin()]
    assert 0.3 < best < 7  # interior: not at either end of the grid
    assert mse.min() < 0.7 * min(mse[0], mse[-1])
    star = theory.seq_tis_best_clip(theory.bitchain_chi2(16, 0.55, 0.45))
    assert abs(best / star - 1) < 0.1  # 1.83 against Li's 1.94
    chain = lab.BitChain(16, 11, 0.55, 0.45)
    for c in (1.0, 1.83, 4.0):
        res = lab.monte_carlo(chain, "seq_tis", ESTIMATORS["seq_tis"].config(seq_clip=c), batch_size=128,
                              n_batches=300, seed=0, dtype=torch.float64)
        b2, v = theory.bitchain_seq_tis_error(16, 11, 0.55, 0.45, c, batch_size=128)
        assert abs(res.mse - (b2 + v)) < 4 * res.stderr_mse, (c, res.mse, b2 + v, res.stderr_mse)


def test_train_expected_equals_enumerated_exact_training():
    chain = lab.BitChain(10, 7, 0.5, 0.5)
    ests = [ESTIMATOR_OF[label] for label in ("Sequence IS", "Token IS", "GeoMean IS", "Sequence TIS 0-2")]
    ests += ["mis_po", "pg"]
    want = lab.train_lags(chain, ests, [0, 4], steps=12, lr=10.0, batch_size=None)
    got = train_expected(chain, ests, steps=12, lr=10.0, lags=[0, 4])
    for a, b in zip(want, got, strict=True):
        assert a.estimators == b.estimators and a.lag == b.lag
        np.testing.assert_allclose(b.J, a.J, rtol=0, atol=1e-12)
        np.testing.assert_allclose(b.kept, a.kept, rtol=0, atol=1e-12)
        np.testing.assert_allclose(b.grad_norm, a.grad_norm, rtol=1e-10, atol=1e-14)


def test_train_expected_sequence_is_ignores_the_lag_and_refuses_what_it_cannot_do():
    chain = lab.BitChain(64, 42, 0.5, 0.5)
    lagged, fresh = train_expected(chain, ["seq_is"], steps=20, lr=10.0, lags=[10, 0])
    np.testing.assert_allclose(lagged.J, fresh.J, rtol=1e-12)  # its expected gradient is the true one at any lag
    with pytest.raises(ValueError, match="position"):
        train_expected(chain, ["prefix_is"], steps=2, lr=1.0, lags=[0])
    with pytest.raises(ValueError, match="one p"):
        train_expected(lab.BitChain(4, 2, torch.tensor([0.4, 0.5, 0.5, 0.5]), 0.5), ["seq_is"], steps=2, lr=1.0,
                       lags=[0])


def test_weight_quantiles_match_the_band_acceptance_and_simulation():
    from seqis.theory import acceptance

    T, s = 4096, 0.05
    for z in (-2.0, 0.0, 1.0):  # P(w <= its z-quantile) = Phi(z), by the product band's own closed form
        q = theory.seq_weight_quantile(T, s, z)
        assert theory.product_band_acceptance(T, s, 0.0, q) == pytest.approx(theory.phi(z), abs=1e-9)
        g = theory.geo_ratio_quantile(T, s, z)
        assert theory.geo_band_acceptance(T, s, 0.0, g) == pytest.approx(theory.phi(z), abs=1e-9)
    assert theory.seq_weight_quantile(T, s, 0.0) == pytest.approx(math.exp(-T * s * s / 2), rel=1e-12)
    # the opening lesson's number: the share of 4096-token rollouts with w < 1, Phi(s sqrt(T) / 2) = 0.945
    share = theory.product_band_acceptance(T, s, 0.0, 1.0)
    assert share == pytest.approx(theory.phi(s * math.sqrt(T) / 2), rel=1e-12)
    assert share == pytest.approx(0.945, abs=1e-3)
    ends = acceptance.running_ratios(4000, [T], s, seed=1)
    sim = float((ends["w"] < 1).mean())
    assert abs(sim - share) < 4 * math.sqrt(share * (1 - share) / 4000)
    paths = acceptance.running_ratios(3, [1, 10, 100], s, seed=0)
    assert len(paths) == 9 and set(paths["T"]) == {1, 10, 100}
    one = paths[paths["rollout"] == 0].set_index("T")
    assert one.loc[100, "geo"] == pytest.approx(one.loc[100, "w"] ** (1 / 100), rel=1e-12)
