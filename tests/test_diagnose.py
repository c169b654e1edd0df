"""diagnose on the tiny transformer it was first built on: each real sampler fault is named with its evidence, at
several seeds; clean batches are never bad; the statistics behind the findings match their formulas (the
detectors on generators it was not tuned on: tests/test_diagnose_generators.py)."""

import math
import re

import pytest
import torch

from seqis import ESTIMATORS, Batch, Finding, diagnose, run_many
from seqis.core.ratios import Ratios
from seqis.diagnosis.causes import (
    CATASTROPHIC_LOG_RATIO,
    aligned_pairs,
    best_shift,
    cluster_sums,
    clustered_mean,
    clustered_ratio,
    find_shift,
    mismatch_stats,
    rounding_dtype,
    rounding_formats,
    temperature_fit,
    truncation_test,
)
from seqis.diagnosis.summaries import band_shares, correction_fractions, ratio_quantiles
from seqis.samplers.faults import truth
from seqis.samplers.scenarios import make_batch

# seed 0 in the fast suite, seeds 1 and 2 under make test (slow)
SEEDS = (0, *(pytest.param(s, marks=pytest.mark.slow) for s in (1, 2)))
SMALL = dict(n_prompts=4)  # 32 rollouts, about 2,500 loss tokens: about a second per batch


def lm_batch(seed, **fault):
    return make_batch("tiny_lm", seed=seed, **SMALL, **fault)


def the(findings: list[Finding], kind: str) -> Finding:
    found = [f for f in findings if f.kind == kind]
    assert found, f"no {kind} among {[(f.kind, f.severity) for f in findings]}"
    return found[0]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("fault", [dict(top_p=0.9), pytest.param(dict(top_k=20), marks=pytest.mark.slow)])
def test_sampler_truncation_and_its_log_offset(seed, fault):
    b = lm_batch(seed, **fault)
    f = the(diagnose(b), "sampler_truncation")
    expected = truth(b)["log_offset"]  # mean log of the mass the sampler kept, per loss token
    assert expected < 0
    assert f.evidence["log_offset"] == pytest.approx(expected, rel=0.25)
    lo, hi = f.evidence["ci"]
    assert lo < f.evidence["log_offset"] < hi < 0 and f.evidence["kept_mass"] < 1
    assert f.severity in ("warn", "bad")
    assert not any(g.kind == "temperature_mismatch" for g in diagnose(b))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("tau", [0.7, pytest.param(1.25, marks=pytest.mark.slow)])
def test_temperature_mismatch_and_the_temperature(seed, tau):
    b = lm_batch(seed, temperature=tau)
    f = the(diagnose(b), "temperature_mismatch")
    assert f.evidence["temperature"] == pytest.approx(tau, rel=0.05) and f.evidence["uses_entropy"]
    lo, hi = f.evidence["ci"]
    assert lo < f.evidence["temperature"] < hi and f.evidence["r2"] > 0.8
    assert f.severity in ("warn", "bad")
    if tau < 1:  # without the trainer's entropy the fit is on log pi alone: still within 5% for a cooler sampler
        bare = diagnose(Batch(b.trainer_logprobs, b.inference_logprobs, b.advantages, b.loss_mask))
        assert the(bare, "temperature_mismatch").evidence["temperature"] == pytest.approx(tau, rel=0.05)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("shift", [1, pytest.param(-1, marks=pytest.mark.slow)])
def test_token_misalignment_and_the_shift(seed, shift):
    findings = diagnose(lm_batch(seed, shift=shift))
    f = the(findings, "token_misalignment")
    assert f.evidence["shift"] == shift
    assert f.severity == "bad" and findings[0].kind == "token_misalignment"
    # re-aligned, the rest is the clean bf16 sampler: no other cause
    assert {g.kind for g in findings} <= {"token_misalignment", "precision_noise"}


