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

import dataclasses
import functools
import math
from dataclasses import dataclass, field

import torch

from ..core.compose import Composition
from ..core.ratios import Ratios
from ..core.types import Batch, Config, EstimatorOutput
from ..estimators import ESTIMATORS
from ..presets import PRESETS
from ..registry import head_fields, lacking, resolve, resolve_config, run_many
from ..samplers.generators import one_thread
from ..theory import formulas as theory
from . import fit
from .statistics import diagnostics
from .summaries import effective_batch, effectively_kept

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
    knobs: dict = field(default_factory=dict)  # its config's knob values
    fitted: tuple[str, ...] = ()  # the knobs fitted to this batch (seqis.diagnosis.fit); () for the config as given
    outliers_dropped: float = math.nan  # share of the outlying rollouts' loss tokens it drops (nan: no outlier)
    typical_kept: float = math.nan  # share of the other rollouts' loss tokens it keeps

    @property
    def label(self) -> str:
        return self.name + (" (fitted)" if self.fitted else "")


@dataclass(frozen=True)
class Advice:
    facts: dict[str, float]  # kl (trimmed) and kl_mean, s, lengths, |l| p99 and max, catastrophic tokens, ess_seq
    regime: str  # the KL against the literature's measured ranges
    readings: list[EstimatorReading]
    suggestion: str  # the estimator (or preset) to start from
    knobs: dict[str, float]  # its knob values: the ones given, or fitted to the batch (see `fitted`)
    reasons: list[str]  # why it, and what to watch
    caveats: list[str]
    compared: tuple[str, ...] = ()  # every candidate read, by label ("mis_po", "mis_po (fitted)", "verl/...")
    scope: str = ""  # what was compared, in words (the page says it)
    fitted: tuple[str, ...] = ()  # the suggestion's knobs fitted to this batch
    outliers: tuple[int, ...] = ()  # the outlying rollouts (seqis.diagnosis.fit.outlying_rollouts), by index

    def listing(self, pairs) -> Advice:
        """The same advice with only the readings of `pairs` ((name, knobs) as given, not fitted) and the
        suggestion's in `readings` (`compared` still names all): what a page lists under its suggestion."""
        listed = {(n, repr(k)) for n, k in pairs}
        keep = [x for x in self.readings if (x.name, repr(x.knobs)) in listed and not x.fitted
                or (x.name, x.knobs) == (self.suggestion, self.knobs)]
        return dataclasses.replace(self, readings=keep)


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


def batch_facts(batch: Batch, r: Ratios | None = None, d: dict[str, float] | None = None) -> dict[str, float]:
    """The numbers the advice reads: the trimmed per-token KL (k3; `kl_mean` over every token), its Gaussian s,
    rollout lengths, |l| tails, ESS. d: the batch's `diagnostics`, when the caller has them. ValueError for a
    batch without a loss token (nothing to read)."""
    if not bool(batch.loss_mask.any()):
        raise ValueError("advise: the batch has no loss tokens (its loss mask is 0 everywhere): nothing to read")
    r = r if r is not None else Ratios.of(batch)
    d = d if d is not None else diagnostics(batch, r)
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
            why.append(f"it drops {where} with {c.statistic} outside [{c.low if c.low is not None else -math.inf:.4g}, "
                       f"{c.high if c.high is not None else math.inf:.4g}]: {1 - kept:.0%} of the tokens here")
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


def read(name: str, comp: Composition, effective: dict[str, float], facts: dict[str, float], *,
         knobs: dict | None = None, fitted: tuple[str, ...] = (),
         outliers: tuple[float, float] = (math.nan, math.nan)) -> EstimatorReading:
    """One estimator on the batch (its effective batch, seqis.diagnosis.summaries.effective_batch), read against its
    composition; `outliers`: (share of the outlying rollouts' tokens it drops, share of the others' it keeps)."""
    token_rule = comp.catches_single_tokens
    kept, clipped = effective["tokens_kept_frac"], effective["clipped_frac"]
    return EstimatorReading(name=name, description=comp.describe(), tokens_kept=kept,
                            rollouts_kept=effective["rollouts_kept_frac"], clipped=clipped, ess=effective["ess_frac"],
                            why=_why(comp, facts, kept, clipped, effective["rollouts_kept_frac"]),
                            catches_single_tokens=token_rule,
                            tier=0 if comp.weight.per_rollout else 1 if comp.weight.level != "none" else 2,
                            knobs=dict(knobs or {}), fitted=tuple(fitted), outliers_dropped=outliers[0],
                            typical_kept=outliers[1])


