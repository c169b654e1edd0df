"""Issue 45, fp8-like rounding: a temperature under e4m3 logit rounding (a relative error up to 2^-4, a nat on a logit
of 20) is still a temperature. With the trainer's entropy the fit is unbiased whatever the rounding (its instrument
rho (a + H) weighs the tokens as the trainer would draw them, independently of the rounding); the rounding only
lowers the share of l's variance the line explains, so the detector asks whether what is left is the format's
rounding (`_residual_growth`). Two generators: `random_next_token` (peaked, a continuous entropy profile) and
`ZipfNextToken` below (every position branching, Zipf tails, entropy 0.4-2.4 nats), neither tuned on."""

import functools
import math
from dataclasses import dataclass

import pytest
import torch

from seqis import Batch, diagnose
from seqis.diagnosis.detectors import _residual_growth
from seqis.diagnosis.levels import ROUNDING_GROWTH
from seqis.samplers.random_next_token import RandomNextToken

SAMPLER_FAULTS = {"temperature_mismatch", "sampler_truncation", "raw_logprobs", "token_misalignment"}


@dataclass(frozen=True)
class ZipfNextToken(RandomNextToken):
    """Random next-token models with Zipf tails: each position ranks the vocabulary at random and gives rank r the
    logit -2 alpha log r (alpha ~ U(0.7, 2.0)), the largest logit ~ U(12, 28). No near-certain positions: the
    entropy profile is unlike random_next_token's (there 40% of positions are under 0.1 nats)."""

    def _logits(self, B: int, C: int, g: torch.Generator) -> torch.Tensor:
        alpha = 0.7 + 1.3 * torch.rand(B, C, 1, generator=g)
        ranks = torch.argsort(torch.rand(B, C, self.vocab, generator=g), -1).float() + 1  # (B, C, V) a permutation
        z = -2 * alpha * ranks.log()
        return z - z.amax(-1, keepdim=True) + 12 + 16 * torch.rand(B, C, 1, generator=g)


GENERATORS = {"random_next_token": RandomNextToken, "zipf": ZipfNextToken}


@functools.lru_cache(maxsize=4)
def batch(generator: str, tau: float, seed: int = 2) -> Batch:
    return GENERATORS[generator](vocab=512, sampler_format="fp8", temperature=tau).make(seed)


def bare(b: Batch) -> Batch:
    return Batch(b.trainer_logprobs, b.inference_logprobs, b.advantages, b.loss_mask, b.metadata, {})


def test_the_zipf_generator_has_another_entropy_profile():
    b = batch("zipf", 1.3)
    h = b.extras["entropy"][b.loss_mask]
    assert float((h < 0.1).double().mean()) < 0.02 and 0.5 < float(h.median()) < 1.5


@pytest.mark.parametrize("generator", list(GENERATORS))
@pytest.mark.parametrize("tau", [0.7, 1.3])
def test_an_fp8_temperature_is_found_within_5_percent_with_the_entropy(generator, tau):
    """Before: the line explained 12-80% of l's variance (< 80%) and the verdict was precision noise."""
    found = {f.kind: f for f in diagnose(batch(generator, tau))}
    assert "temperature_mismatch" in found and "precision_noise" not in found, list(found)
    ev = found["temperature_mismatch"].evidence
    assert ev["temperature"] == pytest.approx(tau, rel=0.05)
    assert ev["ci"][0] < ev["temperature"] < ev["ci"][1]


@pytest.mark.xfail(strict=True, reason="not identified without the entropy: one moment, E_mu[(rho - 1) l] = "
                   "s E_mu[(rho - 1) a] + sigma^2 E_mu[1 - mu], kills the per-context log-partition, and the "
                   "rounding's sigma^2 depends on the logits' absolute size, which log-probs do not carry (the fit "
                   "lands 12-20% out)")
@pytest.mark.parametrize("tau", [0.7, 1.3])
def test_an_fp8_temperature_without_the_entropy_is_found_within_5_percent(tau):
    found = {f.kind: f for f in diagnose(bare(batch("random_next_token", tau)))}
    assert found["temperature_mismatch"].evidence["temperature"] == pytest.approx(tau, rel=0.05)


@pytest.mark.parametrize("tau", [0.7, 1.3])
def test_without_the_entropy_what_is_said_holds_the_fp8_temperature(tau):
    """Before: the bare fit's interval (0.51-0.57 for 0.7, 1.44-1.49 for 1.3) excluded the sampler's temperature. The
    rounding pushes the bare fit away from 1, so the stated interval runs on to 1 and the finding says so."""
    findings = diagnose(bare(batch("random_next_token", tau)))
    said = next(f for f in findings if f.kind in ("temperature_mismatch", "precision_noise"))
    lo, hi = said.evidence["temperature_interval"]
    assert lo <= tau <= hi and min(abs(lo - 1), abs(hi - 1)) < 1e-12
    if said.kind == "temperature_mismatch":
        assert "pushes it away from 1: the sampler's temperature is between it and 1" in said.message
    else:
        assert "A temperature in" in said.message and "cannot be ruled out with 96 rollouts" in said.message


@pytest.mark.parametrize("fmt", ["fp8", pytest.param("bf16", marks=pytest.mark.slow)])
def test_clean_samplers_raise_no_sampler_fault_over_seeds(fmt):
    """8 seeds x (with, without the entropy) per format, 32 rollouts of 50-150 tokens, both generators."""
    alarms = []
    for name, gen in GENERATORS.items():
        for seed in range(8):
            b = gen(vocab=256, n_rollouts=32, max_len=150, sampler_format=fmt).make(2000 + seed)
            for with_entropy, x in ((True, b), (False, bare(b))):
                kinds = {f.kind for f in diagnose(x)} & SAMPLER_FAULTS
                alarms += [(name, seed, with_entropy, sorted(kinds))] if kinds else []
    assert alarms == []


def growth_reference(resid, shift, mu):
    """_residual_growth from its formula, token by token in float64."""
    rows = [(abs(s), r * r / (1 - m)) for r, s, m in zip(resid.tolist(), shift.tolist(), mu.tolist()) if 1 - m > 0.5]
    rows.sort(key=lambda x: x[0])
    half = len(rows) // 2
    low, high = [x[1] for x in rows[:half]], [x[1] for x in rows[half:]]
    return (sum(high) / len(high)) / (sum(low) / len(low))


def test_residual_growth_tells_rounding_from_a_missed_shift():
    g = torch.Generator().manual_seed(0)
    n = 4000
    mu = torch.rand(n, generator=g, dtype=torch.float64)
    shift = torch.randn(n, generator=g, dtype=torch.float64)  # the line's s (a + H) at each token
    rounding = 0.3 * (1 - mu).sqrt() * (2 * torch.rand(n, generator=g, dtype=torch.float64) - 1)
    got = _residual_growth(rounding, shift, mu)
    assert got == pytest.approx(growth_reference(rounding, shift, mu), rel=1e-12)
    assert got < ROUNDING_GROWTH  # the rounding's scale is the same wherever the line moves l
    missed = rounding + 0.5 * shift * torch.rand(n, generator=g, dtype=torch.float64)  # a shift the line misses
    assert _residual_growth(missed, shift, mu) > 2 * ROUNDING_GROWTH
    assert _residual_growth(rounding[:50], shift[:50], mu[:50]) is None  # too few tokens
    assert math.isfinite(growth_reference(missed, shift, mu))
