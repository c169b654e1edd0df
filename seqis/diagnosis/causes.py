"""Why trainer and sampler disagree: name the cause of a batch's mismatch, as a test with a stated null.

Per loss token the batch gives a = log pi(y_t) (the trainer), b = log mu(y_t) (the sampler), l = a - b and the
ratio rho = e^l; `batch.extras["entropy"]` may add H_t, the trainer's entropy at that position, and the
advantages say which rollouts did well. The token y_t was drawn from the sampler's distribution at its
context, so two identities hold exactly for every full-support sampler, whatever its precision or temperature:

    E_mu[rho | context] = 1                       (the trainer's mass, summed over the sampler's support)
    E_mu[rho (a + H) | context] = E_pi[log pi + H] = 0       (the trainer's entropy is its mean -log pi)

Each detector is a test of one consequence. The identities make each token's increment (rho - 1, rho (a + H))
mean zero given the past under the null, so their sum is a martingale and sum d / sqrt(sum d^2) is N(0, 1)
whatever the dependence between a rollout's tokens (the score test). A detector fires beyond Z_DETECT and
above a size that matters; its estimate carries a 95% confidence interval (`evidence["ci"]`) clustered by
rollout (the tokens of a rollout are dependent, rollouts are not). In order:

  token_misalignment   b agrees with a far better `shift` positions away than in place (median |a - b|, 4x):
                       the log-probs are off by one or two. Everything else reads the re-aligned pairs.
  catastrophic_tokens  |l| > ln 20 (a ratio 4x beyond IcePop's 5): a kernel bug. Left out of every test below.
                       Those within ln 20 of the line of a temperature the batch cannot rule out are that
                       temperature's own tail (a sharp sampler's rare tokens, pushed out by fp8 rounding); when
                       every one is, the finding is a warning said after the verdict (`temperature_tail`).
  sampler_truncation   null: E_mu[rho] = 1. A sampler that keeps a set K (top-p / top-k) and renormalises has
                       E_mu[rho | context] = pi(K), the trainer's mass on K, below 1. When the sampler's
                       untruncated distribution is the trainer's, rho = Z (the kept mass) on every kept token,
                       so l = log Z exactly and the mean of l is the mean log kept mass; rounding adds a
                       two-sided term of mean -KL (tiny). Evidence: log_offset (mean l, with its ci), kept_mass
                       (mean rho).
  temperature_mismatch null: tau = 1. A sampler at temperature tau has log mu = (z / tau) - log Z_tau(context),
                       so l = s a + c(context) with s = 1 - 1/tau and c = log sum_y pi(y)^(1/tau), a nuisance
                       per context that no per-rollout intercept removes. It is identified by the second
                       identity: E[(l - s (a + H) - f(context)) rho (a + H)] = 0 for every function f of the
                       context, so s = sum (l - f) g / sum (a + H) g with g = rho (a + H); f is a quadratic in H
                       fitted to the residual (a control variate: c = s H + O(s^2) to first order). A
                       temperature must also explain the mismatch: the line s (a + H) + f explains at least
                       TEMPERATURE_R2 of l's variance (policy lag, also partly linear in log pi, explains
                       0-50%), or what it leaves is a format's rounding (variance sigma^2 (1 - mu), no larger
                       where the line moves l most: ROUNDING_GROWTH),
                       its share of the symmetric divergence E_mu[l (rho - 1)] = KL(pi || mu) +
                       KL(mu || pi) is positive and l takes both signs (a truncation's l = log Z <= 0 is
                       one-sided, and its share negative). A detected temperature overrides the truncation
                       test: a sampler sharper than the trainer misses the rare tokens where rho is large, so
                       in a finite batch its mean rho can fall below 1. Without the entropy the instrument is
                       rho - 1 (first identity), the share is not identified and the R^2 is l's squared
                       correlation with log pi at branching tokens (at least TEMPERATURE_R2_BARE); a truncation
                       test that fires then wins.
  raw_logprobs         null: E_mu[rho (a + H)] = 0 (needs H). A sampler that drew from a processed distribution
                       q (temperature, top-p, top-k) but reported its raw log-probs agrees with the trainer
                       (rho ~ 1) while the tokens came from q. Evidence: entropy_gap, the mean over loss tokens
                       of -log pi(y_t) - H_t (E_q[-log pi] - H(pi) per token: negative when the tokens are
                       sharper than the reported distribution).
  policy_lag           null: the trainer's policy is no better than the sampler's on this batch's own rewards.
                       gain = mean over rollouts of sum_t A_t (rho_t - 1) is the importance-sampling estimate of
                       E_pi[A] - E_mu[A] (first order). A sampler fault does not know the rewards; a trainer that
                       learned from them is ahead along them: a systematic trainer-side mismatch.
  precision_noise      what remains, when no test fires: two-sided noise. Its floor (median |l| at branching
                       tokens) is stated with the formats whose rounding gives floors of that size (a format with
                       unit roundoff u: u/4 .. 32 u, from one rounding of the probabilities to logits of
                       magnitude 32 rounded); the data do not tell rounding from any other two-sided mismatch of
                       that size, and the message says so.

A fault of one environment can hide in the whole batch (only math at temperature 0.7: the line explains too little
of the whole batch's l). Without `by`, each metadata column of 2 to MAX_GROUPS values is scanned, each of its
groups of MIN_GROUP_ROLLOUTS rollouts or more diagnosed at scan_z(m), the whole batch's one-sided level divided
among the m groups (Bonferroni); a group's fault whose kind the whole batch's findings lack comes first, `group`
its value and `evidence["by"]` its column (`hidden_faults`).

Severity cites the frameworks' published guidance:
- NeMo-RL (docs/adding-new-models.md, "Expected Error Threshold"): the mean over tokens of exp(|l|) should
  stay below 1.05; above, "further investigation" is needed. A sampler fault is at least a warning, and bad once
  the tokens it shapes cross that line; plain noise and lag are ok below it and a warning above.
- verl (docs/algo/rollout_corr.md): |KL| > 0.1 flags "significant off-policy gap", chi2_token > 1 a "severe
  distribution shift"; a veto fraction (rollouts with a catastrophic token) above 0.1 is "too high".

    from seqis import diagnose
    for f in diagnose(batch, by="env_name"):     # or diagnose(batch): a group's hidden fault first
        print(f.severity, f.kind, f.group, f.message, f.evidence)
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..core.types import Batch
from .detectors import (  # noqa: F401  (public names of seqis.diagnosis.causes)
    _fired,
    noise_floor,
    one_sided,
    policy_lag_test,
    raw_logprobs_test,
    rounding_dtype,
    rounding_formats,
    run_tests,
    score_z,
    temperature_fit,
    truncation_test,
)
from .findings import (  # noqa: F401
    _catastrophic,
    _misalignment,
    _policy_lag,
    _precision,
    _raw_logprobs,
    _temperature,
    _truncation,
    tau_interval,
    temperature_estimable,
    temperature_words,
)
from .intervals import intervals_words, sampler_intervals, temperature_tail
from .levels import (  # noqa: F401
    _NORMAL,
    CATASTROPHIC_LOG_RATIO,
    HIDEABLE,
    KINDS,
    MAX_GROUPS,
    MIN_DEFICIT,
    MIN_ENTROPY_GAP,
    MIN_GROUP_ROLLOUTS,
    MIN_TEMPERATURE_SHIFT,
    NEMO_MULT_PROB_ERROR,
    ROUNDING_GROWTH,
    ROUNDING_RANGE,
    SAMPLER_SIDE,
    SEVERITY_RANK,
    TEMPERATURE_R2,
    TEMPERATURE_R2_BARE,
    UNIT_ROUNDOFF,
    VERL_CHI2,
    VERL_KL,
    VERL_VETO_FRACTION,
    Z_CI,
    Z_DETECT,
    Finding,
    _level,
    _threshold_clause,
    mismatch_stats,
)
from .pairs import (  # noqa: F401
    _Pairs,
    aligned_pairs,
    best_shift,
    cluster_sums,
    clustered_mean,
    clustered_ratio,
    find_shift,
    kept,
    realign,
)


@torch.no_grad()
def diagnose(batch: Batch, by: str | None = None) -> list[Finding]:
    """Findings about why the batch's trainer and sampler log-probs disagree, worst first.

    With `by` (a metadata column: environment, turn, rank), the whole batch's findings are followed by each
    value's, each group tested at the whole batch's level. With `by=None`, every column `scanned_columns` names
    (2 to MAX_GROUPS distinct values) is tried, in it each group of MIN_GROUP_ROLLOUTS rollouts or more: a fault
    one group shows and the whole batch does not (its kind is not among the whole batch's findings) comes first,
    `group` its value and `evidence["by"]` its column. The scan tests each of its m groups at level alpha / m
    (alpha the whole batch's one-sided level at Z_DETECT, Bonferroni), so over all groups and columns a clean
    batch raises a false alarm no more often than the whole batch's own test does. A batch without a loss token
    gets one finding, `no_loss_tokens` (bad), and nothing else."""
    if not bool(batch.loss_mask.any()):  # nothing was measured: no finding may read as "healthy"
        B = batch.shape[0]
        return [Finding("no_loss_tokens", "bad", f"No loss tokens: the loss mask is 0 on every token of the batch's "
                        f"{B} rollouts, so nothing could be diagnosed. Check which column is the loss mask "
                        f"(response_mask, loss_mask; --columns / columns= map another name).",
                        {"n_tokens": 0, "n_rollouts": B})]
    whole = _diagnose(batch, None)
    if by is None:
        hidden = hidden_faults(batch, whole)
        if any(f.severity != "ok" for f in hidden):  # a group's fault: the batch is not "healthy", whatever its mean
            whole = [f for f in whole if f.kind != "healthy"]
        return hidden + sorted(whole, key=lambda f: SEVERITY_RANK[f.severity])
    if by not in batch.metadata:
        raise ValueError(f"diagnose: by={by!r} is not a metadata column; the batch has "
                         f"{', '.join(sorted(batch.metadata)) or 'none'}")
    findings = whole
    for value, rows in groups(batch.metadata[by]).items():
        findings += [_in_group(f, by) for f in _diagnose(batch.select(rows), value)]
    return sorted(findings, key=lambda f: (SEVERITY_RANK[f.severity], f.group is not None))


def groups(column: list) -> dict[Any, list[int]]:
    """value -> the rollouts holding it, in order of first appearance."""
    out: dict[Any, list[int]] = {}
    for i, v in enumerate(column):
        out.setdefault(v, []).append(i)
    return out


def scanned_columns(batch: Batch) -> dict[str, dict[Any, list[int]]]:
    """The metadata columns `diagnose(batch)` tries, each as its groups (value -> rollouts): 2 to MAX_GROUPS
    distinct values, and a value that two rollouts share (a column that tells every rollout apart, a reward or a
    length in a small batch, names rollouts, not groups). A column of unhashable values is not tried."""
    out = {}
    for name, column in batch.metadata.items():
        try:
            g = groups(column)
        except TypeError:  # a list or a dict per rollout: not a grouping
            continue
        if 2 <= len(g) <= MAX_GROUPS and len(g) < len(column):
            out[name] = g
    return out


def scanned_groups(batch: Batch) -> dict[str, dict[Any, list[int]]]:
    """The groups the scan tests: those of `scanned_columns` with at least MIN_GROUP_ROLLOUTS rollouts (a column
    left with none is left out)."""
    out = {}
    for name, g in scanned_columns(batch).items():
        big = {v: rows for v, rows in g.items() if len(rows) >= MIN_GROUP_ROLLOUTS}
        if big:
            out[name] = big
    return out


def scan_z(comparisons: int) -> float:
    """The z a scan of `comparisons` groups tests each at: the one-sided level of Z_DETECT divided among them
    (Bonferroni), so the scan's chance of any false alarm stays at the whole batch's (5.39 at 8 groups, 5.63 at
    32, 5.82 at 100)."""
    alpha = _NORMAL.cdf(-Z_DETECT)  # ~2.9e-7
    return -_NORMAL.inv_cdf(alpha / max(comparisons, 1))


def hidden_faults(batch: Batch, whole: list[Finding]) -> list[Finding]:
    """The faults a group of a scanned column shows and the whole batch does not (a kind of HIDEABLE absent from
    `whole`), each group of `scanned_groups` tested at scan_z(their count); worst first, then the strongest
    evidence.

    One fault shows in every group that holds enough of its rollouts, often as another kind (a group of a few
    rollouts at temperature 0.7 can look like a truncation; mixed with others, like a lag). So the groups are read
    strongest first (z), and a group that shares rollouts with one already named is named only if its rollouts
    outside it still show the fault: env = math explains its prompts, a length or a reward group that holds some of
    its rollouts, and a second column that splits the batch the same way."""
    columns = scanned_groups(batch)
    m = sum(len(g) for g in columns.values())
    z = scan_z(m)
    seen = {f.kind for f in whole}
    if seen & SAMPLER_SIDE:
        seen |= SAMPLER_SIDE
    found: list[tuple[Finding, list[int]]] = []
    for name, g in columns.items():
        for value, rows in g.items():
            for f in _diagnose(batch.select(rows), value, z):
                if f.kind in HIDEABLE and f.kind not in seen:
                    found.append((_in_group(f, name, len(rows), batch.shape[0], m, z), rows))
    named: list[Finding] = []
    covered: set[int] = set()
    for f, rows in sorted(found, key=lambda fr: -fr[0].evidence.get("z", math.inf)):
        rest = [i for i in rows if i not in covered]
        if len(rest) < len(rows) and (len(rest) < MIN_GROUP_ROLLOUTS or not any(
                g.kind == f.kind for g in _diagnose(batch.select(rest), f.group, z))):
            continue  # explained by a group already named (too few rollouts left to test is explained too)
        named.append(f)
        covered.update(rows)
    return sorted(named, key=lambda f: SEVERITY_RANK[f.severity])  # stable: the strongest first within a severity


def _in_group(f: Finding, by: str, n_rows: int | None = None, n_batch: int | None = None,
              comparisons: int | None = None, z: float | None = None) -> Finding:
    """Finding f of a group of column `by`: evidence["by"] names the column; from the scan (n_rows given), the
    message says the whole batch does not show it and the evidence holds the scan's comparisons and level."""
    evidence = {**f.evidence, "by": by}
    message = f.message
    if n_rows is not None:
        evidence.update(group_rollouts=n_rows, comparisons=comparisons, z_detect=z)
        message = (f"Only in {by} = {f.group} ({n_rows} of {n_batch} rollouts; the whole batch does not show it, "
                   f"tested at {z:.2f} standard errors for the {comparisons} groups of the metadata columns): "
                   + message)
    return Finding(f.kind, f.severity, message, evidence, f.group)


def _diagnose(batch: Batch, group, z_detect: float = Z_DETECT) -> list[Finding]:
    findings: list[Finding] = []
    shift, agreement = find_shift(batch.trainer_logprobs.detach(), batch.inference_logprobs.detach(),
                                  batch.loss_mask)
    if shift:
        findings.append(_misalignment(shift, agreement))
    pairs = aligned_pairs(batch, shift)
    if pairs.l.numel() == 0:
        return [Finding("healthy", "ok", "No loss tokens to diagnose.", {"n_tokens": 0}, group)]
    t = run_tests(pairs, z_detect)
    stats = mismatch_stats(kept(pairs.l, t["keep"]))  # what the systematic causes do, without the outliers
    stats["n_left_out"] = int((~t["keep"]).sum())  # a few such tokens would swamp every mean: said apart
    if _fired(t["truncation"]):
        findings.append(_truncation(t["truncation"], stats))
    if _fired(t["temperature"]):
        findings.append(_temperature(t["temperature"], stats))
    if _fired(t["raw"]):
        findings.append(_raw_logprobs(t["raw"], stats))
    bad = ~t["keep"]
    temp_open = sampler_intervals(t, pairs.n_rollouts)["cannot_rule_out"].get("temperature", {"faulty": []})
    tail = temperature_tail(pairs.a, pairs.l, t["keep"], bad, temp_open["faulty"])  # (N,) a temperature's own
    caveated = bool(bad.any()) and bool(tail.equal(bad))  # every one: no kernel bug to lead with
    if bool(bad.any()) and not caveated:
        findings.append(_catastrophic(pairs, bad, tail, temp_open["faulty"]))
    if not any(_fired(t[k]) for k in ("truncation", "temperature", "raw")):  # no sampler fault: the trainer's?
        findings.append(_policy_lag(t["lag"], stats) if _fired(t["lag"]) else
                        _precision(pairs, t["keep"], stats, {k: t[k] for k in ("truncation", "temperature", "raw",
                                                                               "lag")}))
    if caveated:  # said after the verdict that names the temperature it cannot rule out
        findings.append(_catastrophic(pairs, bad, tail, temp_open["faulty"]))
    if all(f.severity == "ok" for f in findings):
        findings.append(Finding("healthy", "ok", "Trainer and sampler agree within the frameworks' guidance "
                                f"(mean exp|l| {stats['mult_prob_error']:.4f} <= NeMo-RL's "
                                f"{NEMO_MULT_PROB_ERROR}): no correction is needed for the mismatch itself.",
                                stats))
    findings = [_with_intervals(f, t, pairs.n_rollouts) for f in findings]
    for f in findings:
        object.__setattr__(f, "group", group)
    return findings


def _with_intervals(f: Finding, tests: dict[str, Any], n_rollouts: int) -> Finding:
    """f with what the batch can tell about the sampler's settings (`sampler_intervals`) when it is a verdict on the
    sampler (a sampler-side fault, noise or lag); a verdict that names no sampler fault also says, in its message,
    which faulty settings it cannot rule out and about how many rollouts would tell."""
    if f.kind not in SAMPLER_SIDE | {"precision_noise", "policy_lag"}:
        return f
    ev = sampler_intervals(tests, n_rollouts)
    words = "" if f.kind in SAMPLER_SIDE else intervals_words(ev, n_rollouts)
    return Finding(f.kind, f.severity, f.message + (" " + words if words else ""), {**f.evidence, **ev}, f.group)