@pytest.mark.parametrize("seed", SEEDS)
def test_catastrophic_tokens_from_a_kernel_bug(seed):
    b = lm_batch(seed, bug_rate=0.005)
    f = the(diagnose(b), "catastrophic_tokens")
    expected = truth(b)["bug_tokens"]  # tokens the bug forced where the trainer gives them < 5%
    assert expected >= 10
    assert f.evidence["count"] == pytest.approx(expected, rel=0.2)
    assert f.evidence["share"] == pytest.approx(f.evidence["count"] / int(b.loss_mask.sum()))
    l = b.trainer_logprobs - b.inference_logprobs
    for row, pos in f.evidence["where"]:  # the worst ones, each a loss token beyond the cut
        assert b.loss_mask[row, pos] and abs(float(l[row, pos])) > CATASTROPHIC_LOG_RATIO


@pytest.mark.parametrize("dtype", ["bf16", pytest.param("fp16", marks=pytest.mark.slow)])
@pytest.mark.parametrize("seed", SEEDS)
def test_clean_samplers_are_precision_noise_consistent_with_their_dtype_and_never_flagged(dtype, seed):
    findings = diagnose(lm_batch(seed, sampler_dtype=dtype))
    f = the(findings, "precision_noise")
    assert dtype in f.evidence["dtypes"]  # the data's range of formats holds the sampler's
    if dtype == "fp16":
        assert "bf16" not in f.evidence["dtypes"]  # 1.6 fp16 unit roundoffs: below what bf16 rounding leaves
    assert all(f.severity == "ok" for f in findings)
    assert findings[-1].kind == "healthy"


def test_by_repeats_per_metadata_value_worst_first():
    b = lm_batch(0, top_k=20)
    b.metadata["env_name"] = ["math" if g % 2 else "code" for g in b.metadata["group_id"]]
    findings = diagnose(b, by="env_name")
    assert {f.group for f in findings} == {None, "math", "code"}
    ranks = [("bad", "warn", "ok").index(f.severity) for f in findings]
    assert ranks == sorted(ranks)
    for env in ("math", "code"):
        rows = [i for i, e in enumerate(b.metadata["env_name"]) if e == env]
        alone = diagnose(b.select(rows))
        mine = [f for f in findings if f.group == env]
        assert [(f.kind, f.severity, f.evidence.get("log_offset")) for f in mine] == \
            [(f.kind, f.severity, f.evidence.get("log_offset")) for f in alone]
    with pytest.raises(ValueError, match="'turn' is not a metadata column.*env_name"):
        diagnose(b, by="turn")


def test_padding_may_hold_anything():
    b = lm_batch(0, top_p=0.9)
    t, i = b.trainer_logprobs.clone(), b.inference_logprobs.clone()
    t[~b.loss_mask], i[~b.loss_mask] = -math.inf, math.nan
    dirty = diagnose(Batch(t, i, b.advantages, b.loss_mask))
    assert [(f.kind, f.evidence.get("log_offset")) for f in dirty] == \
        [(f.kind, f.evidence.get("log_offset")) for f in diagnose(b)]


# ---------------------------------------------------------------------------------------------------------
# the statistics, against their formulas on batches built by hand


def hand_batch(trainer, inference, mask=None):
    trainer, inference = torch.as_tensor(trainer, dtype=torch.float64), torch.as_tensor(inference, dtype=torch.float64)
    return Batch(trainer, inference, torch.zeros(trainer.shape[0], dtype=torch.float64), mask)


def test_mismatch_stats_are_the_frameworks_formulas():
    l = torch.tensor([0.1, -0.2, 0.0, 1.5, -3.0])
    s = mismatch_stats(l)
    assert s["mult_prob_error"] == pytest.approx(sum(math.exp(abs(x)) for x in l.tolist()) / 5, rel=1e-6)
    assert s["kl_k1"] == pytest.approx(-sum(l.tolist()) / 5, rel=1e-6)
    assert s["kl_k3"] == pytest.approx(sum(math.exp(x) - 1 - x for x in l.tolist()) / 5, rel=1e-6)
    assert s["chi2_token"] == pytest.approx(sum(math.exp(2 * x) - 1 for x in l.tolist()) / 5, rel=1e-6)


