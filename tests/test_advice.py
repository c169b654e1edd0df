"""seqis.diagnosis.advice: the batch's facts match the closed forms, each reading follows its composition (never its
name), and the suggestion follows the stated order (token-level rules first when catastrophic tokens are present,
then a per-rollout IS weight)."""

import math

import pytest
import torch

from seqis import ESTIMATORS, run_many
from seqis.core.ratios import Ratios
from seqis.diagnosis.advice import advise, batch_facts, regime
from seqis.diagnosis.summaries import effective_batch, effectively_kept
from seqis.registry import resolve
from seqis.samplers.scenarios import make_batch

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
    for reading in a.readings:  # a fitted reading is its estimator at the fitted knobs
        cfg = type(ESTIMATORS[reading.name].config())(**reading.knobs)
        eff = effective_batch(outs[reading.name] if not reading.fitted else run_many([(reading.name, cfg)],
                                                                                       gaussian)[reading.name])
        assert reading.tokens_kept == eff["tokens_kept_frac"] and reading.ess == eff["ess_frac"]
        assert reading.description == resolve(reading.name, cfg).describe()


def test_a_valid_is_batch_starts_from_a_per_rollout_weight(gaussian):
    a = advise(gaussian, SHOWN)
    assert resolve(a.suggestion).weight.per_rollout
    assert a.knobs == dict(ESTIMATORS[a.suggestion].config().as_dict())
    best = max((r for r in a.readings if resolve(r.name).weight.per_rollout and r.tokens_kept >= 0.5),
               key=lambda r: r.ess * r.tokens_kept)
    assert a.suggestion == best.name


def test_catastrophic_tokens_lose_their_gradient_under_the_suggestion():
    # a catastrophic token makes its rollout outlying (seqis.diagnosis.fit): the suggestion, at its knobs, drops
    # every token with |l| > log 10 (by a token rule, or with its rollout)
    b = make_batch("catastrophic", seed=0, n_rollouts=128, max_len=512)
    a = advise(b, SHOWN)
    assert a.facts["catastrophic"] > 0 and a.outliers
    cfg = type(ESTIMATORS[a.suggestion].config())(**a.knobs)
    kept = effectively_kept(run_many([(a.suggestion, cfg)], b)[a.suggestion])
    l = Ratios.of(b).log_ratio
    assert not bool((kept & b.loss_mask & (l.abs() > math.log(10))).any())


def test_a_geometric_band_below_the_batchs_kl_says_long_rollouts_go():
    b = make_batch("gaussian", seed=1, n_rollouts=128, max_len=2048, s=0.1)  # KL 0.005 > MIS-PO's 0.004
    mis_po = next(r for r in advise(b, ["mis_po"]).readings)
    cutoff = -math.log(ESTIMATORS["mis_po"].config().geo_mask_low)
    assert any(f"KL cutoff of {cutoff:.2g}" in w and "long rollouts are rejected" in w for w in mis_po.why)


def test_a_preset_key_is_read_from_its_composition(gaussian):
    a = advise(gaussian, ["seq_tis", "verl/bypass_pg_geo_rs"])
    assert [r.name for r in a.readings] == ["seq_tis", "verl/bypass_pg_geo_rs"]


def test_a_few_catastrophic_tokens_cannot_swamp_the_kl_that_steers_the_advice():
    # the case: the catastrophic scenario's mean k3 is ~2.5e7 nats from 62 tokens with |l| up to 27
    b = make_batch("catastrophic", seed=0)
    f = batch_facts(b)
    assert f["kl_mean"] > 1e6 and f["kl"] < 1e-3 and f["kl_left_out"] == f["catastrophic"] == 62
    # the trimmed figure by hand: the mean of rho - 1 - l over the tokens with |l| <= log 10 (p99 is below it)
    l = Ratios.of(b).log_ratio[b.loss_mask].double()
    bulk = l[l.abs() <= math.log(10)]
    assert f["kl"] == pytest.approx(float((bulk.exp() - 1 - bulk).mean()), rel=1e-9)
    a = advise(b)
    assert a.regime.startswith("per-token KL 0.0002 nats (mean k3 over the 50,954 loss tokens within 10x; with the 62 "
                               "beyond it the mean is 2.5e+07)") and "A100" not in a.regime
    assert any("62 tokens off by more than 10x raise the mean per-token KL" in c for c in a.caveats)
    for r in a.readings:  # a band said to reject long rollouts is not one that keeps them all here
        for why in r.why:
            assert not ("long rollouts are rejected" in why and r.rollouts_kept > 0.99), (r.name, why)