def outlier_shares(kept_len: torch.Tensor, r: Ratios, flags: torch.Tensor) -> tuple[float, float]:
    """(share of the flagged rollouts' loss tokens dropped, share of the other rollouts' loss tokens kept) for the
    (B,) kept loss tokens per rollout (a kept mask's sum(-1): an output's masks are within the loss mask); nan for
    the first when nothing is flagged."""
    per_row = kept_len.double()  # (B,)
    T = r.length.double()  # (B,)
    bad, good = float(T[flags].sum()), float(T[~flags].sum())
    dropped = 1 - float(per_row[flags].sum()) / bad if bad else math.nan
    return dropped, float(per_row[~flags].sum()) / good if good else math.nan


def _by_score(facts: dict[str, float], readings: list[EstimatorReading], outlying: bool) -> EstimatorReading:
    """The best reading. With outlying rollouts: the most of them dropped times the most of the rest kept (a band
    fitted to the batch can do both), then the tier, then ESS x tokens kept. Without: see `suggest`."""
    if outlying:
        return max(readings, key=lambda x: (round(x.outliers_dropped * x.typical_kept, 6), -x.tier,
                                            x.ess * x.tokens_kept, not x.fitted))
    pool = [x for x in readings if x.catches_single_tokens] if facts["catastrophic"] else []
    pool = pool or readings
    keeping = [x for x in pool if x.tokens_kept >= 0.5] or pool
    tier = min(x.tier for x in keeping)
    return max((x for x in keeping if x.tier == tier), key=lambda x: (x.ess * x.tokens_kept, not x.fitted))


def _fitted_reason(best: EstimatorReading, defaults: dict) -> str:
    moved = ", ".join(f"{k} = {best.knobs[k]:g} (was {defaults[k]:g})" for k in best.fitted if k in defaults)
    return (f"its band is fitted to this batch: {moved}, between the typical rollouts and the outlying ones (or just "
            "beyond the typical ones' spread); edges are kept where they already separated the two")


def suggest(facts: dict[str, float], readings: list[EstimatorReading], *, outliers: tuple[int, ...] = (),
            scope: str = "") -> Advice:
    """The starting point among the readings. With outlying rollouts (seqis.diagnosis.fit): the reading that drops
    most of them and keeps most of the rest. Otherwise, in order: with catastrophic tokens, only corrections that
    catch a single token; then the best tier (a per-rollout IS weight, unbiased up to its clip; then a token-level
    weight, which corrects tokens but not the state distribution, bias O(T^2 delta); then none) among those keeping
    at least half the tokens; within it, the most effective rollouts (ESS x tokens kept). A fitted reading wins a
    tie with its config as given only when it scores higher."""
    best = _by_score(facts, readings, bool(outliers))
    reasons = [TIERS[best.tier] + f"; it keeps {best.tokens_kept:.0%} of the loss tokens with an ESS of {best.ess:.0%} "
               "of the rollouts"
               + (", and it catches single catastrophic tokens" if facts["catastrophic"] and
                  best.catches_single_tokens else "")]
    if outliers:
        reasons.insert(0, f"{len(outliers)} rollout{'s are' if len(outliers) > 1 else ' is'} outlying (mean "
                          f"log-ratio beyond {fit.z_crit(int(facts['rollouts'])):.1f} standard errors of the "
                          f"batch's at its length): it drops {best.outliers_dropped:.0%} of their tokens and keeps "
                          f"{best.typical_kept:.0%} of the other rollouts' tokens")
    if best.fitted:
        same = next((x for x in readings if x.name == best.name and not x.fitted), None)
        reasons.append(_fitted_reason(best, same.knobs if same else {}))
    reasons += best.why
    return Advice(facts=facts, regime=regime(facts["kl"], facts), readings=readings, suggestion=best.name,
                  knobs=best.knobs, reasons=reasons, caveats=_caveats(facts, best), fitted=best.fitted,
                  compared=tuple(x.label for x in readings), scope=scope, outliers=tuple(outliers))


