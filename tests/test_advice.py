"""seqis.advice: the batch's facts match the closed forms, each reading follows its composition (never its
name), and the suggestion follows the stated order (token-level rules first when catastrophic tokens are present,
then a per-rollout IS weight)."""

import math

import pytest

from seqis import ESTIMATORS, run_many
from seqis.advice import advise, batch_facts, regime
from seqis.fast import Ratios
from seqis.registry import resolve
from seqis.summaries import effective_batch
from seqis.synthetic import make_batch

SHOWN = ["seq_tis", "seq_mis", "geo_mask", "mis_po", "pg", "seq_is", "token_tis", "max_mask"]


@pytest.fixture(scope="module")
def gaussian():
    return make_batch("gaussian", seed=0, n_rollouts=256, max_len=1024, s=0.05)


def test_facts_read_the_per_token_kl_and_the_lengths(gaussian):
    f = batch_facts(gaussian)
    assert f["kl"] == pytest.approx(0.05**2 / 2, rel=0.1)  # l ~ N(-s^2/2, s^2): KL = s^2 / 2
    assert f["s"] == pytest.approx(0.05, rel=0.05)
    r = Ratios.of(gaussian)
    lengths = r.length[r.length > 0].float()
    assert f["length_max"] == float(lengths.max())
    assert f["length_p50"] == pytest.approx(float(lengths.median()), abs=1.0)
    assert f["catastrophic"] == 0


def test_regime_quotes_the_measured_engine_ranges():
    assert "H20" in regime(7e-4) and "L20" in regime(5e-3) and "A100" in regime(0.05)


def test_readings_are_the_estimators_own_outputs(gaussian):
    a = advise(gaussian, SHOWN)
    outs = run_many(SHOWN, gaussian)
    for reading in a.readings:
        eff = effective_batch(outs[reading.name])
        assert reading.tokens_kept == eff["tokens_kept_frac"] and reading.ess == eff["ess_frac"]
        assert reading.description == resolve(reading.name).describe()


def test_a_valid_is_batch_starts_from_a_per_rollout_weight(gaussian):
    a = advise(gaussian, SHOWN)
    assert resolve(a.suggestion).weight.per_rollout
    assert a.knobs == dict(ESTIMATORS[a.suggestion].config().as_dict())
    best = max((r for r in a.readings if resolve(r.name).weight.per_rollout and r.tokens_kept >= 0.5),
               key=lambda r: r.ess * r.tokens_kept)
    assert a.suggestion == best.name


def test_catastrophic_tokens_call_for_a_token_level_rule():
    b = make_batch("catastrophic", seed=0, n_rollouts=128, max_len=512)
    a = advise(b, SHOWN)
    assert a.facts["catastrophic"] > 0
    comp = resolve(a.suggestion)
    assert any(c.statistic == "ratio" and c.agg in ("token", "max", "min") for c in comp.criteria) or (
        comp.weight.band is not None and not comp.weight.per_rollout)


def test_a_geometric_band_below_the_batchs_kl_says_long_rollouts_go():
    b = make_batch("gaussian", seed=1, n_rollouts=128, max_len=2048, s=0.1)  # KL 0.005 > MIS-PO's 0.004
    mis_po = next(r for r in advise(b, ["mis_po"]).readings)
    cutoff = -math.log(ESTIMATORS["mis_po"].config().geo_mask_low)
    assert any(f"KL cutoff of {cutoff:.2g}" in w and "long rollouts are rejected" in w for w in mis_po.why)


def test_a_preset_key_is_read_from_its_composition(gaussian):
    a = advise(gaussian, ["seq_tis", "verl/bypass_pg_geo_rs"])
    assert [r.name for r in a.readings] == ["seq_tis", "verl/bypass_pg_geo_rs"]