def test_the_trimmed_kl_leaves_out_at_most_one_percent():
    # a batch where 5% of the tokens are off by more than 10x: that is the mismatch, not a few outliers
    b = make_batch("gaussian", seed=1, n_rollouts=64, max_len=256, s=0.05)
    n = int(b.loss_mask.sum())
    hit = torch.zeros_like(b.loss_mask).view(-1)
    hit[b.loss_mask.view(-1).nonzero().squeeze(1)[:: 20]] = True  # every 20th loss token
    hit = hit.view(b.shape)
    off = 2.5 + torch.rand(b.shape, generator=torch.Generator().manual_seed(0))  # l of 2.5 to 3.5: over log 10
    il = torch.where(hit, b.trainer_logprobs - off, b.inference_logprobs)
    f = batch_facts(type(b)(b.trainer_logprobs, il, b.advantages, b.loss_mask))
    assert f["catastrophic"] > 0.04 * n and f["kl_left_out"] <= 0.011 * n  # the 99th percentile is the edge
    assert f["kl"] > 0.5  # k3 of l = 3 is 16: 5% of the tokens give most of the KL, and stay in it


def test_clean_batches_trim_nothing(gaussian):
    f = batch_facts(gaussian)
    assert f["kl_left_out"] == 0 and f["kl"] == pytest.approx(f["kl_mean"], rel=1e-6)
    assert f"(mean k3 over all {int(f['n_tokens']):,} loss tokens)" in regime(f["kl"], f)


def test_a_batch_without_loss_tokens_is_refused():
    b = make_batch("gaussian", seed=0, n_rollouts=4, max_len=32)
    empty = type(b)(b.trainer_logprobs, b.inference_logprobs, b.advantages, torch.zeros(b.shape, dtype=torch.bool))
    with pytest.raises(ValueError, match="no loss tokens"):
        advise(empty)


def test_a_token_rule_says_whether_it_drops_single_tokens_or_whole_rollouts_with_its_real_edges():
    # issue 43: max_mask's two rules (max_t rho_t <= 2, min_t rho_t >= 0.5) are one band [0.5, 2] that rejects a
    # whole rollout, not "a token band [0, 2] that drops single tokens"; mis_po's and icepop's token bands drop
    # single tokens. Read from the composition (no name branches): a changed config changes the edges said.
    b = make_batch("catastrophic", seed=0, n_rollouts=64, max_len=256)
    tight = ESTIMATORS["max_mask"].config(token_mask_low=0.8, token_mask_high=1.25)
    a = advise(b, ["max_mask", "mis_po", "icepop"])
    readings = {r.name: r for r in a.readings if not r.fitted}
    assert a.facts["catastrophic"] > 0
    hits = f"(this batch has {a.facts['catastrophic']:.0f} tokens with |l| > log 10)"

    max_mask = readings["max_mask"]
    (said,) = [w for w in max_mask.why if "ratio outside" in w]
    assert said == ("it rejects a whole rollout when any one of its tokens has a ratio outside [0.5, 2], whatever "
                    f"its length (here it keeps {max_mask.rollouts_kept:.0%} of the rollouts) {hits}")
    assert not any("token band" in w or "single tokens" in w or "[0, 2]" in w for w in max_mask.why)
    assert max_mask.catches_single_tokens  # one catastrophic token still trips it, taking its rollout
    (tighter,) = advise(b, [("max_mask", tight)]).readings
    assert any("ratio outside [0.8, 1.25]" in w for w in tighter.why)

    mis_po = readings["mis_po"]
    assert f"its token band [0.5, 2] drops single tokens outside it {hits}" in mis_po.why
    assert any(w.startswith("its geometric band [0.996, 1.001]") for w in mis_po.why)
    assert not any("whole rollout" in w for w in mis_po.why)

    icepop = readings["icepop"]
    assert f"its token band [0.5, 5] drops single tokens outside it {hits}" in icepop.why
    assert not any("whole rollout" in w for w in icepop.why)