def _caveats(facts: dict[str, float], best: EstimatorReading) -> list[str]:
    caveats = []
    if facts["kl"] > 1e-2:
        caveats.append("the mismatch is large: fix the engine first (FP16 removes most of it, Qi et al.); any "
                       "correction here trades a lot of bias or variance")
    if facts["kl_left_out"] and facts["kl_mean"] > 10 * max(facts["kl"], 1e-12):
        caveats.append(f"{facts['kl_left_out']:.0f} tokens off by more than 10x raise the mean per-token KL to "
                       f"{facts['kl_mean']:.2g} nats (the rest: {facts['kl']:.2g}): a few tokens, not the engine's "
                       "noise (a kernel bug? Diagnose names them)")
    if facts["catastrophic"] and not best.catches_single_tokens and not best.outliers_dropped >= 0.999:
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
    if best.fitted:
        caveats.append("a band fitted to one batch is a starting point: refit it on a few batches before fixing it")
    return caveats


def head_carried(batch: Batch) -> frozenset[str]:
    """The fields of the sampler's head this batch carries (a key for `relevant_presets`)."""
    return frozenset(n for n in (*Batch.HEAD, "topk_support") if getattr(batch, n) is not None)


@functools.cache
def relevant_presets(carried: frozenset[str] = frozenset()) -> tuple[str, ...]:
    """The presets whose composition (at their defaults) no registry estimator and no earlier preset has: one per
    distinct correction; those that read the sampler's head only when the batch carries every field they read
    (`carried`: `head_carried(batch)`; the exact variants read topk_support too)."""
    seen = {resolve(n) for n in ESTIMATORS}
    keys = []
    for key in PRESETS:
        comp = resolve(key)
        if comp in seen or not set(head_fields(key)) <= carried:
            continue
        seen.add(comp)
        keys.append(key)
    return tuple(keys)


def default_candidates(batch: Batch) -> list[tuple[str, Config | None]]:
    """What the advice compares when not told: the registry and the relevant presets."""
    return [(n, None) for n in ESTIMATORS] + [(k, None) for k in relevant_presets(head_carried(batch))]


def scope_text(given: bool, candidates: list, readings: list[EstimatorReading]) -> str:
    """What was compared, in words."""
    n_fit = sum(1 for x in readings if x.fitted)
    fitted = f", and {n_fit} of them again with their rollout band fitted to this batch" if n_fit else ""
    if given:
        return f"compared the {len(candidates)} given ({', '.join(n for n, _ in candidates)}){fitted}"
    n_reg = sum(1 for n, c in candidates if n in ESTIMATORS and c is None)  # the defaults come without a config
    n_pre = sum(1 for n, c in candidates if n in PRESETS and c is None)
    shown = len(candidates) - n_reg - n_pre
    return (f"compared the {n_reg} registry estimators and {n_pre} presets (one per distinct correction: the other "
            f"{len(PRESETS) - n_pre} repeat one's composition or need the sampler's top-k head)"
            + (f", the {shown} shown with their knobs" if shown > 0 else "") + fitted)


