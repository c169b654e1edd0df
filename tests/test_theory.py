"""The one place for closed forms: seqis.theory.formulas against the published numbers (Li & Liu, "When Speed Kills
Stability"; StepFun, "Step 3.5 Flash"; Huang, "Is Frontier Asynchronous RL Solved?") and against the
estimators themselves on seeded simulations (else against the sampled log-ratios directly).

Valid IS noise: l ~ N(-s^2/2, s^2) per token, so E_mu[rho] = 1 and log w ~ N(-T s^2/2, T s^2).
Simulated tolerances are 4 standard errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from seqis import ESTIMATORS, Batch, diagnostics, run
from seqis.theory import acceptance
from seqis.theory import formulas as theory

INF = math.inf


def gaussian_batch(n: int, T: int, s: float, seed: int) -> Batch:
    """n rollouts of T tokens with valid IS noise l ~ N(-s^2/2, s^2), so E_mu[rho] = 1 (float64)."""
    return acceptance.gaussian_batch(n, T, s, seed=seed, dtype=torch.float64)


def rollouts(name: str, batch: Batch, **knobs) -> dict[str, torch.Tensor]:
    return run(name, batch, ESTIMATORS[name].config(**knobs)).rollouts


def within(sim: float, closed: float, se: float) -> bool:
    return abs(sim - closed) <= 4 * se + 1e-9


# ---------------------------------------------------------------------------------------------------------
# the published numbers: Li & Liu (bands, truncated weights, drift), Step 3.5 Flash (MIS-PO), Huang (bit chain)


@pytest.mark.parametrize("T, published", [(16, 0.999), (256, 0.577), (1024, 0.248), (4096, 0.049)])
def test_product_band_published(T, published):
    assert theory.product_band_acceptance(T, 0.05, 0.5, 2.0) == pytest.approx(published, abs=6e-4)


@pytest.mark.parametrize("T, published", [(16, 0.159), (64, 0.311), (256, 0.576), (1024, 0.886), (4096, 0.998)])
def test_mis_po_band_published(T, published):
    assert theory.geo_band_acceptance(T, 0.05, 0.996, 1.001) == pytest.approx(published, abs=6e-4)


def test_weights_published():
    assert theory.seq_weight_variance(100, 0.05) == pytest.approx(0.284, abs=6e-4)
    assert theory.ess_seq(100, 0.05) == pytest.approx(0.779, abs=6e-4)
    mean, var = theory.seq_tis_moments(256, 0.05, 2.0)
    assert mean == pytest.approx(0.885, abs=6e-4) and var == pytest.approx(0.328, abs=6e-4)
    assert theory.seq_mis_product_mean(256, 0.05, 2.0) == pytest.approx(0.680, abs=6e-4)
    assert theory.drift_weight(1.01, 200) == pytest.approx(7.32, abs=6e-3)
    assert theory.drift_weight(1.05, 200) == pytest.approx(17292, rel=1e-4)


def test_drift_catastrophe_and_cutoff_published():
    w = theory.drift_weight(1.001, np.array([10, 1000, 2000, 5000]))
    assert w == pytest.approx([1.01, 2.72, 7.39, 148], rel=2e-3)  # 7.3817 prints as Li's 7.39 (~e^2)
    assert theory.drift_crossing(1.001, 5.0) == pytest.approx(1610, abs=0.5)
    assert theory.catastrophic_min_length(10, 0.5) == pytest.approx(14.4, abs=0.05)
    assert theory.mis_po_kl_cutoff(0.996, 1.001) == pytest.approx(0.0040, abs=5e-5)


def test_bitchain_published():
    true = theory.bitchain_true_gradient(64, 40, 0.6)
    assert theory.bitchain_token_is_mean(64, 40, 0.6, 0.55) / true == pytest.approx(0.567, abs=6e-4)
    assert theory.bitchain_naive_pg_mean(64, 40, 0.6, 0.55) / true == pytest.approx(0.289, abs=6e-4)
    # on-policy both are the truth
    assert theory.bitchain_token_is_mean(64, 40, 0.6, 0.6) == pytest.approx(true, rel=1e-12)
    assert theory.bitchain_naive_pg_mean(64, 40, 0.6, 0.6) == pytest.approx(true, rel=1e-10)


# ---------------------------------------------------------------------------------------------------------
# shapes, limits, edge values


def test_scalars_give_floats_arrays_give_arrays():
    T = np.array([16, 256, 1024])
    assert isinstance(theory.product_band_acceptance(16, 0.05, 0.5, 2.0), float)
    for f in (theory.product_band_acceptance, theory.geo_band_acceptance, theory.max_band_acceptance):
        out = f(T, 0.05, 0.5, 2.0)
        assert isinstance(out, np.ndarray) and out.shape == (3,)
        assert out == pytest.approx([f(int(t), 0.05, 0.5, 2.0) for t in T])
    mean, var = theory.seq_tis_moments(T, 0.05, 2.0)
    assert mean.shape == var.shape == (3,)
    assert theory.ess_seq(T, 0.05).shape == (3,) and theory.drift_crossing(1.001, np.array([2.0, 5.0])).shape == (2,)
    assert theory.phi(0.0) == 0.5 and theory.phi(np.array([-INF, INF])).tolist() == [0.0, 1.0]


def test_limits():
    # open bands accept everything; C = inf is untruncated sequence IS
    assert theory.product_band_acceptance(4096, 0.1, 0.0, INF) == 1.0
    assert theory.geo_band_acceptance(4096, 0.1, 0.0, INF) == 1.0
    mean, var = theory.seq_tis_moments(100, 0.05, INF)
    assert mean == pytest.approx(1.0) and var == pytest.approx(theory.seq_weight_variance(100, 0.05))
    m, v = theory.seq_mis_product_moments(100, 0.05, INF)
    assert m == pytest.approx(1.0) and v == pytest.approx(theory.seq_weight_variance(100, 0.05))
    # the kept mass of a truncated weight falls towards 0 with length
    T = np.array([16, 256, 4096, 65536])
    assert np.all(np.diff(theory.seq_tis_moments(T, 0.05, 2.0)[0]) < 0)
    assert theory.seq_mis_product_mean(65536, 0.05, 2.0) < 1e-3
    # far in the upper tail the band mass does not cancel to 0
    tail = theory.phi(-(0.1 + 0.01**2 / 2) / 0.01)  # ~1e-23: Phi(hi) - Phi(lo) would round to 0
    assert theory.geo_band_acceptance(1, 0.01, math.exp(0.1), math.exp(0.2)) == pytest.approx(tail, rel=1e-6)
    assert theory.kl_from_s(theory.s_from_kl(0.003)) == pytest.approx(0.003)
    assert theory.chi2_from_s(0.05) == pytest.approx(math.expm1(0.0025))
    assert theory.seq_tis_best_clip(0.0) == pytest.approx(math.sqrt(2))


# ---------------------------------------------------------------------------------------------------------
# against simulation


@pytest.mark.parametrize("T", [16, 256])
def test_product_band_against_simulation(T):
    n, s = 4000, 0.05
    batch = gaussian_batch(n, T, s, seed=T)
    w = rollouts("seq_is", batch)["seq_log_ratio"].exp()  # (n,)
    sim = float(((w >= 0.5) & (w <= 2.0)).double().mean())
    closed = theory.product_band_acceptance(T, s, 0.5, 2.0)
    assert within(sim, closed, math.sqrt(closed * (1 - closed) / n))
    one_sided = float(rollouts("seq_mis_product", batch, seq_clip=2.0)["accepted"].double().mean())
    closed = theory.product_band_acceptance(T, s, 0.0, 2.0)
    assert within(one_sided, closed, math.sqrt(closed * (1 - closed) / n))


@pytest.mark.parametrize("T", [16, 256, 1024])
def test_geo_band_against_simulation(T):
    # MIS-PO's trajectory band at s = 0.05, and a band [0.99, 1.01] that the mean log-ratio -0.005 (s = 0.1) lies in,
    # through every estimator with a geometric gate
    for s, lo, hi, names in ((0.05, 0.996, 1.001, ("seq_mis", "mis_po")), (0.1, 0.99, 1.01, ("geo_mask", "seq_mis"))):
        n = 2000
        batch = gaussian_batch(n, T, s, seed=10 + T)
        closed = theory.geo_band_acceptance(T, s, lo, hi)
        for name in names:
            knobs = {"token_mask_low": 0.0, "token_mask_high": INF} if name == "mis_po" else {}
            sim = float(rollouts(name, batch, geo_mask_low=lo, geo_mask_high=hi, **knobs)["accepted"].double().mean())
            assert within(sim, closed, math.sqrt(closed * (1 - closed) / n)), (name, s)


def test_geometric_band_tends_to_one_or_zero_with_length():
    # -s^2/2 inside (log a, log b) -> 1; outside -> 0: a per-token KL threshold that sharpens with length
    assert float(theory.geo_band_acceptance(4096, 0.1, 0.99, 1.01)) > 0.99
    assert float(theory.geo_band_acceptance(4096, 0.2, 0.99, 1.01)) < 0.01  # -0.02 < log 0.99 = -0.01005
    batch = gaussian_batch(500, 4096, 0.2, seed=7)
    assert float(rollouts("geo_mask", batch, geo_mask_low=0.99, geo_mask_high=1.01)["accepted"].double().mean()) < 0.02


def test_seq_tis_keeps_an_upward_outlier_at_weight_c_and_a_geometric_gate_drops_it():
    l = torch.zeros(1, 8, dtype=torch.float64)
    l[0, 3] = 6.0  # w = e^6, geometric ratio e^0.75 = 2.1 > 2
    batch = Batch(l - 7.0, torch.full_like(l, -7.0), torch.ones(1, dtype=torch.float64))
    assert float(rollouts("seq_tis", batch)["weight"][0]) == 2.0
    assert not bool(rollouts("geo_mask", batch)["accepted"][0])


@pytest.mark.parametrize("T", [4, 16])
def test_token_and_max_band_against_simulation(T):
    # a tight token band so the max criterion rejects a visible fraction
    n, s, lo, hi = 4000, 0.1, 0.9, 1.15
    batch = gaussian_batch(n, T, s, seed=20 + T)
    out = run("mis_po", batch, ESTIMATORS["mis_po"].config(token_mask_low=lo, token_mask_high=hi,
                                                             geo_mask_low=0.0, geo_mask_high=INF))
    token = 1 - float(out.metrics["is_token_masked"])
    closed = theory.token_band_acceptance(s, lo, hi)
    assert within(token, closed, math.sqrt(closed * (1 - closed) / (n * T)))
    every = float(rollouts("max_mask", batch, token_mask_low=lo, token_mask_high=hi)["accepted"].double().mean())
    closed = theory.max_band_acceptance(T, s, lo, hi)
    assert within(every, closed, math.sqrt(closed * (1 - closed) / n))


@pytest.mark.parametrize("T, C", [(64, 2.0), (256, 2.0), (256, 1.5)])
def test_truncated_weight_moments_against_simulation(T, C):
    n, s = 20000, 0.05
    batch = gaussian_batch(n, T, s, seed=30 + T)
    w = rollouts("seq_tis", batch, seq_clip=C)["weight"]  # (n,) min(w_j, C)
    mean, var = theory.seq_tis_moments(T, s, C)
    assert within(float(w.mean()), mean, math.sqrt(var / n))
    assert within(float(w.var()), var, float(((w - w.mean()) ** 2).std()) / math.sqrt(n))
    kept = rollouts("seq_mis_product", batch, seq_clip=C)["weight"]  # (n,) w_j 1(w_j <= C)
    mean, var = theory.seq_mis_product_moments(T, s, C)
    assert mean == pytest.approx(theory.seq_mis_product_mean(T, s, C))
    assert within(float(kept.mean()), mean, math.sqrt(var / n))
    assert within(float(kept.var()), var, float(((kept - kept.mean()) ** 2).std()) / math.sqrt(n))


def test_weight_variance_and_ess_against_simulation():
    n, T, s = 40000, 100, 0.05
    batch = gaussian_batch(n, T, s, seed=40)
    w = rollouts("seq_is", batch)["weight"]  # (n,) untruncated w_j
    var = theory.seq_weight_variance(T, s)
    assert within(float(w.mean()), 1.0, math.sqrt(var / n))
    assert within(float(w.var()), var, float(((w - 1) ** 2).std()) / math.sqrt(n))
    ess = diagnostics(batch)["ess_seq"]  # (sum w)^2 / (n sum w^2) -> 1 / (1 + Var) = e^(-T s^2)
    assert ess == pytest.approx(theory.ess_seq(T, s), abs=0.01)


def test_catastrophic_token_against_the_geometric_gate():
    # one token at l = -10 among on-policy tokens: geo_mask (lower bound 0.5) accepts from T = 14.43 on
    L, low = 10.0, 0.5
    cutoff = theory.catastrophic_min_length(L, low)
    lengths = torch.arange(10, 20)  # rollout j has T_j = lengths[j] loss tokens
    T = int(lengths.max())
    mask = torch.arange(T)[None, :] < lengths[:, None]  # (10, T)
    inference = torch.full((10, T), -1.0, dtype=torch.float64)
    trainer = inference.clone()
    trainer[:, 0] -= L
    batch = Batch(trainer, inference, torch.ones(10, dtype=torch.float64), mask)
    for name in ("geo_mask", "seq_mis"):
        accepted = rollouts(name, batch, geo_mask_low=low, geo_mask_high=2.0)["accepted"]
        assert accepted.tolist() == (lengths.double() >= cutoff).tolist(), name
    assert not rollouts("max_mask", batch)["accepted"].any()  # the max criterion catches it at every length
    # a token band catches it at every length
    kept = run("mis_po", batch, ESTIMATORS["mis_po"].config(geo_mask_low=0.0, geo_mask_high=INF)).masks["kept"]
    assert not bool(kept[:, 0].any())


def test_mis_po_kl_cutoff_against_simulation():
    # long rollouts pass the trajectory band iff the per-token KL s^2/2 is below -log(geo_low)
    cutoff = theory.mis_po_kl_cutoff(0.996, 1.001)
    for kl, expect in ((0.5 * cutoff, 1.0), (2.0 * cutoff, 0.0)):
        batch = gaussian_batch(64, 8192, theory.s_from_kl(kl), seed=50)
        acc = float(rollouts("mis_po", batch, token_mask_low=0.0, token_mask_high=INF)["accepted"].double().mean())
        closed = theory.geo_band_acceptance(8192, theory.s_from_kl(kl), 0.996, 1.001)
        assert closed == pytest.approx(expect, abs=0.01) and acc == pytest.approx(expect, abs=0.05)


def test_drift_against_the_estimators():
    # l_t = log 1.001 on every token: w = 1.001^T exactly; seq_tis at C = 5 starts clipping after T = 1610.24
    r = 1.001
    for T in (10, 1000, 2000, 5000):
        trainer = torch.full((1, T), math.log(r) - 1.0, dtype=torch.float64)
        batch = Batch(trainer, torch.full_like(trainer, -1.0), torch.ones(1, dtype=torch.float64))
        out = rollouts("seq_is", batch)
        assert float(out["weight"][0]) == pytest.approx(theory.drift_weight(r, T), rel=1e-9)
        assert float(out["geo_log_ratio"][0]) == pytest.approx(math.log(r), rel=1e-9)
    crossing = theory.drift_crossing(r, 5.0)
    for T in (math.floor(crossing), math.ceil(crossing)):
        trainer = torch.full((1, T), math.log(r) - 1.0, dtype=torch.float64)
        batch = Batch(trainer, torch.full_like(trainer, -1.0), torch.ones(1, dtype=torch.float64))
        assert bool(rollouts("seq_tis", batch, seq_clip=5.0)["clipped"][0]) == (T > crossing)


def test_bitchain_closed_forms_against_direct_simulation():
    # an independent simulation (no seqis machinery): per-token estimates averaged over tokens and rollouts
    H, k, p, q, n = 64, 40, 0.6, 0.55, 200_000
    g = torch.Generator().manual_seed(60)
    a = (torch.rand(n, H, generator=g, dtype=torch.float64) < q).double()  # (n, H) bits from mu
    R = (a.sum(-1) >= k).double()[:, None]  # (n, 1)
    rho = torch.where(a > 0, torch.tensor(p / q), torch.tensor((1 - p) / (1 - q)))
    w = rho.prod(-1, keepdim=True)  # (n, 1) sequence weight
    for est, closed in (
        ((a - p) * R, theory.bitchain_naive_pg_mean(H, k, p, q)),
        (rho * (a - p) * R, theory.bitchain_token_is_mean(H, k, p, q)),
        (w * (a - p) * R, theory.bitchain_true_gradient(H, k, p)),
    ):
        per_rollout = est.mean(-1)  # (n,) average over the exchangeable tokens
        assert within(float(per_rollout.mean()), closed, float(per_rollout.std()) / math.sqrt(n))


def test_explore_reads_the_closed_form_from_the_composition_not_the_name():
    from seqis import ESTIMATORS, Composition, Criterion, Weight
    from seqis.diagnosis.summaries import theory_rollouts

    T, s = [64, 256, 0], 0.05
    geo = float(np.mean(theory.geo_band_acceptance(np.array([64.0, 256.0]), s, 0.5, 2.0)))
    assert theory_rollouts("seq_mis", None, s, T) == pytest.approx({"rollouts_kept_frac": geo})
    same_gate = Composition(Weight("token", clip=2.0), (Criterion("ratio", "mean", 0.5, 2.0),))  # a custom one
    assert theory_rollouts(same_gate, None, s, T) == pytest.approx({"rollouts_kept_frac": geo})
    cfg = ESTIMATORS["seq_tis"].config(seq_clip=3.0)
    clipped = float(np.mean(1 - theory.product_band_acceptance(np.array([64.0, 256.0]), s, 0.0, 3.0)))
    assert theory_rollouts("seq_tis", cfg, s, T) == pytest.approx({"clipped_frac": clipped})
    every = float(np.mean(theory.max_band_acceptance(np.array([64.0, 256.0]), s, 0.5, 2.0)))
    assert theory_rollouts("max_mask", None, s, T) == pytest.approx({"rollouts_kept_frac": every})
    assert theory_rollouts(Composition(criteria=(Criterion("k3", "mean", high=0.01),)), None, s, T) == {}
    two_gates = Composition(criteria=(Criterion("ratio", "mean", 0.5, 2.0), Criterion("ratio", "sum", 0.5, 2.0)))
    assert theory_rollouts(two_gates, None, s, T) == {}