def exact_sampler(tau=1.0, keep_top=None, contexts=(40, 64), V=50, seed=0, report_raw=False):
    """A batch drawn from exact distributions, written from the formulas: per (rollout, position) a context's
    logits z ~ N(0, 2^2) over V tokens; the trainer's pi = softmax(z), the sampler's mu = softmax(z / tau),
    truncated to its keep_top most likely tokens and renormalised; y ~ mu. Returns the batch with the trainer's
    entropy and the truth (mean log kept mass, mean entropy gap)."""
    B, T = contexts
    g = torch.Generator().manual_seed(seed)
    z = 2 * torch.randn(B, T, V, generator=g, dtype=torch.float64)
    logpi = z.log_softmax(-1)
    logq = (z / tau).log_softmax(-1)
    kept = torch.zeros(B, T, dtype=torch.float64)
    if keep_top is not None:
        cut = logq.topk(keep_top, -1).values[..., -1:]
        kept = logq.masked_fill(logq < cut, -math.inf).logsumexp(-1)  # (B, T) log kept mass
        logq = (logq - kept[..., None]).masked_fill(logq < cut, -math.inf)
    y = torch.multinomial(logq.exp().view(-1, V), 1, generator=g).view(B, T, 1)
    a, b = logpi.gather(-1, y)[..., 0], logq.gather(-1, y)[..., 0]
    if report_raw:
        b = (z / 1.0).log_softmax(-1).gather(-1, y)[..., 0]  # the unprocessed distribution's log-prob
    H = -(logpi.exp() * logpi).sum(-1)
    gap = ((logq.exp() * -logpi).nan_to_num().sum(-1) - H).mean()
    batch = Batch(a, b, torch.zeros(B, dtype=torch.float64), extras={"entropy": H})
    return batch, {"log_offset": float(kept.mean()), "entropy_gap": float(gap)}


@pytest.mark.parametrize("tau", [0.7, 1.3])
def test_temperature_fit_on_exact_tempered_distributions(tau):
    b, _ = exact_sampler(tau=tau)
    p = aligned_pairs(b)
    keep = torch.ones(p.l.numel(), dtype=torch.bool)
    fit = temperature_fit(p, keep)
    lo, hi = fit["ci"]
    assert fit["detected"] and lo < tau < hi and fit["temperature"] == pytest.approx(tau, rel=0.03)
    assert fit["share"] == pytest.approx(1.0, abs=0.1)  # a pure temperature explains the whole divergence
    bare = aligned_pairs(Batch(b.trainer_logprobs, b.inference_logprobs, b.advantages))
    fit = temperature_fit(bare, keep)  # the rho - 1 instrument alone: still consistent, wider
    assert not fit["uses_entropy"] and fit["share"] is None and fit["temperature"] == pytest.approx(tau, rel=0.05)
    clean = temperature_fit(aligned_pairs(exact_sampler(tau=1.0)[0]), keep)
    assert not clean["detected"] and clean["ci"][0] <= 1 <= clean["ci"][1]  # exact: l = 0, ci [1, 1]


def test_truncation_test_on_an_exact_top_k_sampler():
    b, truth_ = exact_sampler(keep_top=10)
    p = aligned_pairs(b)
    t = truncation_test(p, torch.ones(p.l.numel(), dtype=torch.bool))
    # pi / mu = the kept mass on every kept token: the mean of l is the mean log kept mass, exactly
    assert t["detected"] and t["log_offset"] == pytest.approx(truth_["log_offset"], rel=1e-6)
    assert t["kept_mass"] < 1 and t["ci"][0] < t["log_offset"] < t["ci"][1]
    for tau in (0.7, 1.0, 1.3):  # any full-support sampler: E_mu[pi / mu] = 1 whatever its temperature
        full = aligned_pairs(exact_sampler(tau=tau, seed=1)[0])
        t = truncation_test(full, torch.ones(full.l.numel(), dtype=torch.bool))
        assert not t["detected"] and t["kept_mass_ci"][0] <= 1 <= t["kept_mass_ci"][1]


