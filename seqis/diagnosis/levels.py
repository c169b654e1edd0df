"""The lines a finding is judged against: the frameworks' published mismatch thresholds, the detectors' level,
the formats a sampler rounds through, and `Finding` itself (shared by every module of the diagnosis)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Any

import torch

NEMO_MULT_PROB_ERROR = 1.05  # NeMo-RL: mean exp(|l|) above this needs investigation
VERL_KL = 0.1  # verl: |KL| above this is a significant off-policy gap
VERL_CHI2 = 1.0  # verl: chi2_token above this is a severe distribution shift
VERL_VETO_FRACTION = 0.1  # verl: more than this fraction of rollouts vetoed is too high
CATASTROPHIC_LOG_RATIO = math.log(20.0)  # |l| above this: a ratio 4x outside IcePop's [0.5, 5]
# unit roundoff of each format a sampler may round through; fp8 is e4m3
UNIT_ROUNDOFF = {"fp32": 2.0**-24, "fp16": 2.0**-11, "bf16": 2.0**-8, "fp8": 2.0**-4}
ROUNDING_RANGE = (0.25, 32.0)  # a format's floors, in its unit roundoffs: one probability rounding .. |z| = 32
SEVERITY_RANK = {"bad": 0, "warn": 1, "ok": 2}
# every kind a Finding may have (seqis.runs.monitor logs each, found or not)
KINDS = ("token_misalignment", "catastrophic_tokens", "temperature_mismatch", "sampler_truncation",
         "raw_logprobs", "policy_lag", "precision_noise", "healthy", "no_loss_tokens")
Z_DETECT = 5.0  # a detector fires beyond 5 standard errors (one-sided p ~ 3e-7): clean batches stay silent
Z_CI = 1.959964  # evidence["ci"] is a 95% interval
MIN_DEFICIT = 1e-4  # a kept-mass deficit below this per token is below any correction's notice
MIN_TEMPERATURE_SHIFT = 0.02  # a temperature within 2% of the trainer's is not reported
TEMPERATURE_R2 = 0.8  # the temperature's line explains 80% of l's variance (policy lag: 0-50%)
# ... or what it leaves is rounding: two-sided, of a format's size, and no larger where the line moves l most
# (r^2 / (1 - mu), the heteroscedastic rounding's scale, at most this many times its mean where the line moves least)
ROUNDING_GROWTH = 1.5
# without the entropy: l's squared correlation with log pi at branching tokens. A temperature leaves 0.5-0.95 (the
# per-context log-partition c, not known without the entropy, is the rest), rounding 0-0.02 and policy lag 0-0.12
# on the five generators (issue 45: 0.6 missed tau 0.7 on LLM-like peaked contexts, where c spreads the most)
TEMPERATURE_R2_BARE = 0.3
MIN_ENTROPY_GAP = 0.02  # nats per token: below this a trainer's entropy in bf16 could be the cause
_BRANCHING = math.log(0.5)  # tokens the trainer gives under 1/2: where temperature and rounding show
_MIN_FIT_TOKENS = 50
_SAFETY = 20.0  # verl's bound on |l| before exp, so one absurd token cannot overflow
MAX_GROUPS = 32  # with by=None, diagnose tries each metadata column with at most this many distinct values
# ... and in it each group of at least this many rollouts: the tests' standard errors come from the rollouts (a
# lag's gain is a mean over them, an interval is clustered by them), and over a few their z has tails far beyond
# the normal's (Student's t with 7 degrees of freedom passes 5.6 with p ~ 4e-4, not 1e-8)
MIN_GROUP_ROLLOUTS = 16
# the faults a group may show that the whole batch hides; catastrophic tokens are never hidden (the whole batch reads
# every token, and a temperature it found re-reads their tail off its line)
HIDEABLE = ("token_misalignment", "temperature_mismatch", "sampler_truncation", "raw_logprobs", "policy_lag")
# one sampler-side fault reads as another in a subset of its rollouts (a temperature of 0.9 over the rollouts of one
# reward looks like a truncation): a whole batch that shows one of them hides none of the others
SAMPLER_SIDE = frozenset({"temperature_mismatch", "sampler_truncation", "raw_logprobs"})
_NORMAL = NormalDist()


@dataclass(frozen=True)
class Finding:
    """One cause of mismatch (or `healthy`), with the numbers that show it."""

    kind: str  # sampler_truncation | temperature_mismatch | raw_logprobs | policy_lag | token_misalignment | ...
    severity: str  # "ok" | "warn" | "bad"
    message: str  # one sentence a user can act on
    evidence: dict[str, Any] = field(default_factory=dict)
    group: Any = None  # None: the whole batch; else the value of the `by` column it is about


def mismatch_stats(l: torch.Tensor) -> dict[str, float]:
    """The frameworks' mismatch metrics over loss tokens: NeMo-RL's mean exp|l|, verl's KL (k1), k3, chi2."""
    n = max(l.numel(), 1)
    lc = l.clamp(-_SAFETY, _SAFETY)  # verl's safety bound, so one absurd token cannot overflow
    rho = lc.exp()  # (N,)
    f64 = torch.float64
    return {
        "mult_prob_error": float(torch.maximum(rho, 1 / rho).sum(dtype=f64)) / n,
        "kl_k1": -float(l.sum(dtype=f64)) / n,
        "kl_k3": float((rho - 1 - lc).sum(dtype=f64)) / n,
        "chi2_token": float((rho * rho - 1).sum(dtype=f64)) / n,
        "n_tokens": int(l.numel()),
    }


def _level(stats: dict[str, float]) -> str:
    """bad past verl's KL / chi2 lines, warn past NeMo-RL's 1.05, else ok."""
    if abs(stats["kl_k1"]) > VERL_KL or stats["chi2_token"] > VERL_CHI2:
        return "bad"
    return "warn" if stats["mult_prob_error"] > NEMO_MULT_PROB_ERROR else "ok"


def _threshold_clause(stats: dict[str, float]) -> str:
    chi2 = stats["chi2_token"]  # mean of rho^2 - 1: below 0 only by sampling noise (a chi-square is at least 0)
    said = f"{chi2:.2e}" if chi2 >= 0 else f"0 (the estimate came out at {chi2:.1e}: noise, the true value is >= 0)"
    left = stats.get("n_left_out", 0)
    over = (f"Over the {stats['n_tokens']:,} loss tokens besides the {left} catastrophic one{'s' if left > 1 else ''}"
            if left else "Batch")
    return (f"{over}: mean exp|l| {stats['mult_prob_error']:.4f} (NeMo-RL investigates above "
            f"{NEMO_MULT_PROB_ERROR}), KL {stats['kl_k1']:.2e} (verl: significant above {VERL_KL}), chi2 "
            f"{said} (verl: severe above {VERL_CHI2}).")
