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
from seqis.diagnosis.intervals import intervals_words, temperature_tail
from seqis.diagnosis.levels import CATASTROPHIC_LOG_RATIO, ROUNDING_GROWTH
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
        assert "No sampler fault is confirmed" in said.message and "the entropy column" in said.message


@pytest.mark.parametrize("seed", [2, 3])
def test_without_the_entropy_a_temperatures_rare_tokens_are_not_led_with_as_a_kernel_bug(seed):
    """Before: at 0.7 under fp8 without the entropy the verdict was precision noise beside catastrophic tokens
    (bad in one seed of three) telling to look for a kernel bug, though the flagged tokens are the sharper sampler's
    own rare tokens (all under 5% for the trainer, l > 0): the temperature the batch cannot rule out comes first."""
    findings = diagnose(bare(RandomNextToken(vocab=512, sampler_format="fp8", temperature=0.7).make(seed)))
    assert findings[0].kind != "catastrophic_tokens"
    cat = [f for f in findings if f.kind == "catastrophic_tokens"]
    for f in cat:
        assert f.severity == "warn" and f.evidence["on_temperature_line"] == f.evidence["count"]
        assert "Settle the temperature first" in f.message and "which this batch cannot rule out" in f.message
    lo, hi = next(f for f in findings if f.evidence.get("temperature_interval")).evidence["temperature_interval"]
    assert lo <= 0.7 <= hi


def test_a_kernels_catastrophic_tokens_beside_an_fp8_temperature_are_still_a_kernel_bug():
    """The same batch with log mu = log pi - 12 injected at a near-certain token of 20 rollouts: no temperature in the
    interval puts a token the trainer is sure of 12 nats off, so those are a kernel bug (bad: 21% of rollouts)."""
    b = bare(batch("random_next_token", 0.7))
    inference = b.inference_logprobs.clone()
    sure = (b.trainer_logprobs > -1e-3) & b.loss_mask  # (B, T)
    hit = [(r, int(sure[r].nonzero()[0, 0])) for r in range(20)]
    for r, t in hit:
        inference[r, t] = b.trainer_logprobs[r, t] - 12
    findings = diagnose(Batch(b.trainer_logprobs, inference, b.advantages, b.loss_mask, b.metadata, {}))
    cat = next(f for f in findings if f.kind == "catastrophic_tokens")
    assert cat.severity == "bad" and "Look for a kernel bug in the sampler at the others" in cat.message
    assert cat.evidence["count"] - cat.evidence["on_temperature_line"] >= 20
    assert {tuple(w) for w in cat.evidence["where"]} >= set(hit)


def tail_reference(a, l, keep, bad, faulty):
    """temperature_tail from its definition, token by token in float64: some temperature in a range puts l within
    ln 20 of its line s (a - mean a) + mean l (the range's ends tried on a fine grid of s)."""
    ka = [x for x, k in zip(a.tolist(), keep.tolist()) if k]
    kl = [x for x, k in zip(l.tolist(), keep.tolist()) if k]
    ma, ml = sum(ka) / len(ka), sum(kl) / len(kl)
    out = []
    for x, y, flagged in zip(a.tolist(), l.tolist(), bad.tolist()):
        hit = False
        for lo, hi in faulty:
            s_lo, s_hi = 1 - 1 / lo, (1 - 1 / hi if math.isfinite(hi) else 1.0)
            grid = [s_lo + (s_hi - s_lo) * k / 2000 for k in range(2001)]
            hit |= any(abs(y - (s * (x - ma) + ml)) <= CATASTROPHIC_LOG_RATIO for s in grid)
        out.append(bool(flagged and hit))
    return out


def test_temperature_tail_matches_its_definition():
    g = torch.Generator().manual_seed(1)
    a = -8 * torch.rand(3000, generator=g, dtype=torch.float64)
    l = -0.4 * a + 0.3 * torch.randn(3000, generator=g, dtype=torch.float64) - 0.5
    l[::97] += 9 * torch.randn(l[::97].shape, generator=g, dtype=torch.float64)  # some far off every line
    bad = l.abs() > CATASTROPHIC_LOG_RATIO
    for faulty in ([(0.5, 0.98)], [(0.9, 0.98), (1.02, math.inf)], []):
        got = temperature_tail(a, l, ~bad, bad, faulty)
        assert got.tolist() == tail_reference(a, l, ~bad, bad, faulty)
    assert 0 < int(temperature_tail(a, l, ~bad, bad, [(0.5, 0.98)]).sum()) < int(bad.sum())


def test_a_bare_fits_open_temperature_says_the_entropy_would_tell():
    ev = {"cannot_rule_out": {"temperature": {"faulty": [(0.51, 0.98)], "rollouts_to_tell": 96, "bare": True}}}
    words = intervals_words(ev, 96)
    assert words.startswith("A temperature in [0.51, 0.98] cannot be ruled out with 96 rollouts; without the")
    assert "the entropy column (extras['entropy']) would tell" in words
    ev["cannot_rule_out"]["temperature"]["bare"] = False
    assert "significant at this size" in intervals_words(ev, 96)


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