def test_raw_logprobs_on_an_exact_processed_sampler():
    b, truth_ = exact_sampler(tau=0.8, report_raw=True, contexts=(64, 64))
    f = the(diagnose(b), "raw_logprobs")
    assert f.evidence["entropy_gap"] == pytest.approx(truth_["entropy_gap"], rel=0.25) and f.severity == "bad"
    assert f.evidence["entropy_gap"] < 0  # the tokens are sharper than the reported distribution
    processed, _ = exact_sampler(tau=0.8, contexts=(64, 64))  # the processed log-probs reported: a temperature
    assert {f.kind for f in diagnose(processed)} >= {"temperature_mismatch"}
    assert "raw_logprobs" not in {f.kind for f in diagnose(processed)}


def test_clustered_estimates_against_a_loop_over_rollouts():
    g = torch.Generator().manual_seed(5)
    rows = torch.randint(0, 7, (300,), generator=g).sort().values
    x, y = torch.randn(300, generator=g, dtype=torch.float64), torch.rand(300, generator=g, dtype=torch.float64) + 1
    mean, se = clustered_mean(x, rows)
    sums = [float((x[rows == j] - x.mean()).sum()) for j in range(7)]
    assert mean == pytest.approx(float(x.mean())) and se == pytest.approx(math.sqrt(sum(s * s for s in sums)) / 300)
    r, se = clustered_ratio(x, y, rows)
    resid = [float((x[rows == j] - r * y[rows == j]).sum()) for j in range(7)]
    assert r == pytest.approx(float(x.sum() / y.sum()))
    assert se == pytest.approx(math.sqrt(sum(v * v for v in resid)) / float(y.sum()))


def test_cluster_sums_in_order_and_shuffled_against_a_loop():
    # rows in order are summed as runs, any other order scattered: both against a loop; rollout 3 holds nothing
    g = torch.Generator().manual_seed(6)
    rows = torch.tensor([0] * 5 + [1] * 9 + [2] + [4] * 7 + [5] * 3)
    x = torch.randn(rows.numel(), generator=g, dtype=torch.float64)
    loop = torch.tensor([float(x[rows == j].sum()) for j in (0, 1, 2, 4, 5)], dtype=torch.float64)
    assert torch.allclose(cluster_sums(x, rows), loop, rtol=1e-12, atol=1e-12)
    perm = torch.randperm(rows.numel(), generator=g)
    assert torch.allclose(cluster_sums(x[perm], rows[perm]), loop, rtol=1e-12, atol=1e-12)
    assert cluster_sums(x[:0], rows[:0]).numel() == 0


def test_rounding_formats_are_ranges_of_unit_roundoffs():
    assert rounding_formats(2.0**-8) == ["fp16", "bf16"]  # 1 bf16 roundoff is 8 fp16 ones: both in range
    assert rounding_formats(2.0**-11) == ["fp16"] and rounding_dtype(2.0**-11) == "fp16"
    assert rounding_dtype(0.05) == "fp8 or bf16" and rounding_dtype(0.0) == "none (exact)"
    assert rounding_dtype(5.0) == "coarser than fp8" and rounding_dtype(1e-5) == "finer than fp16"


def test_best_shift_finds_an_off_by_one_row_by_row():
    g = torch.Generator().manual_seed(1)
    mu = -torch.rand(8, 64, generator=g) * 4  # (8, 64)
    late = torch.roll(mu, 1, dims=1)  # inference[t] holds mu[t - 1]
    shift, agreement = best_shift(mu, late, torch.ones(8, 64, dtype=torch.bool))
    assert shift == 1 and agreement[1] == 0.0 and agreement[0] > 0.5
    assert best_shift(mu, mu, torch.ones(8, 64, dtype=torch.bool))[0] == 0


# ---------------------------------------------------------------------------------------------------------
# raw ratio statistics and each correction's truncated / masked fractions