def weighed(comps: list[Composition], batch: Batch, r: Ratios) -> dict[Composition, EstimatorOutput]:
    """Each composition's weights, kept masks and per-rollout values, all the advice reads, through one run_many. A
    score-centering term changes none of them (it adds to the loss and the head's coefficients: evaluators/plain.py,
    step 6), so a centered composition is read without it: the same numbers, without the (B, T, K) head tensors (8
    of 12 s of the comparison on a loaded host, 256 x 4096 with a head of 8); one that differs from another only in
    its centering shares its output. A batch without the head a correction reads gets run_many's error."""
    bare = {c: dataclasses.replace(c, centering=None) if c.centering is not None and not lacking(c, batch) else c
            for c in comps}
    outs = run_many(list(dict.fromkeys(bare.values())), batch, ratios=r)
    return {c: outs[b] for c, b in bare.items()}


@torch.no_grad()
def readings_over(batch: Batch, candidates, r: Ratios, facts: dict[str, float],
                  o: fit.Outliers) -> list[EstimatorReading]:
    """Each candidate (name, config) read on the batch, and after it, where it has a rollout band a fit moves,
    the same with the band fitted (seqis.diagnosis.fit); evaluated together (a composition twice, once)."""
    rows = []  # (name, cfg, fitted knobs, composition)
    for name, cfg in candidates:
        cfg = resolve_config(name, cfg)
        rows.append((name, cfg, (), resolve(name, cfg)))
        moved = fit.fit_bands(name, cfg, r, o)
        if moved is not None:
            rows.append((name, moved[0], moved[1], resolve(name, moved[0])))
    summary: dict[Composition, tuple] = {}  # a composition several candidates share is summarised once
    with one_thread():  # a hundred corrections' small passes: see seqis.samplers.generators.one_thread
        outs = weighed(list(dict.fromkeys(comp for *_, comp in rows)), batch, r)
        while outs:  # each output let go once summarised: its (B, T) weights and masks are not all held at once
            comp, out = outs.popitem()
            kept = effectively_kept(out)  # (B, T)
            kept_len = kept.sum(-1)  # (B,)
            summary[comp] = (effective_batch(out, kept, kept_len),
                             outlier_shares(kept_len, r, o.flags) if o.count else (math.nan, math.nan))
    readings = []
    for name, cfg, fitted, comp in rows:
        effective, shares = summary[comp]
        readings.append(read(name, comp, effective, facts, knobs=dict(cfg.as_dict()), fitted=fitted, outliers=shares))
    return readings


def candidates_of(estimators, also=(), batch: Batch | None = None) -> tuple[list, bool]:
    """(the (name, config) pairs the advice reads, whether they were given): `estimators` as given, or None for the
    registry and the relevant presets; `also` added where not already among them."""
    given = estimators is not None
    pairs = [e if isinstance(e, tuple) else (e, None) for e in estimators] if given else default_candidates(batch)
    seen = {(n, resolve_config(n, c)) for n, c in pairs}
    for n, c in (e if isinstance(e, tuple) else (e, None) for e in also):
        if (n, resolve_config(n, c)) not in seen:
            seen.add((n, resolve_config(n, c)))
            pairs.append((n, c))
    return pairs, given


def conclude(facts: dict[str, float], o: fit.Outliers, candidates: list, given: bool,
             readings: list[EstimatorReading]) -> Advice:
    """The advice from the readings of `candidates` (readings_over), saying what was compared."""
    return suggest(facts, readings, outliers=tuple(o.flags.nonzero().squeeze(1).tolist()),
                   scope=scope_text(given, candidates, readings))


@torch.no_grad()
def advise(batch: Batch, estimators=None, ratios: Ratios | None = None, *, also=()) -> Advice:
    """Read the batch against each candidate and suggest where to start. `estimators`: names, preset keys or
    (name, cfg) pairs; None: the registry and the relevant presets (`default_candidates`), with `also` added
    (Explore's shown columns). Each candidate with a rollout band is read again with the band fitted to the batch;
    `Advice.scope` and `Advice.compared` say what was read."""
    r = ratios if ratios is not None else Ratios.of(batch)
    candidates, given = candidates_of(estimators, also, batch)
    facts = batch_facts(batch, r)
    o = fit.outlying_rollouts(r)
    return conclude(facts, o, candidates, given, readings_over(batch, candidates, r, facts, o))
