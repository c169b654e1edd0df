"""The seed estimators themselves, run on simulated valid-IS batches at fixed seeds, against
LITERATURE.md's closed forms (test_theory.py checks the closed forms and the reference estimators).

Valid IS noise: l ~ N(-s^2/2, s^2) per token, so E_mu[rho] = 1 and log w ~ N(-T s^2/2, T s^2).
Tolerances are 4 standard errors of the simulated quantity.
"""

import math

import pytest
import torch

from seqis import ESTIMATORS, Batch, run, theory
from seqis.acceptance import gaussian_batch


def batch_of(n, T, s, seed):
    return gaussian_batch(n, T, s, seed=seed, dtype=torch.float64)


def acceptance(name, batch, **knobs):
    out = run(name, batch, ESTIMATORS[name].config(**knobs))
    return float(out.rollouts["accepted"].double().mean())


@pytest.mark.parametrize("T, published", [(16, 0.159), (64, 0.311), (256, 0.576), (1024, 0.886), (4096, 0.998)])
def test_mis_po_trajectory_acceptance_vs_length(T, published):
    # band [0.996, 1.001] at s = 0.05: the per-token KL 0.00125 is below the 0.004 cutoff, so long rollouts pass
    n = 4000 if T <= 1024 else 1000
    p = acceptance("mis_po", batch_of(n, T, 0.05, seed=T))
    closed = float(theory.geo_band_acceptance(T, 0.05, 0.996, 1.001))
    assert closed == pytest.approx(published, abs=1e-3)  # published to 3 digits
    assert p == pytest.approx(closed, abs=4 * math.sqrt(closed * (1 - closed) / n) + 1e-3)


@pytest.mark.parametrize("T", [16, 64, 256, 1024])
def test_geometric_band_acceptance_vs_length(T):
    # a band [0.99, 1.01] that the mean log-ratio -s^2/2 = -0.005 (s = 0.1) lies in
    s, n = 0.1, 4000
    batch = batch_of(n, T, s, seed=100 + T)
    closed = float(theory.geo_band_acceptance(T, s, 0.99, 1.01))
    for name in ("geo_mask", "seq_mis"):
        p = acceptance(name, batch, geo_mask_low=0.99, geo_mask_high=1.01)
        assert p == pytest.approx(closed, abs=4 * math.sqrt(closed * (1 - closed) / n) + 1e-3), name


def test_geometric_band_tends_to_one_or_zero_with_length():
    # -s^2/2 inside (log a, log b) -> 1; outside -> 0: a per-token KL threshold that sharpens with length
    assert float(theory.geo_band_acceptance(4096, 0.1, 0.99, 1.01)) > 0.99
    assert float(theory.geo_band_acceptance(4096, 0.2, 0.99, 1.01)) < 0.01  # -0.02 < log 0.99 = -0.01005
    batch = batch_of(500, 4096, 0.2, seed=7)
    assert acceptance("geo_mask", batch, geo_mask_low=0.99, geo_mask_high=1.01) < 0.02


@pytest.mark.parametrize("T, passes", [(10, False), (14, False), (15, True), (40, True)])
def test_catastrophic_token_passes_geometric_lower_bound_iff_T_above_14_4(T, passes):
    # one token with l = -10 among on-policy tokens: mean log-ratio -10 / T >= log 0.5 iff T >= 14.43
    assert float(theory.catastrophic_min_length(10.0, 0.5)) == pytest.approx(14.4, abs=0.05)
    l = torch.zeros(1, T, dtype=torch.float64)
    l[0, T // 2] = -10.0
    batch = Batch(torch.full_like(l, -0.01) + l, torch.full_like(l, -0.01), torch.ones(1, dtype=torch.float64))
    assert bool(run("geo_mask", batch).rollouts["accepted"][0]) is passes
    assert bool(run("seq_mis", batch).rollouts["accepted"][0]) is passes
    # a token band catches it whatever the length
    assert not bool(run("max_mask", batch).rollouts["accepted"][0])
    assert not bool(run("mis_po", batch).masks["kept"][0, T // 2])


def test_seq_tis_keeps_an_upward_outlier_at_weight_C_and_a_geometric_gate_drops_it():
    l = torch.zeros(1, 8, dtype=torch.float64)
    l[0, 3] = 6.0  # w = e^6, geometric ratio e^0.75 = 2.1 > 2
    batch = Batch(l - 7.0, torch.full_like(l, -7.0), torch.ones(1, dtype=torch.float64))
    assert float(run("seq_tis", batch).rollouts["weight"][0]) == 2.0
    assert not bool(run("geo_mask", batch).rollouts["accepted"][0])
