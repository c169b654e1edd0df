"""seqis.theory.acceptance: the simulations behind the Length & thresholds page agree with theory.formulas's closed
forms (within a few standard errors, fixed seeds), and the deterministic cases match hand arithmetic.

Statistical checks use 4 standard errors plus a small absolute slack for the closed forms' own rounding;
a failing seed may be bumped once, never twice.
"""

import math

import pytest
import torch

from seqis import ESTIMATORS
from seqis.theory import acceptance
from seqis.theory import formulas as theory

S = 0.05  # the literature's usual noise scale: per-token KL 0.00125


def cfg(name, **kw):
    return ESTIMATORS[name].config(**kw)


def test_gaussian_batch_is_valid_is_noise():
    g = torch.Generator().manual_seed(0)
    b = acceptance.gaussian_batch(4000, 64, 0.2, generator=g, dtype=torch.float64)
    assert b.shape == (4000, 64)
    assert bool(b.loss_mask.all())
    l = b.trainer_logprobs - b.inference_logprobs  # (B, T)
    n = l.numel()
    # l ~ N(-s^2/2, s^2): mean -0.02, sd 0.2; E[rho] = 1
    assert abs(l.mean().item() + 0.02) < 4 * 0.2 / math.sqrt(n)
    assert abs(l.std().item() - 0.2) < 0.002
    rho = l.exp()
    assert abs(rho.mean().item() - 1.0) < 4 * rho.std().item() / math.sqrt(n)


def test_gaussian_batch_is_seeded():
    a = acceptance.gaussian_batch(8, 16, 0.1, generator=torch.Generator().manual_seed(3))
    b = acceptance.gaussian_batch(8, 16, 0.1, generator=torch.Generator().manual_seed(3))
    c = acceptance.gaussian_batch(8, 16, 0.1, generator=torch.Generator().manual_seed(4))
    assert torch.equal(a.trainer_logprobs, b.trainer_logprobs)
    assert not torch.equal(a.trainer_logprobs, c.trainer_logprobs)


@pytest.fixture(scope="module")
def sweep():
    ests = [
        ("geo", "seq_mis", cfg("seq_mis", geo_mask_low=0.5, geo_mask_high=2.0)),
        ("traj", "mis_po", cfg("mis_po")),  # trajectory band [0.996, 1.001]
        ("product C=2", "seq_mis_product", cfg("seq_mis_product", seq_clip=2.0)),
        ("tis C=2", "seq_tis", cfg("seq_tis", seq_clip=2.0)),
    ]
    return acceptance.length_sweep(ests, (16, 256, 1024), S, n_rollouts=3000, seed=0, product_band=(0.5, 2.0))


def _row(df, label, T):
    rows = df[(df["label"] == label) & (df["T"] == T)]
    assert len(rows) == 1, (label, T)
    return rows.iloc[0]


def _close(sim, se, exact, k=4.0, slack=0.003):
    assert abs(sim - exact) <= k * se + slack, (sim, se, exact)


@pytest.mark.parametrize("T", [16, 256, 1024])
def test_band_acceptance_matches_closed_forms(sweep, T):
    _close(_row(sweep, "geo", T)["accepted"], _row(sweep, "geo", T)["accepted_se"],
           theory.geo_band_acceptance(T, S, 0.5, 2.0))
    _close(_row(sweep, "traj", T)["accepted"], _row(sweep, "traj", T)["accepted_se"],
           theory.geo_band_acceptance(T, S, 0.996, 1.001))
    _close(_row(sweep, "product band", T)["accepted"], _row(sweep, "product band", T)["accepted_se"],
           theory.product_band_acceptance(T, S, 0.5, 2.0))
    _close(_row(sweep, "product C=2", T)["accepted"], _row(sweep, "product C=2", T)["accepted_se"],
           theory.product_band_acceptance(T, S, 0.0, 2.0))


@pytest.mark.parametrize("T", [16, 256, 1024])
def test_truncated_weight_moments_match_closed_forms(sweep, T):
    mean, var = theory.seq_tis_moments(T, S, 2.0)
    tis = _row(sweep, "tis C=2", T)
    _close(tis["weight_mean"], tis["weight_mean_se"], mean)
    _close(tis["weight_var"], tis["weight_var_se"], var)
    prod = _row(sweep, "product C=2", T)
    _close(prod["weight_mean"], prod["weight_mean_se"], theory.seq_mis_product_mean(T, S, 2.0))


