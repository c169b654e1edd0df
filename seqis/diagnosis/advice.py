"""What a batch means for each estimator: the batch's mismatch read against each correction's band and clip.

`advise(batch, estimators)` reads the batch's per-token KL, lengths, log-ratio tails and sequence-weight ESS,
runs each estimator, and says what it drops and why in terms of its composition (its weight's level, clip and
band, its criteria), then suggests a starting point. Everything an estimator is comes from its registry entry
(`spec.compose(cfg)`): no branch here names an estimator.

The yardsticks are the closed forms (seqis.theory.formulas, valid-IS Gaussian noise l ~ N(-s^2/2, s^2) with s from the
batch's KL) and the literature's thresholds:
- measured engine mismatch per token: 5e-4 to 1e-3 nats (H20), 1e-3 to 1e-2 (L20), 1e-2 to 1 (A100)
  (Li & Liu, "When Speed Kills Stability");
- a geometric (trajectory) band [a, b] keeps long rollouts iff the per-token KL is below -log a (MIS-PO,
  Step 3.5 Flash: 0.996 -> 0.004 nats);
- sequence TIS's best clip C* = sqrt(2 (1 + chi2)), chi2 = E_mu[w^2] - 1 the whole rollout's (Li, part 2), read here
  at the median length from the per-token chi2: 1 + chi2 = (1 + chi2_token)^T;
- a catastrophic token (|l| of several nats) hides in a long rollout's mean: only a token-level rule catches it.

The per-token KL that steers all this is trimmed: the mean k3 over the loss tokens with |l| at most
max(log 10, the 99th percentile of |l|), so at most 1% of the tokens are left out and only those whose ratio
is off by more than 10x. A few catastrophic tokens (a kernel bug: |l| of 20 and more, k3 ~ e^|l|) cannot
swamp it; they are counted and advised on apart, and the mean over every token is kept beside it
(`facts["kl_mean"]`). A batch where more than 1% of the tokens are that far off keeps most of them in the
figure. The regime's sentence says which figure it shows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..core.compose import Composition
from ..core.ratios import Ratios
from ..core.types import Batch
from ..estimators import ESTIMATORS
from ..registry import resolve, resolve_config, run_many
from ..theory import formulas as theory
from .statistics import diagnostics
from .summaries import effective_batch

KL_RANGES = ((5e-4, "below the smallest engine mismatch measured (H20: 5e-4 to 1e-3 nats)"),
             (1e-3, "like an H20 engine (5e-4 to 1e-3 nats)"),
             (1e-2, "like an L20 engine (1e-3 to 1e-2 nats)"),
             (math.inf, "large, like an A100 engine (1e-2 to 1 nats): expect most corrections to bind"))
CATASTROPHIC_L = math.log(10.0)  # a token whose ratio is off by 10x either way
TRIM_SHARE = 0.01  # the trimmed KL leaves out at most this share of the loss tokens (the largest |l|)
TIERS = ("it applies a per-rollout IS weight: unbiased up to its clip or band (Li, part 2)",
         "it applies a token-level IS weight (no per-rollout weight among the corrections that qualify)",
         "it applies no IS weight (no correction that qualifies has one)")


@dataclass(frozen=True)
class EstimatorReading:
    """One estimator on the batch: what it keeps, what it drops and why."""

    name: str
    description: str  # the composition in words
    tokens_kept: float  # fraction of loss tokens whose gradient survives
    rollouts_kept: float  # fraction of valid rollouts with any kept token
    clipped: float  # fraction of valid rollouts whose weight is truncated
    ess: float  # ESS of the applied rollout weights / valid rollouts
    why: list[str] = field(default_factory=list)  # one sentence per rule that binds (or a note that none does)
    catches_single_tokens: bool = False  # has a token-level rule: a catastrophic token is dropped on its own
    tier: int = 0  # 0: a per-rollout IS weight, 1: a token-level weight, 2: no IS weight (see TIERS)


@dataclass(frozen=True)
class Advice:
    facts: dict[str, float]  # kl (trimmed) and kl_mean, s, lengths, |l| p99 and max, catastrophic tokens, ess_seq
    regime: str  # the KL against the literature's measured ranges
    readings: list[EstimatorReading]
    suggestion: str  # the estimator to start from
    knobs: dict[str, float]  # its knob values (the ones given)
    reasons: list[str]  # why it, and what to watch
    caveats: list[str]


def _quantile(x: torch.Tensor, q: float) -> float:
    if x.numel() == 0:
        return 0.0
    k = min(max(int(math.ceil(q * x.numel())), 1), x.numel())
    return float(x.float().kthvalue(k).values)


def trimmed_kl(l: torch.Tensor, p99: float) -> tuple[float, float, int]:
    """(k3 KL, chi2 per token, tokens left out) over the loss tokens' log-ratios l (N,) with |l| <= max(log 10,
    p99 of |l|): the catastrophic tokens out, at most about TRIM_SHARE of them."""
    edge = max(CATASTROPHIC_L, p99)
    keep = l.abs() <= edge  # (N,)
    n = int(keep.sum())
    x = l[keep].double()  # (n,) within 10x, or within the 99th percentile
    kl = float((torch.expm1(x) - x).sum() / max(n, 1))  # k3 = rho - 1 - l
    chi2 = float(torch.expm1(2 * x).sum() / max(n, 1))  # rho^2 - 1
    return max(kl, 0.0), chi2, l.numel() - n


def batch_facts(batch: Batch, r: Ratios | None = None) -> dict[str, float]:
    """The numbers the advice reads: the trimmed per-token KL (k3; `kl_mean` over every token), its Gaussian s,
    rollout lengths, |l| tails, ESS. ValueError for a batch without a loss token (nothing to read)."""
    if not bool(batch.loss_mask.any()):
        raise ValueError("advise: the batch has no loss tokens (its loss mask is 0 everywhere): nothing to read")
    r = r if r is not None else Ratios.of(batch)
    d = diagnostics(batch, r)
    lengths = r.length[r.length > 0]
    l = r.log_ratio[r.mask]  # (N,)
    kl, chi2, left_out = trimmed_kl(l, float(d["abs_log_ratio_p99"]))
    return {
        "kl": kl, "kl_mean": max(float(d["kl_k3"]), 0.0), "kl_left_out": float(left_out),
        "n_tokens": float(l.numel()), "s": float(theory.s_from_kl(kl)) if kl > 0 else 0.0,
        "length_p50": _quantile(lengths, 0.5), "length_p90": _quantile(lengths, 0.9),
        "length_max": float(lengths.max()) if lengths.numel() else 0.0,
        "abs_l_p99": float(d["abs_log_ratio_p99"]), "abs_l_max": float(d["abs_log_ratio_max"]),
        "catastrophic": float((l.abs() > CATASTROPHIC_L).sum()), "ess_seq": float(d["ess_seq"]),
        "chi2_token": chi2, "chi2_token_mean": float(d["chi2_token"]), "rollouts": float(lengths.numel()),
    }


def regime(kl: float, facts: dict[str, float] | None = None) -> str:
    """The per-token KL against the measured engine ranges, saying which figure it is (with facts: trimmed or
    not, and the mean beside it)."""
    which = ""
    if facts is not None:
        n, out = int(facts["n_tokens"]), int(facts["kl_left_out"])
        which = (f" (mean k3 over the {n - out:,} loss tokens within 10x; with the {out:,} beyond it the mean is "
                 f"{facts['kl_mean']:.2g})" if out else f" (mean k3 over all {n:,} loss tokens)")
    for edge, text in KL_RANGES:
        if kl < edge:
            return f"per-token KL {kl:.2g} nats{which}: {text}"
    return f"per-token KL {kl:.2g} nats{which}"


def _why(comp: Composition, facts: dict[str, float], kept: float, clipped: float, rollouts_kept: float) -> list[str]:
    """What binds on this batch and why, from the composition and the closed forms (a closed form's claim is
    said beside what the estimator keeps here)."""
    why, kl, s = [], facts["kl"], facts["s"]
    T50, Tmax = facts["length_p50"], facts["length_max"]
    hit = facts["catastrophic"]
    hits = f" (this batch has {hit:.0f} tokens with |l| > log 10)" if hit else ""
    every: dict[str | None, list] = {}  # the max / min rules on the ratio, by their advantage condition
    for b in comp.ratio_bands():
        level, low, high = b.level, b.low, b.high
        band = f"[{low:g}, {high:g}]"
        cond = f" where A is {b.advantage}" if b.advantage else ""
        if level == "geometric":
            cut = float(theory.mis_po_kl_cutoff(low)) if low else math.inf
            if kl > cut:
                why.append(f"its geometric band {band} is a per-token KL cutoff of {cut:.2g} nats, below this "
                           f"batch's {kl:.2g}: long rollouts are rejected, more with length (here it keeps "
                           f"{rollouts_kept:.0%} of the rollouts)")
            elif s > 0:
                acc = float(theory.geo_band_acceptance(T50, s, low or 0.0, high or math.inf))
                why.append(f"its geometric band {band} (KL cutoff {cut:.2g} nats) keeps long rollouts here; at the "
                           f"median length {T50:.0f} it keeps about {acc:.0%} by the closed form (short rollouts are "
                           "noisier)")
        elif level == "sequence":
            if s > 0:
                acc = float(theory.product_band_acceptance(Tmax, s, low or 0.0, high or math.inf))
                why.append(f"its product band {band} keeps {acc:.0%} of rollouts at the longest length {Tmax:.0f} "
                           "(the product ratio spreads like s√T)")
        elif level == "token":
            why.append(f"its token band {band}{cond} drops single tokens outside it{hits}")
        elif level == "prefix":
            why.append(f"its prefix band {band} drops the tokens whose prefix ratio exp(sum of l_s, s <= t) is "
                       f"outside it{hits}")
        elif level == "every":
            every.setdefault(b.advantage, []).append(b)
    for advantage, bands in every.items():  # max_t rho_t <= hi and min_t rho_t >= lo together: one band
        band = f"[{max(b.low for b in bands):g}, {min(b.high for b in bands):g}]"
        cond = f" where A is {advantage}" if advantage else ""
        why.append(f"it rejects a whole rollout{cond} when any one of its tokens has a ratio outside {band}, "
                   f"whatever its length (here it keeps {rollouts_kept:.0%} of the rollouts){hits}")
    for c in comp.criteria:
        if c.statistic != "ratio":
            where = "tokens" if c.agg == "token" else f"rollouts by their {c.agg}"
            why.append(f"it drops {where} with {c.statistic} outside [{c.low if c.low is not None else '-inf'}, "
                       f"{c.high if c.high is not None else 'inf'}]: {1 - kept:.0%} of the tokens here")
    w = comp.weight
    if w.truncated and w.upper < math.inf:
        log_1p_chi2 = max(T50, 1.0) * math.log1p(facts["chi2_token"])  # log (1 + chi2_seq) = T log (1 + chi2)
        chi2_seq = math.expm1(log_1p_chi2) if log_1p_chi2 < 700 else math.inf
        best = float(theory.seq_tis_best_clip(chi2_seq)) if w.per_rollout and math.isfinite(chi2_seq) else None
        why.append(f"its {w.level} weight is truncated at {w.upper:g}: {clipped:.0%} of rollouts clipped"
                   + (f" (Li's C* = √(2(1+χ²)) ≈ {best:.2g}, χ² = {chi2_seq:.2g} the whole rollout's at the median "
                      f"length {T50:.0f})" if best else ""))
    elif w.level in ("sequence", "prefix") and not w.truncated and w.band is None:
        why.append(f"its untruncated {w.level} weight is unbiased but heavy-tailed: the batch's sequence-weight "
                   f"ESS is {facts['ess_seq']:.0%}")
    if w.level == "none":
        why.append("it applies no IS weight: biased like plain REINFORCE on the sampler's tokens")
    if not why:
        why.append("nothing in it binds on this batch" if kept >= 0.999 else "its rules drop some tokens")
    return why


def read(name: str, comp: Composition, effective: dict[str, float], facts: dict[str, float]) -> EstimatorReading:
    """One estimator on the batch (its effective batch, seqis.diagnosis.summaries.effective_batch), read against its
    composition."""
    token_rule = comp.catches_single_tokens
    kept, clipped = effective["tokens_kept_frac"], effective["clipped_frac"]
    return EstimatorReading(name=name, description=comp.describe(), tokens_kept=kept,
                            rollouts_kept=effective["rollouts_kept_frac"], clipped=clipped, ess=effective["ess_frac"],
                            why=_why(comp, facts, kept, clipped, effective["rollouts_kept_frac"]),
                            catches_single_tokens=token_rule,
                            tier=0 if comp.weight.per_rollout else 1 if comp.weight.level != "none" else 2)


def suggest(facts: dict[str, float], readings: list[EstimatorReading], knobs: dict[str, dict]) -> Advice:
    """The starting point among the readings. In order: with catastrophic tokens, only corrections that catch a
    single token; then the best tier (a per-rollout IS weight, unbiased up to its clip; then a token-level weight,
    which corrects tokens but not the state distribution, bias O(T^2 delta); then none) among those keeping at
    least half the tokens; within it, the most effective rollouts (ESS x tokens kept)."""
    pool = [x for x in readings if x.catches_single_tokens] if facts["catastrophic"] else []
    pool = pool or readings
    keeping = [x for x in pool if x.tokens_kept >= 0.5] or pool
    tier = min(x.tier for x in keeping)
    best = max((x for x in keeping if x.tier == tier), key=lambda x: x.ess * x.tokens_kept)
    reasons = [TIERS[best.tier] + f"; it keeps {best.tokens_kept:.0%} of the loss tokens with an ESS of {best.ess:.0%} "
               "of the rollouts"
               + (", and it catches single catastrophic tokens" if facts["catastrophic"] else ""), *best.why]
    caveats = []
    if facts["kl"] > 1e-2:
        caveats.append("the mismatch is large: fix the engine first (FP16 removes most of it, Qi et al.); any "
                       "correction here trades a lot of bias or variance")
    if facts["kl_left_out"] and facts["kl_mean"] > 10 * max(facts["kl"], 1e-12):
        caveats.append(f"{facts['kl_left_out']:.0f} tokens off by more than 10x raise the mean per-token KL to "
                       f"{facts['kl_mean']:.2g} nats (the rest: {facts['kl']:.2g}): a few tokens, not the engine's "
                       "noise (a kernel bug? Diagnose names them)")
    if facts["catastrophic"] and not best.catches_single_tokens:
        caveats.append(f"{facts['catastrophic']:.0f} tokens have |l| > log 10 and this correction has no token-level "
                       "rule: a long rollout's mean hides them")
    if best.rollouts_kept < 0.9:
        caveats.append(f"it drops {1 - best.rollouts_kept:.0%} of the rollouts: if the trainer keeps them in GRPO "
                       "group baselines, the baselines still see them")
    if best.tier == 1:
        caveats.append("a token-level weight corrects each token, not the state distribution: biased like PPO, "
                       "more so for long rollouts (Li, part 2)")
    if best.tier == 2:
        caveats.append("no IS weight: the gradient is biased by the mismatch")
    return Advice(facts=facts, regime=regime(facts["kl"], facts), readings=readings, suggestion=best.name,
                  knobs=knobs[best.name], reasons=reasons, caveats=caveats)


@torch.no_grad()
def advise(batch: Batch, estimators=None, ratios: Ratios | None = None) -> Advice:
    """Read the batch against each estimator (names, preset keys or (name, cfg) pairs; default: the registry)
    and suggest where to start."""
    r = ratios if ratios is not None else Ratios.of(batch)
    items = [e if isinstance(e, tuple) else (e, None) for e in (estimators or list(ESTIMATORS))]
    facts = batch_facts(batch, r)
    outs = run_many(items, batch, ratios=r)
    readings, knobs = [], {}
    for name, cfg in items:
        cfg = resolve_config(name, cfg)
        readings.append(read(name, resolve(name, cfg), effective_batch(outs[name]), facts))
        knobs[name] = dict(cfg.as_dict())
    return suggest(facts, readings, knobs)