def test_find_shift_answers_as_best_shift_does():
    # the count per shift only skips the medians when no shift can win: the same shift as best_shift (and its
    # agreement when it is not 0) on noise, exact shifts, shifts whose median is just under and just over a
    # quarter of the in-place one, a mask with holes, and identical log-probs
    g = torch.Generator().manual_seed(2)
    B, T = 16, 200
    trainer = -torch.rand(B, T, generator=g) * 4
    holes = torch.rand(B, T, generator=g) > 0.1
    cases = [(trainer + 0.05 * torch.randn(B, T, generator=g), None), (trainer.clone(), None)]
    for k in (-2, -1, 1, 2):
        cases.append((torch.roll(trainer, k, dims=1), None))
        cases.append((torch.roll(trainer, k, dims=1), holes))
    in_place = float((trainer - torch.roll(trainer, 1, dims=1)).abs().median())
    for factor in (0.8, 0.95, 0.99, 1.01, 1.05, 1.25):  # partner noise with median factor * in_place / 4
        noise = torch.randn(B, T, generator=g)
        noise *= factor * in_place / 4 / float(noise.abs().median())
        cases.append((torch.roll(trainer, 1, dims=1) + noise, None))
    shifts = set()
    for inference, mask in cases:
        mask = torch.ones(B, T, dtype=torch.bool) if mask is None else mask
        want, agreement = best_shift(trainer, inference, mask)
        got, got_agreement = find_shift(trainer, inference, mask)
        assert got == want and (got_agreement == agreement if want else got_agreement is None)
        shifts.add(want)
    assert shifts == {-2, -1, 0, 1, 2}


def test_ratio_quantiles_and_band_shares():
    l = torch.tensor([[-1.0, 0.0, 0.5, 2.0], [0.1, -0.1, 0.0, 0.0]])
    mask = torch.tensor([[True, True, True, True], [True, True, False, False]])
    r = Ratios.of(hand_batch(l, torch.zeros_like(l), mask))
    q = ratio_quantiles(r)
    assert q.loc["p50", "log_ratio"] == pytest.approx(0.0)  # nearest rank of (-1, -0.1, 0, 0.1, 0.5, 2)
    assert q.loc["p99.9", "ratio"] == pytest.approx(math.exp(2.0))
    shares = band_shares(r)["share_outside"]
    assert shares["[0.5, 2]"] == pytest.approx(2 / 6)  # l = -1 and l = 2 are outside [log 0.5, log 2]
    assert shares["[1e-4, 1e4] (verl veto)"] == 0.0


def test_correction_fractions_against_a_loop_over_rollouts():
    b = make_batch("catastrophic", seed=3, n_rollouts=32, max_len=128, cat_frac=0.01)
    r = Ratios.of(b)
    outs = run_many(list(ESTIMATORS), b, ratios=r)
    table = correction_fractions(outs, r)
    n_tok = int(b.loss_mask.sum())
    for name, out in outs.items():
        kept, clipped = out.masks["kept"], out.masks.get("clipped")
        # "dropped" is no gradient: the rules drop it, or its weight is below 1e-6 x the kept tokens' median weight
        floor = 1e-6 * float(out.weights[kept].double().median()) if bool(kept.any()) else 0.0
        masked = partly = truncated = tok_trunc = negligible = dropped_tokens = 0
        valid = 0
        for j in range(b.shape[0]):
            m = b.loss_mask[j]
            if not m.any():
                continue
            valid += 1
            small = kept[j] & (out.weights[j].double().abs() < floor)
            negligible += int(small.sum())
            dropped = int((m & ~kept[j]).sum()) + int(small.sum())
            dropped_tokens += dropped
            masked += dropped == int(m.sum())
            partly += dropped > 0
            cj = int((clipped[j] & m).sum()) if clipped is not None else 0
            tok_trunc += cj
            truncated += bool(out.rollouts["clipped"][j]) or cj > 0
        row = table.loc[name]
        assert row["tokens_masked"] == pytest.approx(dropped_tokens / n_tok)
        assert row["tokens_negligible"] == pytest.approx(negligible / n_tok)
        if not negligible:  # the rules' own share is the metric
            assert row["tokens_masked"] == pytest.approx(float(out.metrics["is_masked"]), abs=1e-6)
        assert row["tokens_truncated"] == pytest.approx(tok_trunc / n_tok)
        assert row["rollouts_masked"] == pytest.approx(masked / valid)
        assert row["rollouts_partly_masked"] == pytest.approx(partly / valid)
        assert row["rollouts_truncated"] == pytest.approx(truncated / valid)