def test_length_sweep_is_deterministic_and_takes_names():
    a = acceptance.length_sweep(["seq_mis", "mis_po"], (8, 32), 0.1, n_rollouts=200, seed=1)
    b = acceptance.length_sweep(["seq_mis", "mis_po"], (8, 32), 0.1, n_rollouts=200, seed=1)
    c = acceptance.length_sweep(["seq_mis", "mis_po"], (8, 32), 0.1, n_rollouts=200, seed=2)
    assert a.equals(b)
    assert not a.equals(c)
    assert list(a["label"]) == ["seq_mis", "mis_po"] * 2
    assert list(a["T"]) == [8, 8, 32, 32]


def test_one_estimator_twice_with_two_configs():
    df = acceptance.length_sweep([("tight", "geo_mask", cfg("geo_mask", geo_mask_low=0.999, geo_mask_high=1.001)),
                                  ("loose", "geo_mask", cfg("geo_mask"))], (64,), 0.05, n_rollouts=500, seed=0)
    assert _row(df, "loose", 64)["accepted"] == 1.0
    assert _row(df, "tight", 64)["accepted"] < 0.5  # exp(-s^2/2) = 0.99875 sits at the edge of [0.999, 1.001]


def test_kl_sweep_is_a_cutoff_at_minus_log_low():
    kls = (0.001, 0.01)  # below and above MIS-PO's cutoff -log 0.996 = 0.0040
    df = acceptance.kl_sweep([("mis_po", "mis_po", cfg("mis_po"))], (4096,), kls, n_rollouts=200, seed=0)
    below = df[df["kl"] == 0.001]["accepted"].item()
    above = df[df["kl"] == 0.01]["accepted"].item()
    assert below > 0.98 and above < 0.02
    s = math.sqrt(2 * 0.001)
    _close(below, df[df["kl"] == 0.001]["accepted_se"].item(), theory.geo_band_acceptance(4096, s, 0.996, 1.001))


def test_catastrophic_token_is_diluted_by_length():
    L = 10.0
    lengths = (1, 14, 15, 100, 2494, 2496)
    ests = [("geo_mask", "geo_mask", None), ("seq_mis", "seq_mis", None), ("mis_po", "mis_po", None),
            ("max_mask", "max_mask", None), ("seq_tis", "seq_tis", None)]
    df = acceptance.catastrophic(ests, lengths, L)

    def col(label, direction, name):
        d = df[(df["label"] == label) & (df["direction"] == direction)].sort_values("T")
        assert list(d["T"]) == list(lengths)
        return list(d[name])

    # exp(-L/T) >= 0.5 iff T >= L / log 2 = 14.43 (theory.catastrophic_min_length, checked in test_theory.py)
    assert col("geo_mask", "down", "kept") == [False, False, True, True, True, True]
    assert col("seq_mis", "down", "accepted") == [False, False, True, True, True, True]
    # a token band or a max criterion catches it at every length
    assert not any(col("mis_po", "down", "kept"))
    assert not any(col("max_mask", "down", "accepted"))
    # mis_po's trajectory band passes once L / T <= -log 0.996 (T >= 2495): the rest of the rollout trains
    assert theory.catastrophic_min_length(L, 0.996) == pytest.approx(2495.0, abs=1.0)
    assert col("mis_po", "down", "accepted") == [False, False, False, False, False, True]
    assert col("mis_po", "down", "other_weight")[-1] == 1.0
    # seq_tis: weight e^-L down, C = 2 up; seq_mis past its gate applies e^L to the upward token
    assert col("seq_tis", "down", "weight") == pytest.approx([math.exp(-L)] * 6, rel=1e-5)
    assert col("seq_tis", "up", "weight") == pytest.approx([2.0] * 6)
    assert col("seq_mis", "up", "weight")[2:] == pytest.approx([math.exp(L)] * 4, rel=1e-5)
    assert col("seq_mis", "up", "weight")[:2] == [0.0, 0.0]
    assert math.isnan(col("seq_tis", "down", "other_weight")[0])  # T = 1 has no other token


def test_drift_table_matches_li():
    df = acceptance.drift([("tis", "seq_tis", cfg("seq_tis", seq_clip=5.0)), ("gate", "seq_mis", None)],
                          (10, 1000, 2000, 5000), 1.001)
    assert list(df["w"]) == pytest.approx(list(theory.drift_weight(1.001, df["T"].to_numpy(float))), rel=1e-9)
    assert list(df["geo"]) == pytest.approx([1.001] * 4, rel=1e-12)
    assert list(df["tis weight"]) == pytest.approx([min(w, 5.0) for w in df["w"]], rel=1e-9)
    assert all(df["gate accepted"])
    assert theory.drift_crossing(1.001, 5.0) == pytest.approx(1610, abs=1)
