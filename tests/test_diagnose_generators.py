"""diagnose on samplers it was not tuned on: every generator of samplers.generators (256 to 32k tokens, three entropy
profiles, rounding of logits, of the whole model or of probabilities), several seeds, each line of issue 24's
"Done when": truncation found with its log offset within 25%, temperatures within 5%, raw log-probs with their
entropy gap within 25%, off-by-one and catastrophic tokens as on the tiny transformer, policy lag named as a
trainer-side mismatch and never as a sampler fault, and no warn or bad on a clean batch."""

import pytest

from seqis import diagnose
from seqis.samplers.generators import GENERATORS, LMGenerator, make, truth

SEEDS = (0, 1)


def cases(seeds=SEEDS):
    """(generator, seed) for every generator and seed; the fast suite keeps seed 0 of the first generator,
    the slow one (make test) adds the other small generators, their other seeds and seed 0 of the 32k-token
    generator (seconds a batch on 2 shared cores; its other seeds are the power bench's)."""
    big = [n for n in GENERATORS if GENERATORS[n]().vocab > 8192]
    first = next(iter(GENERATORS))
    return [pytest.param(n, s) if (n, s) == (first, seeds[0]) else pytest.param(n, s, marks=pytest.mark.slow)
            for n in GENERATORS for s in seeds if s == seeds[0] or n not in big]


SAMPLER_FAULTS = {"sampler_truncation", "temperature_mismatch", "raw_logprobs", "catastrophic_tokens",
                  "token_misalignment"}


def the(findings, kind):
    found = [f for f in findings if f.kind == kind]
    assert found, f"no {kind} among {[(f.kind, f.severity) for f in findings]}"
    return found[0]


def kinds(findings):
    return {f.kind for f in findings}


@pytest.mark.parametrize("fault", ["top_p=0.8", "top_p=0.95", "top_k=V/4"])
@pytest.mark.parametrize("name, seed", cases())
def test_truncation_is_found_with_its_log_offset(name, fault, seed):
    knob, value = fault.split("=")
    value = GENERATORS[name]().vocab // 4 if value == "V/4" else float(value)
    b = make(name, seed=seed, **{knob: value})
    findings = diagnose(b)
    f = the(findings, "sampler_truncation")
    expected = truth(b)["log_offset"]  # the mean log of the mass the sampler kept, per loss token
    assert f.evidence["log_offset"] == pytest.approx(expected, rel=0.25)
    assert f.evidence["ci"][0] < f.evidence["log_offset"] < f.evidence["ci"][1] < 0
    assert f.severity in ("warn", "bad") and not kinds(findings) & {"temperature_mismatch", "raw_logprobs",
                                                                    "policy_lag"}


@pytest.mark.parametrize("tau", [0.7, 0.9, 1.1, 1.3])
@pytest.mark.parametrize("name, seed", cases())
def test_temperature_is_found_within_5_percent(name, tau, seed):
    findings = diagnose(make(name, seed=seed, temperature=tau))
    f = the(findings, "temperature_mismatch")
    assert f.evidence["temperature"] == pytest.approx(tau, rel=0.05)
    assert f.evidence["ci"][0] < f.evidence["temperature"] < f.evidence["ci"][1]
    assert f.severity in ("warn", "bad") and not kinds(findings) & {"sampler_truncation", "raw_logprobs"}


# raw log-probs after a temperature on every case; after a top-p (slow) where it is cheap: on lm_chat32k a gap of
# 0.14 nats needs 5k tokens, a minute of top-p over 32k tokens (the power bench has it)
RAW_CASES = ([pytest.param(*c.values, "temperature=0.8", marks=c.marks) for c in cases()]
             + [pytest.param(*c.values, "top_p=0.9", marks=pytest.mark.slow) for c in cases()
                if GENERATORS[c.values[0]]().vocab <= 8192])


@pytest.mark.parametrize("name, seed, processing", RAW_CASES)
def test_raw_logprobs_are_found_with_their_entropy_gap(name, seed, processing):
    knob, value = processing.split("=")
    b = make(name, seed=seed, report="raw", **{knob: float(value)})
    findings = diagnose(b)
    f = the(findings, "raw_logprobs")
    assert f.evidence["entropy_gap"] == pytest.approx(truth(b)["entropy_gap"], rel=0.25)
    assert f.evidence["entropy_gap"] < 0 and f.severity == "bad"
    assert not kinds(findings) & {"sampler_truncation", "temperature_mismatch", "policy_lag"}


@pytest.mark.parametrize("name, seed", cases())
def test_off_by_one_and_catastrophic_tokens_as_on_the_tiny_transformer(name, seed):
    for shift in (1, -1):
        findings = diagnose(make(name, seed=seed, shift=shift))
        assert findings[0].kind == "token_misalignment" and findings[0].evidence["shift"] == shift
        assert kinds(findings) <= {"token_misalignment", "precision_noise"}  # re-aligned: a clean sampler
    b = make(name, seed=seed, bug_rate=0.01)
    f = the(diagnose(b), "catastrophic_tokens")
    assert f.evidence["count"] == pytest.approx(truth(b)["bug_tokens"], rel=0.2, abs=1)
    assert f.severity in ("warn", "bad")


@pytest.mark.slow  # four training steps before the batch: a dozen batches' work
@pytest.mark.parametrize("name, seed", cases())
def test_policy_lag_names_no_sampler_cause(name, seed):
    b = make(name, seed=seed, lag_steps=4)  # the trainer 4 trust-region steps ahead: per-token KL ~ 1e-3
    assert 3e-4 < truth(b)["kl"] < 1e-2
    findings = diagnose(b)
    assert not kinds(findings) & SAMPLER_FAULTS, [(f.kind, f.message) for f in findings]
    for f in findings:
        if f.kind == "precision_noise":  # not detected at this size: the message claims no cause
            assert "do not tell rounding from" in f.message or "no common format" in f.message


