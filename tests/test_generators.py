"""samplers.generators: the recurrent LMs the diagnosis was not tuned on. Each preset is reproducible, differs from the
others where it should, rounds through bf16 by default, and reports the truth its sampler knows; with an fp32
sampler the identities behind the detectors hold exactly (truncation: l = log kept mass on every token)."""

import math

import pytest
import torch

from seqis.samplers.generators import GENERATORS, LMGenerator, make, truth
from seqis.samplers.scenarios import make_batch

SMALL = dict(n_prompts=2)  # 16 rollouts: a few hundred tokens, well under a second


def test_presets_differ_in_vocabulary_profile_and_rounding():
    cfgs = [c() for c in GENERATORS.values()]
    assert {c.vocab for c in cfgs} >= {256, 32768} and len({c.vocab for c in cfgs}) == len(cfgs)
    assert {c.profile for c in cfgs} == {"peaked", "zipf", "flat"}
    assert {c.rounding for c in cfgs} == {"logits", "model", "probs"}
    assert {c.sampler_dtype for c in cfgs} == {"bf16"}  # as real samplers do
    assert "tiny_lm" not in GENERATORS


@pytest.mark.parametrize("name", list(GENERATORS))
def test_a_seed_gives_the_same_batch_and_another_seed_another(name):
    a, b = make(name, seed=3, **SMALL), make(name, seed=3, **SMALL)
    assert torch.equal(a.trainer_logprobs, b.trainer_logprobs) and torch.equal(a.inference_logprobs,
                                                                              b.inference_logprobs)
    c = make(name, seed=4, **SMALL)
    assert a.trainer_logprobs.shape != c.trainer_logprobs.shape or not torch.equal(a.trainer_logprobs,
                                                                                  c.trainer_logprobs)
    m = a.loss_mask
    assert bool((a.trainer_logprobs[m] <= 0).all()) and bool((a.inference_logprobs[m] <= 0).all())
    assert {"entropy", "token_ids"} <= set(a.extras) and a.metadata["group_id"][:9] == [0] * 8 + [1]


@pytest.mark.parametrize("name", list(GENERATORS))
def test_the_default_sampler_rounds_through_bf16_and_an_fp32_one_agrees(name):
    bf16 = make(name, seed=0, **SMALL)
    l = (bf16.trainer_logprobs - bf16.inference_logprobs)[bf16.loss_mask]
    assert 1e-4 < float(l.abs().max()) < 0.5  # rounding, not a fault
    fp32 = make(name, seed=0, sampler_dtype="fp32", **SMALL)
    l32 = (fp32.trainer_logprobs - fp32.inference_logprobs)[fp32.loss_mask]
    assert float(l32.abs().max()) < 1e-4


@pytest.mark.parametrize("name", ["lm_byte256", "lm_mixed1k"])
def test_with_the_trainers_own_distribution_truncation_is_the_log_kept_mass_on_every_token(name):
    # fp32 sampler: its untruncated distribution is the trainer's, so pi / mu = Z (the kept mass) exactly
    for fault in (dict(top_p=0.9), dict(top_k=GENERATORS[name]().vocab // 4)):
        b = make(name, seed=1, sampler_dtype="fp32", **fault, **SMALL)
        l = torch.where(b.loss_mask, b.trainer_logprobs - b.inference_logprobs, 0.0).sum(-1)  # (B,)
        assert l.tolist() == pytest.approx(b.metadata["kept_log_mass"], abs=1e-3)
        assert truth(b)["log_offset"] < -0.005


def test_truth_of_the_kernel_bug_the_raw_logprobs_and_the_lag():
    bug = make("lm_mixed1k", seed=0, bug_rate=0.02, **SMALL)
    assert truth(bug)["bug_tokens"] >= 3
    raw = make("lm_mixed1k", seed=0, temperature=0.8, report="raw", **SMALL)
    l = (raw.trainer_logprobs - raw.inference_logprobs)[raw.loss_mask]
    assert float(l.abs().max()) < 0.5 and truth(raw)["entropy_gap"] < -0.1  # agree, yet sharper tokens
    lag = make("lm_mixed1k", seed=0, lag_steps=2, **SMALL)
    assert 1e-4 < truth(lag)["kl"] < 1e-2  # a couple of trust-region steps of 2e-4 each, compounding


def test_the_generators_are_model_scenarios_of_make_batch():
    b = make_batch("lm_byte256", seed=0, top_p=0.9, **SMALL)
    assert truth(b)["log_offset"] < 0 and b.loss_mask.shape[0] == 16


@pytest.mark.parametrize("bad, match", [(dict(top_p=1.5), "top_p must be in"),
                                        (dict(top_k=1024), "top_k must be below"),
                                        (dict(shift=3), "shift must be in"), (dict(bug_rate=2.0), "bug_rate"),
                                        (dict(rounding="probs", sampler_dtype="fp16"), "flush probabilities"),
                                        (dict(profile="spiky"), "profile must be one of")])
def test_knob_validation_names_the_knob(bad, match):
    with pytest.raises(ValueError, match=match):
        LMGenerator(**bad)


def test_an_unknown_generator_lists_the_known_ones():
    with pytest.raises(ValueError, match="lm_byte256"):
        make("lm_nope")


def test_entropy_is_the_trainers_and_the_gap_truth_is_its_formula():
    b = make("lm_byte256", seed=2, temperature=0.8, report="raw", **SMALL)
    m = b.loss_mask
    H = b.extras["entropy"][m]
    assert bool((H >= 0).all()) and bool((H <= math.log(256) + 1e-4).all())
    # the mean of -log pi(y) - H over the tokens estimates the truth (its expectation per context)
    gap = float((-b.trainer_logprobs[m] - H).mean())
    assert gap == pytest.approx(truth(b)["entropy_gap"], abs=0.15)
