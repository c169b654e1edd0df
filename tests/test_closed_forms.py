"""seqis.theory.closed_forms: every estimator's and preset's closed form, read from its composition, agrees with the
estimator itself on seeded valid-IS-noise batches (4 standard errors plus a small slack), and with the theory
function it names; compositions it does not cover get None.

One float64 batch per (T, s), all keys through one run_many. A failing seed may be bumped once, never twice.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from seqis import ESTIMATORS, PRESETS, Composition, Criterion, Weight, run_many
from seqis.registry import needs_head
from seqis.theory import acceptance
from seqis.theory import formulas as theory
from seqis.theory.closed_forms import closed_form

N = 4000
# (T, s): sigma^2 = T s^2 of 0.16-0.64, where the sequence weight's variance is still estimable from N rollouts
POINTS = [(16, 0.1), (256, 0.05), (64, 0.1)]
CUSTOM = {  # rules at bands where acceptance is far from 0 and 1 at these points
    "geometric band": Composition(criteria=(Criterion("ratio", "mean", 0.99, 1.003),)),
    "sum band": Composition(criteria=(Criterion("ratio", "sum", 0.6, 1.5),)),
    "every token's band": Composition(criteria=(Criterion("ratio", "max", high=1.25),
                                                Criterion("ratio", "min", low=0.85))),
    "product mask": Composition(Weight("sequence", band=(0.0, 1.2))),
    "sequence clip": Composition(Weight("sequence", clip=1.1)),
}
KEYS = [*ESTIMATORS, *(k for k in PRESETS if not needs_head(k)), *CUSTOM]  # no closed form reads a head


def _x(key):
    return CUSTOM.get(key, key)


COVERED = [k for k in KEYS if closed_form(_x(k), None, [16], 0.1) is not None]


@pytest.mark.parametrize("T, s", POINTS)
def test_coverage_does_not_depend_on_the_point(T, s):
    assert [k for k in KEYS if closed_form(_x(k), None, [T], s) is not None] == COVERED
    assert len(COVERED) >= len(KEYS) // 2  # most corrections have one (the others: sign-conditioned or k2 / k3 rules)


@pytest.fixture(scope="module", params=POINTS, ids=[f"T{T}-s{s}" for T, s in POINTS])
def simulated(request):
    """(T, s, {key: rollouts}) for every key on one seeded batch."""
    T, s = request.param
    batch = acceptance.gaussian_batch(N, T, s, seed=T, dtype=torch.float64)
    outs = run_many([_x(k) for k in COVERED], batch)
    return T, s, {k: outs[_x(k)].rollouts for k in COVERED}


def _close(sim: float, exact: float, se: float, what: str):
    assert abs(sim - exact) <= 4 * se + 2e-3, f"{what}: simulated {sim:.5f} (se {se:.5f}), closed form {exact:.5f}"


@pytest.mark.parametrize("key", COVERED)
def test_closed_form_agrees_with_the_estimator(simulated, key):
    T, s, rollouts = simulated
    form = closed_form(_x(key), None, [T], s)
    r = rollouts[key]
    if form.accepted is not None:
        acc = float(form.accepted[0])
        _close(r["accepted"].double().mean().item(), acc, math.sqrt(acc * (1 - acc) / N), f"{key} accepted")
    if form.clipped is not None:
        p = float(form.clipped[0])
        _close(r["clipped"].double().mean().item(), p, math.sqrt(p * (1 - p) / N), f"{key} clipped")
    w = r["weight"].double()  # (N,) applied rollout weight
    dev = w - w.mean()
    var = dev.square().sum().item() / (N - 1)
    if form.weight_mean is not None:
        _close(w.mean().item(), float(form.weight_mean[0]), math.sqrt(var / N), f"{key} weight mean")
    if form.weight_var is not None:
        se = math.sqrt(max(dev.pow(4).mean().item() - var * var, 0.0) / N)
        _close(var, float(form.weight_var[0]), se, f"{key} weight variance")


def test_the_literature_estimators_are_covered_and_name_their_theory():
    T, s = np.array([16.0, 256.0, 1024.0]), 0.05
    spec = ESTIMATORS
    seq_mis = spec["seq_mis"].config(geo_mask_low=0.9, geo_mask_high=1.1)
    assert closed_form("seq_mis", seq_mis, T, s).accepted == pytest.approx(theory.geo_band_acceptance(T, s, 0.9, 1.1))
    geo = closed_form("geo_mask", None, T, s)
    assert geo.accepted == pytest.approx(theory.geo_band_acceptance(T, s, 0.5, 2.0))
    assert geo.weight_mean == pytest.approx(geo.accepted)  # 0/1 weights
    mis_po = closed_form("mis_po", None, T, s)  # the trajectory band's; the token band drops tokens, not rollouts
    assert mis_po.accepted == pytest.approx(theory.geo_band_acceptance(T, s, 0.996, 1.001))
    assert mis_po.weight_mean is None  # its weight is the kept fraction of tokens
    tis = closed_form("seq_tis", spec["seq_tis"].config(seq_clip=3.0), T, s)
    assert tis.accepted is None  # nothing drops a rollout
    mean, var = theory.seq_tis_moments(T, s, 3.0)
    assert tis.weight_mean == pytest.approx(mean) and tis.weight_var == pytest.approx(var)
    assert tis.clipped == pytest.approx(1 - theory.product_band_acceptance(T, s, 0.0, 3.0))
    prod = closed_form("seq_mis_product", None, T, s)
    assert prod.accepted == pytest.approx(theory.product_band_acceptance(T, s, 0.0, 2.0))
    assert prod.weight_mean == pytest.approx(theory.seq_mis_product_mean(T, s, 2.0))
    assert closed_form("seq_is", None, T, s).weight_var == pytest.approx(theory.seq_weight_variance(T, s))
    assert closed_form("max_mask", None, T, s).accepted == pytest.approx(theory.max_band_acceptance(T, s, 0.5, 2.0))
    assert closed_form("pg", None, T, s).weight_var == pytest.approx(np.zeros(3))


def test_uncovered_compositions_get_none_or_no_field():
    T, s = [64], 0.05
    assert closed_form("prime-rl/dppo", None, T, s) is None  # conditioned on the advantage's sign
    ipo = closed_form("prime-rl/default", None, T, s)  # IPO: token rules on the probability difference only
    assert ipo.accepted is None and ipo.clipped is None and ipo.weight_mean is None
    assert closed_form(Composition(criteria=(Criterion("k3", "mean", high=0.01),)), None, T, s) is None
    two_gates = Composition(criteria=(Criterion("ratio", "mean", 0.5, 2.0), Criterion("ratio", "sum", 0.5, 2.0)))
    assert closed_form(two_gates, None, T, s) is None
    assert closed_form("icepop", None, T, s) == closed_form("token_tis", None, T, s)  # token rules / weights only
    assert closed_form("icepop", None, T, s).accepted is None
    clamped = closed_form("verl/bypass_pg_is", None, T, s)  # verl's +-20 clamp: moments not covered
    assert clamped is None or clamped.weight_mean is None


def test_every_seed_estimator_has_a_closed_form():
    for name in ("seq_tis", "seq_mis", "geo_mask", "mis_po", "seq_mis_product"):
        form = closed_form(name, None, [64], 0.05)
        assert form is not None and (form.accepted is not None or form.weight_mean is not None), name