def test_command_line_prints_the_findings_and_strict_fails_on_bad(capsys):
    import json

    from seqis.__main__ import main
    from seqis.io import ASSETS_DIR

    bug = str(ASSETS_DIR / "tiny_lm_kernel_bug.parquet")
    assert main(["diagnose", bug]) == 0
    out = capsys.readouterr().out
    assert out.startswith("BAD  catastrophic_tokens: count 50")
    assert main(["diagnose", bug, "--strict", "--json", "--by", "reward"]) == 1
    found = json.loads(capsys.readouterr().out)
    assert {f["group"] for f in found} == {None, 0.0, 1.0} and found[0]["kind"] == "catastrophic_tokens"
    assert main(["diagnose", str(ASSETS_DIR / "tiny_lm_fp16.parquet"), "--strict"]) == 0
    assert "dtype fp16" in capsys.readouterr().out  # a clean fp16 sampler is not called bf16


def test_a_temperature_the_slope_cannot_give_is_said_not_estimable():
    # the formatter: a slope s >= 1 has no temperature (tau = 1 / (1 - s) infinite or negative); an interval whose
    # slope reaches 1 has no upper end; never "inf (inf-inf)" (issue 43)
    from seqis.diagnosis.causes import tau_interval, temperature_words

    steep = {"temperature": math.inf, "ci": [math.inf, math.inf], "slope": 1.2, "slope_ci": [1.1, 1.3]}
    said = temperature_words(steep)
    assert said.startswith("temperature not estimable: ") and "+1.200 (95% CI +1.100 to +1.300)" in said
    assert "inf" not in said and "at or above 1" in said
    assert temperature_words({"temperature": 1.05, "ci": [1.02, 1.08], "slope": 0.048, "slope_ci": [0.02, 0.07]},
                             ".3f") == "temperature 1.050 (95% CI 1.020-1.080)"
    assert tau_interval([1.02, math.inf]) == "1.02 to unbounded"
    assert tau_interval([math.nan, math.nan]) == "not estimable"
    # batches that give it: a sampler far hotter than the trainer (tau = 50), fitted without the trainer's entropy,
    # overshoots to a slope of about 1.34 (95% CI above 1): the temperature finding says why there is no number
    hot, _ = exact_sampler(tau=50.0, seed=0)
    f = the(diagnose(Batch(hot.trainer_logprobs, hot.inference_logprobs, hot.advantages)), "temperature_mismatch")
    assert "not estimable" in f.message and "at slope +1.3" in f.message and "infx" not in f.message
    assert "inf-inf" not in f.message and f.evidence["temperature"] == math.inf
    # an inverted sampler (mu = softmax(-z)): no sampler fault fires, and the tests' summary in the remaining
    # finding says the temperature is not estimable instead of "temperature inf (0.580-inf)"
    inverted, _ = exact_sampler(tau=-1.0, seed=1)
    f = the(diagnose(Batch(inverted.trainer_logprobs, inverted.inference_logprobs, inverted.advantages)),
            "precision_noise")
    assert "temperature not estimable: the log-ratio's slope on log pi is +1.0" in f.message
    assert "temperature inf" not in f.message
    # where the slope is below 1 the finding gives the temperature and its interval, as before
    f = the(diagnose(hot), "temperature_mismatch")  # with the entropy: a slope of about 0.92, tau about 13
    assert math.isfinite(f.evidence["temperature"]) and all(math.isfinite(x) for x in f.evidence["ci"])
    assert re.match(r"The sampler runs at [\d.]+x the trainer's temperature \(95% CI [\d.]+-[\d.]+;", f.message)