@pytest.mark.slow  # eight training steps of 256 rollouts before the batch (the power bench has the other generators)
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name", ["lm_byte256", "lm_mixed1k"])
def test_policy_lag_is_named_as_a_trainer_side_mismatch_at_256_rollouts(name, seed):
    findings = diagnose(make(name, seed=seed, lag_steps=8, n_prompts=32))  # per-token KL ~6e-3
    f = the(findings, "policy_lag")
    assert f.evidence["gain"] > 0 and f.evidence["ci"][0] > 0 and "trainer side" in f.message
    assert "NeMo-RL" in f.message and not kinds(findings) & SAMPLER_FAULTS


@pytest.mark.parametrize("precision", [dict(), dict(sampler_dtype="fp16"),
                                       pytest.param(dict(rounding="model"), marks=pytest.mark.slow),
                                       pytest.param(dict(rounding="probs"), marks=pytest.mark.slow)])
@pytest.mark.parametrize("name, seed", cases((0, 1, 2)))
def test_clean_batches_raise_no_alarm(name, precision, seed):
    if name == "lm_mixed1k" and precision.get("sampler_dtype") == "fp16":
        precision = dict(sampler_dtype="fp16", rounding="logits")  # its preset rounds probabilities
    findings = diagnose(make(name, seed=seed, **precision))
    assert all(f.severity == "ok" for f in findings), [(f.kind, f.severity, f.message) for f in findings]
    assert kinds(findings) <= {"precision_noise", "healthy"}
    f = the(findings, "precision_noise")
    dtype = precision.get("sampler_dtype", "bf16")
    assert dtype in f.evidence["dtypes"] and f.evidence["dtype"] != ("bf16" if dtype == "fp16" else None)


# issue 24's own cases, on 256-token LMs whose faults have the issue's sizes: the nucleus 0.9 of an LM whose
# branching positions hold most of their mass in a few tokens (true mean log offset about -0.023 per token,
# measured -0.021 to -0.027 over seeds 0-2) and the top-k 20 of a peaked one (about -0.005: -0.005 to -0.008,
# 7.4k tokens); each sampler rounds its logits through bf16
NUCLEUS_LM = LMGenerator(vocab=256, certain_frac=0.5, scale=1.2)
TOP_K_LM = LMGenerator(vocab=256, certain_frac=0.8, scale=0.5, n_prompts=16)
ISSUE_SEEDS = [0, pytest.param(1, marks=pytest.mark.slow), pytest.param(2, marks=pytest.mark.slow)]


@pytest.mark.parametrize("lm, fault, offset", [(NUCLEUS_LM, dict(top_p=0.9), (-0.035, -0.015)),
                                               (NUCLEUS_LM, dict(top_p=0.8), (-0.06, -0.02)),
                                               (TOP_K_LM, dict(top_k=20), (-0.01, -0.003))])
@pytest.mark.parametrize("seed", ISSUE_SEEDS)
def test_the_issues_mild_truncations_are_found(lm, fault, offset, seed):
    b = lm.replace(**fault).make(seed=seed)
    expected = truth(b)["log_offset"]
    assert offset[0] < expected < offset[1]  # the issue's size, not a stronger fault
    findings = diagnose(b)
    f = the(findings, "sampler_truncation")  # was: "precision_noise / healthy"
    assert f.evidence["log_offset"] == pytest.approx(expected, rel=0.25) and f.severity in ("warn", "bad")
    assert "precision_noise" not in kinds(findings)


@pytest.mark.parametrize("tau", [0.7, 1.3])
@pytest.mark.parametrize("seed", ISSUE_SEEDS)
def test_the_issues_temperatures_are_found(tau, seed):
    findings = diagnose(NUCLEUS_LM.replace(temperature=tau).make(seed=seed))
    f = the(findings, "temperature_mismatch")  # 0.7 was: "precision_noise / warn"
    assert f.evidence["temperature"] == pytest.approx(tau, rel=0.05)
    assert "precision_noise" not in kinds(findings)


@pytest.mark.parametrize("seed", ISSUE_SEEDS)
def test_the_issues_clean_fp16_sampler_is_not_called_bf16(seed):
    f = the(diagnose(NUCLEUS_LM.replace(sampler_dtype="fp16").make(seed=seed)), "precision_noise")
    assert f.severity == "ok" and "fp16" in f.evidence["dtypes"] and f.evidence["dtype"] != "bf16"
    g = the(diagnose(NUCLEUS_LM.make(seed=seed)), "precision_noise")  # its bf16 twin
    assert "bf16" in g.evidence["dtypes"] and g.evidence["noise_floor"] > 4 * f.evidence["noise_floor"]


@pytest.mark.parametrize("seed", ISSUE_SEEDS)
def test_the_issues_policy_lag_claims_no_rounding_cause(seed):
    b = NUCLEUS_LM.replace(lag_steps=4, lag_kl=4e-4).make(seed=seed)
    assert 7e-4 < truth(b)["kl"] < 5e-3  # the issue's lag: per-token KL 1.5e-3
    findings = diagnose(b)
    assert not kinds(findings) & SAMPLER_FAULTS
    for f in findings:
        assert "consistent with bf16" not in f.message
        if f.kind == "precision_noise":  # the lag test could not see it at this size: no cause is named
            assert "do not tell rounding from" in f.message and "policy lag" in f.message
