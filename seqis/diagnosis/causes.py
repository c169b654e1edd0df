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
                       0-50%), its share of the symmetric divergence E_mu[l (rho - 1)] = KL(pi || mu) +
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
import threading
from dataclasses import dataclass, field
from functools import cached_property
from statistics import NormalDist
from typing import Any

import torch

from ..core.types import Batch

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
TEMPERATURE_R2_BARE = 0.6  # without the entropy: l's squared correlation with log pi at branching tokens
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


@dataclass
class _Pairs:
    """The loss tokens of a batch as flat pairs (after any re-alignment), on the CPU."""

    a: torch.Tensor  # (N,) log pi, float32
    l: torch.Tensor  # (N,) log pi - log mu, float32
    mask: torch.Tensor  # (B, T) where the N tokens sit
    entropy: torch.Tensor | None  # (N,) the trainer's entropy, when the batch has it
    n_rollouts: int
    rows: torch.Tensor | None = None  # (N,) the rollout of each token
    advantages: torch.Tensor | None = None  # (N,) each token's advantage, float64

    def where(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(rollout, position) of the flat tokens at `index`."""
        rows, pos = self.mask.nonzero(as_tuple=True)
        return rows[index], pos[index]

    # each test reads these on the kept tokens: made once per batch, not once per test
    @cached_property
    def a64(self) -> torch.Tensor:
        return self.a.double()  # (N,)

    @cached_property
    def l64(self) -> torch.Tensor:
        return self.l.double()  # (N,)

    @cached_property
    def h64(self) -> torch.Tensor | None:
        return None if self.entropy is None else self.entropy.double()  # (N,)

    @cached_property
    def rho(self) -> torch.Tensor:
        return self.l64.clamp(-_SAFETY, _SAFETY).exp()  # (N,) rho, |l| bounded by verl's safety bound


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
    if bool((~t["keep"]).any()):
        findings.append(_catastrophic(pairs, ~t["keep"]))
    if not any(_fired(t[k]) for k in ("truncation", "temperature", "raw")):  # no sampler fault: the trainer's?
        findings.append(_policy_lag(t["lag"], stats) if _fired(t["lag"]) else
                        _precision(pairs, t["keep"], stats, {k: t[k] for k in ("truncation", "temperature", "raw",
                                                                               "lag")}))
    if all(f.severity == "ok" for f in findings):
        findings.append(Finding("healthy", "ok", "Trainer and sampler agree within the frameworks' guidance "
                                f"(mean exp|l| {stats['mult_prob_error']:.4f} <= NeMo-RL's "
                                f"{NEMO_MULT_PROB_ERROR}): no correction is needed for the mismatch itself.",
                                stats))
    for f in findings:
        object.__setattr__(f, "group", group)
    return findings


# ---------------------------------------------------------------------------------------------------------
# alignment and the flat pairs


def best_shift(trainer: torch.Tensor, inference: torch.Tensor, mask: torch.Tensor, shifts=(-2, -1, 0, 1, 2),
               max_tokens: int = 1 << 16) -> tuple[int, dict[int, float]]:
    """The shift k at which inference[:, t + k] agrees best with trainer[:, t] (median |difference| over
    positions where both are loss tokens, on the first rollouts up to max_tokens positions), and the
    agreement at every k. k != 0 only when it beats k = 0 by 4x: a batch that is merely noisy stays at 0."""
    t, i, m = _first_rollouts(trainer, inference, mask, max_tokens)
    agreement = {}
    for k in shifts:
        if abs(k) >= t.shape[1]:
            continue
        both, diff = _partners(t, i, m, k)
        d = diff[both].abs()
        agreement[k] = float(d.median()) if d.numel() else math.inf
    best = min(agreement, key=lambda k: (agreement[k], abs(k)))
    if best != 0 and not agreement[best] * 4 < agreement.get(0, math.inf):
        best = 0
    return best, agreement


def find_shift(trainer: torch.Tensor, inference: torch.Tensor, mask: torch.Tensor,
               shifts=(-2, -1, 0, 1, 2)) -> tuple[int, dict[int, float] | None]:
    """best_shift's shift (and its agreement when the shift is not 0), without a median per shift when the
    answer is 0, the usual one: a shift k wins only when its median |difference| is under a quarter of the
    in-place one, so at least half its pairs lie within that quarter; a count per shift says whether any
    could, and only then best_shift runs. (None for the agreement when the shift is 0.)"""
    t, i, m = _first_rollouts(trainer, inference, mask, 1 << 16)  # best_shift's default max_tokens
    in_place = (t - i)[m].abs()
    if 0 not in shifts or in_place.numel() == 0:
        return best_shift(trainer, inference, mask, shifts)
    agreement = float(in_place.median())
    if not agreement > 0:  # 0 (or NaN): no shift can beat it 4x
        return 0, None
    quarter = agreement / 4
    mf = m.float()  # (R, T) the counts in 0/1 floats (bool ops are slow paths on the CPU; exact below 2^24)
    T = t.shape[1]
    for k in shifts:
        if k == 0 or abs(k) >= T:
            continue
        lo, hi = max(0, -k), T - max(0, k)  # as _partners: positions t whose partner t + k exists
        both = mf[:, lo:hi] * mf[:, lo + k:hi + k]  # (R, T - |k|) 1 where both are loss tokens
        pairs = int(both.sum())
        close = torch.sub(t[:, lo:hi], i[:, lo + k:hi + k]).abs_().le_(quarter)  # (a NaN difference is not close)
        if pairs and 2 * int(close.mul_(both).sum()) >= pairs:
            return best_shift(trainer, inference, mask, shifts)  # k might win: every median, as it would
    return 0, None


def _first_rollouts(trainer: torch.Tensor, inference: torch.Tensor, mask: torch.Tensor,
                    max_tokens: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(R, T) the first rollouts up to max_tokens positions (at least one), the log-probs in float32."""
    B, T = trainer.shape
    rows = slice(0, max(1, min(B, max_tokens // max(T, 1))))
    return trainer[rows].float(), inference[rows].float(), mask[rows]


def _partners(t: torch.Tensor, i: torch.Tensor, m: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(R, T - |k|) where position t and its partner t + k are both loss tokens, and trainer[t] - inference[t + k]
    there (a new tensor)."""
    T = t.shape[1]
    lo, hi = max(0, -k), T - max(0, k)  # positions t whose partner t + k exists
    return m[:, lo:hi] & m[:, lo + k:hi + k], t[:, lo:hi] - i[:, lo + k:hi + k]


def realign(batch: Batch, shift: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(trainer, inference, mask) on the CPU in float32, the inference log-probs read `shift` positions later
    and the mask limited to finite pairs whose partner exists."""
    trainer = batch.trainer_logprobs.detach().cpu().float()
    inference = batch.inference_logprobs.detach().cpu().float()
    mask = batch.loss_mask.cpu()
    if shift:
        inference = torch.roll(inference, -shift, dims=1)  # (B, T) position t now holds t + shift
        partner = torch.roll(mask, -shift, dims=1)
        T = mask.shape[1]
        partner[:, max(0, T - shift):] = False  # rolled in from the other end
        partner[:, :max(0, -shift)] = False
        mask = mask & partner
    return trainer, inference, mask


def aligned_pairs(batch: Batch, shift: int = 0) -> _Pairs:
    """The loss tokens' (log pi, l) with the inference log-probs read `shift` positions later, each token's
    rollout and advantage, and the trainer's entropy when the batch has it."""
    trainer, inference, mask = realign(batch, shift)
    index = mask.reshape(-1).nonzero().squeeze(1)  # (N,) where the loss tokens sit, row by row
    a = trainer.reshape(-1).index_select(0, index)  # (N,) what trainer[mask] gives, with one search for both
    l = a - inference.reshape(-1).index_select(0, index)  # (N,)
    finite = torch.isfinite(l)
    if not bool(finite.all()):  # a log-prob of -inf or NaN on a loss token: leave it out
        keep = torch.zeros_like(mask)
        keep[mask] = finite
        mask, a, l, index = keep, a[finite], l[finite], index[finite]
    entropy = batch.extras.get("entropy")
    if entropy is not None:
        entropy = entropy.detach().cpu().float().reshape(-1).index_select(0, index)
        entropy = entropy if bool(torch.isfinite(entropy).all()) else None
    rows = torch.div(index, max(mask.shape[1], 1), rounding_mode="floor")  # (N,) the rollout of each token
    adv = batch.advantages.detach().cpu().double()
    adv = adv.index_select(0, rows) if adv.dim() == 1 else adv.reshape(-1).index_select(0, index)  # (N,)
    adv = adv if bool(torch.isfinite(adv).all()) else None
    return _Pairs(a, l, mask, entropy, int(batch.loss_mask.any(-1).sum()), rows, adv)


def _sample(x: torch.Tensor, n: int = 1 << 18) -> torch.Tensor:
    """Every k-th element, so at most about n remain (a fixed, seedless choice)."""
    return x[:: max(1, x.numel() // n)]


# ---------------------------------------------------------------------------------------------------------
# clustered estimates: tokens of one rollout are dependent, rollouts are not


def clustered_mean(x: torch.Tensor, rows: torch.Tensor) -> tuple[float, float]:
    """Mean of the (N,) values x and its standard error with the rollouts (rows) as clusters:
    se^2 = sum_j (sum_{t in j} (x_t - mean))^2 / N^2 (the CLT on per-rollout sums)."""
    x = x.double()
    n = x.numel()
    mean = float(x.sum()) / n
    per = cluster_sums(x - mean, rows)  # (R,)
    return mean, math.sqrt(float(per.pow(2).sum())) / n


def clustered_ratio(num: torch.Tensor, den: torch.Tensor, rows: torch.Tensor) -> tuple[float, float]:
    """sum num / sum den and its standard error by the delta method with rollouts as clusters:
    se = sqrt(sum_j (sum_{t in j} (num_t - r den_t))^2) / |sum den|."""
    num, den = num.double(), den.double()
    total = float(den.sum())
    if total == 0:
        return math.nan, math.inf
    r = float(num.sum()) / total
    per = cluster_sums(num - r * den, rows)  # (R,)
    return r, math.sqrt(float(per.pow(2).sum())) / abs(total)


def _ci(value: float, se: float) -> list[float]:
    return [value - Z_CI * se, value + Z_CI * se]


def _ratio(p: _Pairs, keep: torch.Tensor) -> torch.Tensor:
    return kept(p.rho, keep)  # (n,) rho on the kept tokens


def kept(x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """x[keep], without the copy when every token is kept (a batch without catastrophic tokens, the usual one)."""
    index = _kept_index(keep)
    return x if index is None else x.index_select(0, index)


_KEPT = threading.local()  # .last: (keep, its version, its index), the last mask this thread asked about


def _kept_index(keep: torch.Tensor) -> torch.Tensor | None:
    """(n,) where keep is true, or None when it is true everywhere; made once per mask, as the tests read a
    dozen tensors with one (a bool index searches the mask each time). The entry (one per thread: the explorer
    diagnoses in several) holds the mask itself, so its memory is not reused while it stands, and its version
    counter says whether it was written since."""
    last = getattr(_KEPT, "last", None)
    if last is not None and last[0] is keep and last[1] == keep._version:
        return last[2]
    every = keep.numel() == 0 or bool(keep.view(torch.uint8).min())  # (a bool all() is 20x slower on the CPU)
    index = None if every else keep.nonzero().squeeze(1)
    _KEPT.last = keep, keep._version, index
    return index


def cluster_sums(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """(R,) the sums of the (N,) values x over each rollout that rows holds (in order of rollout), in float64.
    Rows in order (as aligned_pairs makes them) are summed as consecutive runs, else scattered."""
    x = x.double()
    if x.numel() == 0:
        return x
    in_order = rows.numel() < 2 or int((rows[1:] - rows[:-1]).min()) >= 0
    if in_order:
        counts = torch.bincount(rows)  # (max row + 1,)
        return torch.segment_reduce(x, "sum", lengths=counts[counts > 0])
    per = torch.zeros(int(rows.max()) + 1, dtype=torch.float64).index_add_(0, rows, x)
    return per[torch.bincount(rows) > 0]


# ---------------------------------------------------------------------------------------------------------
# the tests behind each finding


def run_tests(p: _Pairs, z_detect: float = Z_DETECT) -> dict[str, Any]:
    """Every test on a batch's pairs, each result's "detected" settled against the others; "keep": the tokens
    that are not catastrophic.

    - catastrophic tokens (|l| > ln 20) leave every test; a detected temperature re-reads them off its line (its
      own tail is not a catastrophe);
    - a detected temperature (with the entropy) overrides the truncation test: a sampler sharper than the trainer
      misses the rare tokens where pi / mu is large, so in a finite batch its mean pi / mu can fall below 1, and
      the temperature's own checks (two-sided l, R^2, a positive share) refuse truncations; without the entropy
      the temperature is not identified against a truncation, so a truncation that fires wins;
    - raw log-probs are tested only when no truncation or temperature fired (both move rho (a + H) too);
    - without the entropy, a temperature whose mismatch also points along the advantages is not told from lag:
      the advantages decide."""
    catastrophic = p.l.abs() > CATASTROPHIC_LOG_RATIO  # (N,)
    keep = ~catastrophic
    trunc = truncation_test(p, keep, z_detect)
    temp = temperature_fit(p, keep, z_detect)
    if _fired(temp):
        if temp["uses_entropy"]:
            trunc = {**trunc, "detected": False}
        elif trunc["detected"]:
            temp = {**temp, "detected": False}
    if _fired(temp):
        keep = ~((p.l - temp["line"]).abs() > CATASTROPHIC_LOG_RATIO)
    raw = None if trunc["detected"] or _fired(temp) else raw_logprobs_test(p, keep, z_detect)
    lag = policy_lag_test(p, keep, z_detect)
    if _fired(temp) and not temp["uses_entropy"] and _fired(lag):
        temp = {**temp, "detected": False}
    return {"truncation": trunc, "temperature": temp, "raw": raw, "lag": lag, "keep": keep}


def _fired(test: dict[str, Any] | None) -> bool:
    return test is not None and bool(test["detected"])


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


def score_z(d: torch.Tensor) -> float:
    """sum d / sqrt(sum d^2) for increments d that have mean zero given the past under the null (a martingale):
    asymptotically N(0, 1) under the null whatever the dependence between tokens, its variance estimated under
    the null (the score test), so a batch's spread between contexts does not dilute it."""
    d = d.double()
    q = float(d.pow(2).sum())
    return float(d.sum()) / math.sqrt(q) if q > 0 else 0.0


def one_sided(l: torch.Tensor) -> bool:
    """Under 5% of |l|'s mass above 0: what a truncation leaves (l = log of the kept mass <= 0), not a
    temperature (l = s log pi + c(context) takes both signs)."""
    total = float(l.abs().sum(dtype=torch.float64))
    return total > 0 and float(l.clamp(min=0).sum(dtype=torch.float64)) / total < 0.05


def truncation_test(p: _Pairs, keep: torch.Tensor, z_detect: float = Z_DETECT) -> dict[str, Any]:
    """Null E_mu[rho] = 1 (any full-support sampler); against E_mu[rho] = pi(K) < 1 (a sampler keeping K).
    The increments rho_t - 1 have mean zero given the past under the null, so z = -score_z(rho - 1); detected
    when z > Z_DETECT, the deficit 1 - mean rho is above MIN_DEFICIT and the mean log offset is negative.
    log_offset = mean l (the mean log kept mass, when the sampler's untruncated distribution is the trainer's)
    and kept_mass = mean rho, each with its 95% ci clustered by rollout."""
    n = int(torch.count_nonzero(keep))
    if n < _MIN_FIT_TOKENS:
        return {"detected": False, "n_tokens": n}
    rows = kept(p.rows, keep)
    rho = _ratio(p, keep)
    mass, mass_se = clustered_mean(rho, rows)
    offset, offset_se = clustered_mean(kept(p.l64, keep), rows)
    z = -score_z(rho - 1)
    detected = z > z_detect and 1 - mass > MIN_DEFICIT and offset < 0
    return {"detected": detected, "log_offset": offset, "ci": _ci(offset, offset_se), "kept_mass": mass,
            "kept_mass_ci": _ci(mass, mass_se), "z": z, "n_tokens": n}


def temperature_fit(p: _Pairs, keep: torch.Tensor, z_detect: float = Z_DETECT) -> dict[str, Any] | None:
    """The sampler's temperature relative to the trainer's, tau = 1 / (1 - s), from l = s a + c(context).

    With the trainer's entropy: s = sum (l - f) g / sum (a + H) g over the kept tokens, g = rho (a + H), f a
    quadratic in H fitted by least squares to l - s0 (a + H) (s0: the same estimate with f = 0). Both are
    exact moment estimators whatever f is (E_mu[g | context] = 0); f only removes most of the per-context
    log-partition from the error. r2: the share of l's variance the line s (a + H) + f explains; share =
    s sum a (rho - 1) / sum l (rho - 1), the part of the symmetric divergence it explains (1 for a pure
    temperature in expectation, but carried by rare tokens). Without the entropy: s = sum l (rho - 1) /
    sum a (rho - 1), no share, and r2 is l's squared correlation with log pi at branching tokens. Detected when
    |s| / se > Z_DETECT, |tau - 1| > MIN_TEMPERATURE_SHIFT, l is not one-sided, r2 >= TEMPERATURE_R2 (with the
    entropy) or TEMPERATURE_R2_BARE (without) and share > 0.
    None with fewer than _MIN_FIT_TOKENS tokens."""
    n = int(torch.count_nonzero(keep))
    if n < _MIN_FIT_TOKENS:
        return None
    a, l, rows = kept(p.a64, keep), kept(p.l64, keep), kept(p.rows, keep)
    rho = _ratio(p, keep)
    uses_entropy = p.entropy is not None
    if uses_entropy:
        h = kept(p.h64, keep)
        x = a + h  # (n,) log pi + H: mean zero under pi at every context
        g = rho * x  # (n,) the instrument
        s0, _ = clustered_ratio(l * g, x * g, rows)
        X = torch.stack([torch.ones_like(h), h, h * h], 1)  # (n, 3) context features
        beta = torch.linalg.lstsq(X, (l - s0 * x)[:, None]).solution[:, 0]  # (3,)
        f = X @ beta  # (n,) a control variate for the per-context log-partition
        s, se = clustered_ratio((l - f) * g, x * g, rows)
    else:
        g = rho - 1
        s, se = clustered_ratio(l * g, a * g, rows)
    if not math.isfinite(s):
        return None
    jeffreys = float((l * (rho - 1)).sum())
    share = s * float((a * (rho - 1)).sum()) / jeffreys if uses_entropy and jeffreys > 0 else None
    tau = 1 / (1 - s) if s < 1 else math.inf
    tau_ci = [1 / (1 - v) if v < 1 else math.inf for v in _ci(s, se)]
    # the line through the tokens, for telling catastrophic tokens from the temperature's own tail
    a_all = p.a64
    if uses_entropy:
        h_all = p.h64
        ctx = torch.stack([torch.ones_like(h_all), h_all, h_all * h_all], 1) @ torch.linalg.lstsq(
            X, (l - s * x)[:, None]).solution[:, 0]  # (N,) fitted c(context) - s H
        line = (s * (a_all + h_all) + ctx).float()
    else:
        line = (s * a_all + float((l - s * a).mean())).float()
    if uses_entropy:
        resid = l - kept(line, keep).double()
        r2 = 1 - float(resid.pow(2).sum()) / max(float((l - l.mean()).pow(2).sum()), 1e-300)
    else:  # the line misses c(context): how linear l is in log pi, over the branching tokens (least squares)
        sel = a < _BRANCHING if int((a < _BRANCHING).sum()) >= _MIN_FIT_TOKENS else torch.ones_like(a, dtype=torch.bool)
        r2 = float(torch.corrcoef(torch.stack([a[sel], l[sel]]))[0, 1] ** 2) if int(sel.sum()) > 2 else 0.0
        r2 = r2 if math.isfinite(r2) else 0.0
    z = abs(s) / se if se > 0 else math.inf
    explains = r2 >= (TEMPERATURE_R2 if uses_entropy else TEMPERATURE_R2_BARE)
    detected = (z > z_detect and abs(tau - 1) > MIN_TEMPERATURE_SHIFT and explains
                and (share is None or share > 0) and not one_sided(l))
    return {"slope": s, "temperature": tau, "ci": tau_ci, "slope_ci": _ci(s, se), "z": z, "share": share, "r2": r2,
            "n_fit": n, "line": line, "uses_entropy": uses_entropy, "detected": detected}


def raw_logprobs_test(p: _Pairs, keep: torch.Tensor, z_detect: float = Z_DETECT) -> dict[str, Any] | None:
    """Null E_mu[rho (a + H) | context] = 0: the tokens came from the distribution the sampler reported. Needs
    the trainer's entropy (None without it). z = |score_z(rho (a + H))|; detected when z > Z_DETECT,
    |entropy_gap| > MIN_ENTROPY_GAP and the log-probs agree (|mean l| under a tenth of the gap: a truncation
    the first test could not yet see also moves rho (a + H), but leaves l far from 0). entropy_gap = mean of
    -a - H over the kept loss tokens, with its 95% ci clustered by rollout."""
    n = int(torch.count_nonzero(keep))
    if p.entropy is None or n < _MIN_FIT_TOKENS:
        return None
    a, h, rows = kept(p.a64, keep), kept(p.h64, keep), kept(p.rows, keep)
    z = abs(score_z(_ratio(p, keep) * (a + h)))
    gap, gap_se = clustered_mean(-a - h, rows)
    offset = float(kept(p.l64, keep).mean())
    agree = abs(offset) < 0.1 * abs(gap)
    return {"detected": z > z_detect and abs(gap) > MIN_ENTROPY_GAP and agree, "entropy_gap": gap,
            "ci": _ci(gap, gap_se), "z": z, "log_offset": offset, "n_tokens": n}


def policy_lag_test(p: _Pairs, keep: torch.Tensor, z_detect: float = Z_DETECT) -> dict[str, Any] | None:
    """Null: the trainer's policy scores no higher than the sampler's on this batch's rewards. gain = mean over
    rollouts of G_j = sum_t A_t (rho_t - 1) (the per-decision IS estimate of E_pi[A] - E_mu[A]), its se from
    the rollouts' G_j (independent across rollouts). Detected when gain / se > Z_DETECT (one-sided: ahead).
    None without finite, varying advantages."""
    if p.advantages is None or int(torch.count_nonzero(keep)) < _MIN_FIT_TOKENS:
        return None
    adv = kept(p.advantages, keep)
    if float(adv.abs().max()) == 0:
        return None
    per = cluster_sums(adv * (_ratio(p, keep) - 1), kept(p.rows, keep))  # (R,) G_j of the rollouts with kept tokens
    gain = float(per.mean())
    se = float(per.std()) / math.sqrt(per.numel()) if per.numel() > 1 else math.inf
    z = gain / se if se > 0 else 0.0
    return {"detected": z > z_detect, "gain": gain, "ci": _ci(gain, se), "z": z, "n_rollouts": per.numel()}


def noise_floor(p: _Pairs, keep: torch.Tensor) -> float:
    """Median |l| over the kept branching tokens; with fewer than _MIN_FIT_TOKENS of them, over the
    _MIN_FIT_TOKENS kept tokens the trainer finds least likely. Not over all tokens: at a near-certain token
    rounding leaves l = 0 exactly, so a peaked batch's median would call a bf16 sampler exact."""
    sel = keep & (p.a < _BRANCHING)
    if int(sel.sum()) < _MIN_FIT_TOKENS:
        a = torch.where(keep, p.a, math.inf)
        sel = torch.zeros_like(keep)
        sel[a.topk(min(_MIN_FIT_TOKENS, int(keep.sum())), largest=False).indices] = True
    return float(_sample(p.l[sel]).abs().median()) if bool(sel.any()) else 0.0


def rounding_formats(floor: float) -> list[str]:
    """The number formats whose rounding gives a noise floor of this size: u/4 .. 32 u of the format's unit
    roundoff u (ROUNDING_RANGE), finest first."""
    lo, hi = ROUNDING_RANGE
    return [name for name, u in sorted(UNIT_ROUNDOFF.items(), key=lambda kv: kv[1]) if lo * u <= floor <= hi * u]


def rounding_dtype(floor: float) -> str:
    """The formats a noise floor is consistent with, in words ("bf16 or fp16"); "none (exact)" for a floor
    below fp32's range, "finer than fp16" between fp32's and fp16's, "coarser than fp8" above every range."""
    names = rounding_formats(floor)
    if names:
        return " or ".join(reversed(names))  # the coarsest, the likelier sampler format, first
    lo, hi = ROUNDING_RANGE
    if floor < lo * UNIT_ROUNDOFF["fp32"]:
        return "none (exact)"
    if floor > hi * UNIT_ROUNDOFF["fp8"]:
        return "coarser than fp8"
    return "finer than fp16"


# ---------------------------------------------------------------------------------------------------------
# the findings and what to do about them


def _misalignment(shift: int, agreement: dict[int, float]) -> Finding:
    late = "late" if shift > 0 else "early"
    return Finding(
        "token_misalignment", "bad",
        f"The inference log-probs sit {abs(shift)} position(s) {late}: they match the trainer's "
        f"{agreement[0] / max(agreement[shift], 1e-12):.0f}x better shifted by {shift}. Re-align them (check "
        "where the response starts and whether the logits were shifted) before any correction: every ratio "
        "of this batch pairs the wrong tokens.",
        {"shift": shift, "agreement_in_place": agreement[0], "agreement_shifted": agreement[shift],
         "agreement": agreement})


def temperature_estimable(fit: dict[str, Any]) -> bool:
    """Whether the fitted slope s of l on log pi gives a temperature: tau = 1 / (1 - s) is finite and positive
    only for s < 1 (a sampler at any finite temperature has s = 1 - 1/tau < 1)."""
    return math.isfinite(fit["temperature"])


def tau_interval(ci: list[float], spec: str = ".3g") -> str:
    """A temperature's 95% interval in words: '1.02-1.08'; '1.02 to unbounded' when the slope's interval reaches
    1 (tau = 1 / (1 - s) has no upper end); 'not estimable' when its standard error is not a number."""
    lo, hi = ci
    if math.isnan(lo) or math.isnan(hi) or math.isinf(lo):
        return "not estimable"
    return f"{lo:{spec}} to unbounded" if math.isinf(hi) else f"{lo:{spec}}-{hi:{spec}}"


def _slope_words(fit: dict[str, Any], *notes: str) -> str:
    """'+1.402 (95% CI +1.137 to +1.667; notes...)': the fitted slope of l on log pi, its interval when it has one."""
    lo, hi = fit["slope_ci"]
    said = ([f"95% CI {lo:+.3f} to {hi:+.3f}"] if math.isfinite(lo) and math.isfinite(hi) else []) + list(notes)
    return f"{fit['slope']:+.3f}" + (f" ({'; '.join(said)})" if said else "")


def temperature_words(fit: dict[str, Any], spec: str = ".3g") -> str:
    """'temperature 1.05 (95% CI 1.02-1.08)', or, when the slope is at or above 1, 'temperature not estimable:'
    and why (never 'inf (inf-inf)')."""
    if not temperature_estimable(fit):
        return (f"temperature not estimable: the log-ratio's slope on log pi is {_slope_words(fit)}, at or above "
                "1, which no finite temperature gives (tau = 1 / (1 - slope))")
    return f"temperature {fit['temperature']:{spec}} (95% CI {tau_interval(fit['ci'], spec)})"


def _temperature(fit: dict[str, Any], stats: dict[str, float]) -> Finding:
    tau = fit["temperature"]
    level = _level(stats)
    how = (f"the line explains {fit['r2']:.0%} of its variance" if fit["uses_entropy"] else
           "fitted without the trainer's entropy, so how much of the mismatch it explains is not known")
    if temperature_estimable(fit):
        said = (f"The sampler runs at {tau:.3g}x the trainer's temperature (95% CI {tau_interval(fit['ci'])}; "
                f"log-ratio linear in log pi, slope {fit['slope']:+.3f} = 1 - 1/tau, {how}): divide the trainer's "
                "logits by the sampling temperature (or sample at the trainer's). ")
    else:  # s >= 1: tau = 1 / (1 - s) would be infinite or negative
        said = (f"The log-ratio rises with log pi at slope {_slope_words(fit, how)}: a sampler at temperature "
                "tau gives slope 1 - 1/tau, below 1 at every finite tau, so the temperature is not estimable. A "
                "slope at or above 1 is a sampler far hotter than the trainer (nearly flat over the tokens) or "
                "something else that moves the log-ratio with log pi: check the sampler's temperature and logits "
                "processing" + ("" if fit["uses_entropy"] else " (the trainer's entropy would sharpen the fit)")
                + ". ")
    return Finding(
        "temperature_mismatch", "warn" if level == "ok" else "bad", said + _threshold_clause(stats),
        {"temperature": tau, "ci": fit["ci"], "slope": fit["slope"], "slope_ci": fit["slope_ci"], "z": fit["z"],
         "share": fit["share"], "r2": fit["r2"] if fit["uses_entropy"] else None, "n_fit": fit["n_fit"],
         "uses_entropy": fit["uses_entropy"], **stats})


def _truncation(t: dict[str, Any], stats: dict[str, float]) -> Finding:
    level = _level(stats)
    offset, (lo, hi) = t["log_offset"], t["ci"]
    return Finding(
        "sampler_truncation", "warn" if level == "ok" else "bad",
        f"The sampler renormalises over a top-p / top-k set the trainer does not: E_mu[pi/mu], 1 for any "
        f"sampler that can draw every token, is {t['kept_mass']:.4f} ({t['z']:.0f} standard errors below 1), "
        f"and the log-ratio is {offset:+.4f} nats per token on average (95% CI {lo:+.4f} to {hi:+.4f}; the "
        f"kept mass is {math.exp(offset):.3f}). Apply the same top-p / top-k to the trainer's logits, or have "
        "the sampler return its unprocessed log-probs. " + _threshold_clause(stats),
        {"log_offset": offset, "ci": t["ci"], "kept_mass": t["kept_mass"], "kept_mass_ci": t["kept_mass_ci"],
         "z": t["z"], **stats})


def _raw_logprobs(r: dict[str, Any], stats: dict[str, float]) -> Finding:
    gap, (lo, hi) = r["entropy_gap"], r["ci"]
    sharper = "sharper" if gap < 0 else "flatter"
    return Finding(
        "raw_logprobs", "bad",
        f"The tokens are {sharper} than the distribution the sampler reported: -log pi(y) exceeds the trainer's "
        f"entropy by {gap:+.3f} nats per token (95% CI {lo:+.3f} to {hi:+.3f}) while the log-probs agree, so "
        "the sampler drew from a processed distribution (temperature, top-p, top-k) and reported raw log-probs "
        "(vLLM's logprobs_mode='raw_logprobs'). Report the processed log-probs (logprobs_mode="
        "'processed_logprobs'), or sample without processing: every importance ratio of this batch is "
        "computed against the wrong distribution. " + _threshold_clause(stats),
        {"entropy_gap": gap, "ci": r["ci"], "z": r["z"], **stats})


def _policy_lag(lag: dict[str, Any], stats: dict[str, float]) -> Finding:
    level = _level(stats)
    lo, hi = lag["ci"]
    need = ("below every framework's line, but a trainer ahead of its sampler needs an importance correction all "
            "the same" if level == "ok" else "past the frameworks' lines: correct it and bound the lag")
    return Finding(
        "policy_lag", level,
        f"A systematic mismatch from the trainer side, not a sampler fault: the trainer's policy scores higher "
        f"than the sampler's on this batch's own rewards (the importance-sampling estimate of the gain, sum_t "
        f"A (rho - 1) per rollout, is {lag['gain']:+.3g}, 95% CI {lo:+.3g} to {hi:+.3g}, {lag['z']:.1f} standard "
        f"errors above 0), which a sampler's rounding, truncation or temperature cannot do: the trainer's "
        f"weights are ahead of the sampler's (policy lag, an asynchronous step). No sampler setting fixes it; "
        f"it is {need} (NeMo-RL's async GRPO guide requires importance-sampling correction for convergence; "
        "verl's rollout correction treats model staleness as an off-policy gap; prime-rl's default loss is "
        "built for max_async_level 2). " + _threshold_clause(stats),
        {"gain": lag["gain"], "ci": lag["ci"], "z": lag["z"], "n_rollouts": lag["n_rollouts"], **stats})


def _catastrophic(p: _Pairs, bad: torch.Tensor) -> Finding:
    count = int(bad.sum())
    index = bad.nonzero()[:, 0]  # (count,)
    rows, pos = p.where(index)
    share_rollouts = len(set(rows.tolist())) / max(p.n_rollouts, 1)
    worst = p.l[index].abs().topk(min(count, 20)).indices
    low_prob = float((p.a[bad] < math.log(0.05)).double().mean())
    severity = "bad" if share_rollouts > VERL_VETO_FRACTION else "warn"
    return Finding(
        "catastrophic_tokens", severity,
        f"{count} token(s) ({count / p.l.numel():.2%} of loss tokens, in {share_rollouts:.1%} of rollouts) "
        f"have |log-ratio| > ln 20, {low_prob:.0%} of them on tokens the trainer gives under 5%: look for a "
        "kernel bug in the sampler at those tokens, and meanwhile reject their rollouts (a token band, verl's "
        f"veto at 1e-4 or a max criterion; verl calls a veto fraction above {VERL_VETO_FRACTION} too high).",
        {"count": count, "share": count / p.l.numel(), "rollout_share": share_rollouts, "low_prob_share": low_prob,
         "max_abs_log_ratio": float(p.l.abs()[bad].max()),
         "where": [[int(rows[k]), int(pos[k])] for k in worst.tolist()]})


def _precision(p: _Pairs, keep: torch.Tensor, stats: dict[str, float], tests: dict[str, Any]) -> Finding:
    floor = noise_floor(p, keep)
    dtype = rounding_dtype(floor)
    level = _level(stats)
    ruled_out = _ruled_out(tests)
    size = (f"{floor:.2g} nats at branching tokens ({floor / UNIT_ROUNDOFF['bf16']:.2g} bf16 unit roundoffs)")
    if rounding_formats(floor):
        what = (f"the size {dtype} rounding leaves; the data do not tell rounding from any other two-sided mismatch "
                "of that size (a kernel difference, policy lag the advantages do not show)")
    else:
        what = f"no common format's rounding leaves a floor of that size ({dtype})"
    advice = ("a geometric or token band absorbs it" if level == "ok" else
              "more than the frameworks accept: correct it (a geometric band or sequence TIS) and look for the "
              "source")
    return Finding(
        "precision_noise", level,
        f"No sampler fault shows ({ruled_out}). What remains is two-sided noise of {size}: {what}; {advice}. "
        + _threshold_clause(stats),
        {"dtype": dtype, "dtypes": rounding_formats(floor), "noise_floor": floor,
         "roundoffs_bf16": floor / UNIT_ROUNDOFF["bf16"], "tests": _test_summary(tests), **stats})


def _ruled_out(tests: dict[str, Any]) -> str:
    """What the tests that did not fire saw, in words."""
    out = []
    t = tests["truncation"]
    if "kept_mass" in t:
        lo, hi = t["kept_mass_ci"]
        out.append(f"E_mu[pi/mu] {t['kept_mass']:.4f}, 95% CI {lo:.4f}-{hi:.4f}: no truncation")
    temp = tests["temperature"]
    if temp is not None:
        out.append(temperature_words(temp, ".3f"))
    raw = tests["raw"]
    if raw is not None:
        lo, hi = raw["ci"]
        out.append(f"entropy gap {raw['entropy_gap']:+.3f} ({lo:+.3f} to {hi:+.3f})")
    lag = tests["lag"]
    if lag is not None:
        out.append(f"not along the advantages ({lag['z']:+.1f} standard errors)")
    return "; ".join(out) or "too few tokens to test"


def _test_summary(tests: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each test's estimate, ci and z, for the evidence (plain numbers)."""
    keys = {"truncation": ("kept_mass", "kept_mass_ci", "z"), "temperature": ("temperature", "ci", "z", "share"),
            "raw": ("entropy_gap", "ci", "z"), "lag": ("gain", "ci", "z")}
    return {name: {k: t[k] for k in keys[name] if k in t} for name, t in tests.items() if t is not None}


def _threshold_clause(stats: dict[str, float]) -> str:
    chi2 = stats["chi2_token"]  # mean of rho^2 - 1: below 0 only by sampling noise (a chi-square is at least 0)
    said = f"{chi2:.2e}" if chi2 >= 0 else f"0 (the estimate came out at {chi2:.1e}: noise, the true value is >= 0)"
    left = stats.get("n_left_out", 0)
    over = (f"Over the {stats['n_tokens']:,} loss tokens besides the {left} catastrophic one{'s' if left > 1 else ''}"
            if left else "Batch")
    return (f"{over}: mean exp|l| {stats['mult_prob_error']:.4f} (NeMo-RL investigates above "
            f"{NEMO_MULT_PROB_ERROR}), KL {stats['kl_k1']:.2e} (verl: significant above {VERL_KL}), chi2 "
            f"{said} (verl: severe above {VERL_CHI2}).")
