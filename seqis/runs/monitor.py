"""Trainer-side metrics: the flat dict of floats a trainer hands its logger (W&B, TensorBoard, MLflow) each step.

    from seqis import Batch
    from seqis.runs.monitor import step_metrics
    batch = Batch(trainer_logprobs=logp.detach(), inference_logprobs=sampler_logp, advantages=adv, loss_mask=mask)
    wandb.log(step_metrics(batch, corrections=["seq_tis", "verl/bypass_pg_geo_rs"], by="env_name"), step=step)

Keys (prefix "seqis/" by default):

  seqis/<name>              every `diagnostics` statistic (kl_k1, kl_k3, chi2_token, ..., abs_ratio_mean,
                            tokens_in_0.999_1.002 and rollouts_in_0.999_1.002 for each band, n_rollouts, n_tokens)
  seqis/<key>/<metric>      each correction's metrics (key: the registry name or preset key as given)
  seqis/findings/<kind>     each finding kind of seqis.diagnosis.causes (KINDS): 0 ok or not found, 1 warn, 2 bad
  seqis/<group>/...         with `by` (a metadata column): all of the above again for each of its values

Every key is there at every step (a kind not found is 0), so a logger's charts keep their lines. The whole step
is one pass per group: one Ratios (the log-ratios and their per-rollout sums) that `run_many` evaluates every
correction on and `diagnostics` reads, and `diagnose`'s findings.

The percentiles of |l| (abs_log_ratio_p50, _p99) read the loss tokens among about PERCENTILE_SAMPLE = 32,768
positions at a fixed odd stride (exact below that; rank error ~sqrt(q (1 - q) / n) for n loss tokens read: ~0.4
and ~0.07 percentile points at the 18.8k of 256 x 4096 ragged rollouts); every other statistic, abs_log_ratio_max
among them, reads every token. An exact selection of two ranks over 1M positions costs ~4 ms, more than a seq_tis
step. percentile_sample=None gives them exactly.

The findings read a bounded, fixed sample: whole rollouts at a stride over the group's rollouts, up to
`findings_tokens` loss tokens (FINDINGS_TOKENS = 16,384 by default; `findings_rows` picks them, no random
draw). The statistics and the corrections read every token. At that budget the findings see about six times the
tokens of the power table's whole draw (docs/diagnose.md, ~2.7k tokens: truncation, temperatures of 0.95 / 1.05
and beyond, raw log-probs after a temperature of 0.9, a kernel bug on 0.2% of tokens found in every or nearly
every batch; the smallest effect a test finds shrinks about as 1/sqrt(tokens)). Two things it does not keep:
policy lag is tested over rollouts, not tokens (the table's 5-9 of 12 are at 4x the rollouts), and a sample of
long rollouts holds few (6 of 256 x 4096 ragged ones); a catastrophic token in a rollout outside the sample is
not a finding (abs_log_ratio_max, over every token, still shows it). `diagnose(batch)` (and the scan) on the
whole batch is the full-power call; findings_tokens=None gives it here.

`names="verl"` or `names="prime-rl"` adds the framework's own names for the statistics it logs, computed with
its arithmetic, beside seqis's (the same prefix before them: prefix="" gives exactly the framework's keys):

  verl      rollout_corr/{kl, k3_kl, chi2_token, chi2_seq, ppl_ratio, training_ppl, training_log_ppl,
            rollout_ppl, rollout_log_ppl, log_ppl_diff, log_ppl_abs_diff, log_ppl_diff_max, log_ppl_diff_min}:
            verl's off-policy metrics (verl/trainer/ppo/rollout_corr_helper.py, compute_offpolicy_metrics, verl
            0.9.1): token means over the batch and means over rollouts, log-ratios clamped to +-20 where verl
            clamps them. verl averages over every row, seqis over rollouts with a loss token: the same on
            batches without empty rollouts. Its IS and rejection metrics (rollout_is_*, rollout_rs_*) are left
            out: they describe verl's configured correction, which seqis's own per-correction metrics cover.
  prime-rl  mismatch_kl/all/mean (with `by`: mismatch_kl/<group>/mean, prime-rl's per-environment name), the
            token mean of k3 as prime-rl's trainer logs it (src/prime_rl/trainer/rl/train.py); and per
            correction <key>/is_masked/mean and /max: prime-rl's loss metrics are per sequence (compute_loss
            runs the loss per packed sequence), so these are the mean and max over rollouts of each rollout's
            dropped fraction. Its masked_mismatch_kl / unmasked_mismatch_kl (also means of per-rollout means)
            are left out: seqis's token-level ones are under seqis/<key>/.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import torch

from ..core.compose import Composition
from ..core.ratios import Ratios
from ..core.types import Batch, Config, EstimatorOutput
from ..diagnosis.causes import KINDS, Finding, diagnose
from ..diagnosis.statistics import diagnostics
from ..evaluators.fast import ratios_for
from ..registry import resolve, run_many

FINDINGS_TOKENS = 1 << 14  # step_metrics' findings read whole rollouts up to this many loss tokens per group
PERCENTILE_SAMPLE = 1 << 15  # and its percentiles of |l| the loss tokens among about this many positions
LEVELS = {"ok": 0.0, "warn": 1.0, "bad": 2.0}  # a finding's severity as the number logged
VERL_SAFETY_BOUND = 20.0  # verl clamps log-ratios to +-20 before exponentiating (rollout_corr_helper.py)


@dataclass(frozen=True)
class GroupSummary:
    """One group's statistics: the whole batch (group None) or the rollouts holding one value of `by`."""

    group: str | None
    batch: Batch
    ratios: Ratios
    diagnostics: dict[str, float]
    outputs: dict[str, EstimatorOutput]  # label -> the correction's output
    findings: list[Finding]  # worst first
    findings_rows: torch.Tensor | None = None  # (R,) the rollouts the findings read; None: all of them


def groups(batch: Batch, by: str | None) -> list[tuple[str | None, Batch]]:
    """(None, the whole batch), then (value, its rollouts) for each value of the metadata column `by`, values as
    strings in sorted order (a None value is the group "None")."""
    out = [(None, batch)]
    if by is None:
        return out
    if by not in batch.metadata:
        raise ValueError(f"no metadata column '{by}' to group by (columns: {', '.join(batch.metadata) or 'none'})")
    values = [str(v) if v is not None else "None" for v in batch.metadata[by]]
    for value in sorted(set(values)):
        out.append((value, batch.select([i for i, v in enumerate(values) if v == value])))
    return out


Corrections = Iterable[str | tuple[str, Config | Composition | None]] | Mapping[str, Config | Composition | None]


def labelled(corrections: Corrections) -> dict[str, Composition]:
    """label -> composition: a name or preset key (its defaults), (name, cfg) or (label, Composition) pairs, or a
    {name: cfg} / {label: Composition} dict. A label given twice keeps the later, as in run_many."""
    items = corrections.items() if isinstance(corrections, Mapping) else corrections
    out = {}
    for item in items:
        label, how = (item, None) if isinstance(item, str) else tuple(item)
        if not isinstance(label, str) or not label:
            raise ValueError(f"a correction is named by a registry name, a preset key or a label; got {label!r}")
        out[label] = how if isinstance(how, Composition) else resolve(label, how)
    return out


def findings_rows(length: torch.Tensor, budget: int | None) -> torch.Tensor | None:
    """The rollouts a group's findings read under a budget of loss tokens: of the rollouts with a loss token,
    every k-th from the first (k = ceil(their tokens / budget)), as many of those in order as fit in the budget
    (at least one). None when the budget is None or the whole group fits. length: (B,) each rollout's loss
    tokens. A fixed stride, no random draw: the same batch gives the same rollouts on every call."""
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 1):
        raise ValueError(f"findings_tokens must be a positive number of loss tokens or None, got {budget!r}")
    total = int(length.sum())
    if budget is None or total <= budget:
        return None
    candidates = (length > 0).nonzero().squeeze(1)  # (V,) the rollouts with a loss token, in order
    strided = candidates[:: math.ceil(total / budget)]  # (K,)
    fits = length[strided].cumsum(0) <= budget  # (K,) a prefix of them
    fits[0] = True  # one rollout longer than the budget is read whole
    return strided[fits]


@torch.no_grad()
def summarise(batch: Batch, corrections: Corrections = (), by: str | None = None, *,
              findings_tokens: int | None = None, percentile_sample: int | None = None) -> list[GroupSummary]:
    """Each group's diagnostics, corrections (through one run_many on the group's Ratios) and findings; the
    findings from the rollouts `findings_rows` picks under findings_tokens (None: the whole group), the
    percentiles of |l| from about percentile_sample positions (None: exact; `diagnostics`)."""
    comps = labelled(corrections)
    out = []
    for group, sub in groups(batch, by):
        # with the rows' extremes the corrections read and the rho^2 sums diagnostics reads; k3 (B, T) only if a
        # tokens form reads it (a fresh (B, T) tensor costs page faults with glibc's malloc; the step returns floats)
        r = ratios_for(sub, comps.values(), k3=False, chi2=True)
        evaluated = run_many(list(dict.fromkeys(comps.values())), sub, ratios=r)  # a composition named twice: once
        rows = findings_rows(r.length, findings_tokens)
        found = diagnose(sub if rows is None else sub.select(rows))
        stats = diagnostics(sub, r, percentile_sample=percentile_sample)
        out.append(GroupSummary(group, sub, r, stats, {k: evaluated[c] for k, c in comps.items()}, found, rows))
    return out


def severities(findings: list[Finding]) -> dict[str, float]:
    """Each kind of seqis.diagnosis.causes (and any other found) -> its worst severity as a number, 0 when not found."""
    levels = dict.fromkeys(KINDS, 0.0)
    for f in findings:
        levels[f.kind] = max(levels.get(f.kind, 0.0), LEVELS[f.severity])
    return levels


def step_metrics(batch: Batch, corrections: Corrections = (), by: str | None = None, prefix: str = "seqis/", *,
                 names: str | None = None, findings_tokens: int | None = FINDINGS_TOKENS,
                 percentile_sample: int | None = PERCENTILE_SAMPLE) -> dict[str, float]:
    """The flat dict of finite floats to log for this batch (see the module docstring for the keys).
    corrections: registry names or preset keys, (name, cfg) or (label, Composition) pairs, or a dict of them;
    by: a metadata column (env_name, rank, ...) whose values get keys of their own; names: "verl" or "prime-rl"
    to add that framework's names (FRAMEWORK_NAMES); findings_tokens: the loss tokens each group's findings read
    (whole rollouts at a fixed stride, `findings_rows`; None: every token, `diagnose`'s full power);
    percentile_sample: the positions abs_log_ratio_p50 / _p99 read (a fixed odd stride; None: exact)."""
    if names is not None and names not in FRAMEWORK_NAMES:
        raise ValueError(f"names must be one of {', '.join(FRAMEWORK_NAMES)} or None, got {names!r}")
    out: dict[str, float] = {}

    def put(key: str, value) -> None:
        if key in out:
            raise ValueError(f"step_metrics: two statistics are named {key!r} (a group named like a statistic or "
                             "a correction?)")
        value = float(value)
        if math.isnan(value):
            raise ValueError(f"step_metrics: {key} is NaN")
        out[key] = min(max(value, -sys.float_info.max), sys.float_info.max)  # inf: logged as the largest float

    for s in summarise(batch, corrections, by, findings_tokens=findings_tokens, percentile_sample=percentile_sample):
        at = prefix if s.group is None else f"{prefix}{s.group}/"
        for name, value in s.diagnostics.items():
            put(at + name, value)
        for label, o in s.outputs.items():
            for metric, value in o.scalars().items():
                put(f"{at}{label}/{metric}", value)
        for kind, level in severities(s.findings).items():
            put(f"{at}findings/{kind}", level)
        if names is not None:
            whole = FRAMEWORK_NAMES[names].whole
            for key, value in FRAMEWORK_NAMES[names].values(s).items():
                put(prefix + key.format(group=s.group or whole) if "{group}" in key else at + key, value)
    return out



# ---------------------------------------------------------------------------------------------------------
# the frameworks' own names, with their arithmetic


@dataclass(frozen=True)
class FrameworkNames:
    """What a framework's trainer logs its mismatch statistics as: values(summary) -> key -> value, a key with
    "{group}" naming the group itself (`whole` for the whole batch), any other placed under the group."""

    source: str
    values: Callable[[GroupSummary], dict[str, torch.Tensor | float]]
    whole: str = "all"


def _verl(s: GroupSummary) -> dict[str, torch.Tensor | float]:
    """verl's compute_offpolicy_metrics, from the group's Ratios: token means over the loss tokens, means over
    the rollouts (those with a loss token) of per-rollout means."""
    r, d = s.ratios, s.diagnostics
    valid, length = r.valid, r.length.clamp(min=1)
    mean = lambda x: torch.where(valid, x, 0.0).sum() / valid.sum().clamp(min=1)  # (B,) -> () over rollouts
    train_lp = r.logp_rowsum / length  # (B,) mean log pi per rollout
    roll_lp = (r.logp_rowsum - r.seq_log_ratio) / length  # (B,) mean log mu per rollout
    diff = roll_lp - train_lp  # (B,) verl's log_ppl_diff per rollout: -S/T
    inf = torch.tensor(torch.inf, dtype=r.dtype)
    S = r.seq_log_ratio.clamp(-VERL_SAFETY_BOUND, VERL_SAFETY_BOUND)  # (B,)
    return {
        "rollout_corr/training_ppl": mean(torch.exp(-train_lp)),
        "rollout_corr/training_log_ppl": mean(-train_lp),
        "rollout_corr/kl": d["kl_k1"],
        "rollout_corr/k3_kl": d["kl_k3"],
        "rollout_corr/rollout_ppl": mean(torch.exp(-roll_lp)),
        "rollout_corr/rollout_log_ppl": mean(-roll_lp),
        "rollout_corr/log_ppl_diff": mean(diff),
        "rollout_corr/log_ppl_abs_diff": mean(diff.abs()),
        "rollout_corr/log_ppl_diff_max": torch.where(valid, diff, -inf).max() if bool(valid.any()) else 0.0,
        "rollout_corr/log_ppl_diff_min": torch.where(valid, diff, inf).min() if bool(valid.any()) else 0.0,
        "rollout_corr/ppl_ratio": d["ppl_ratio"],
        "rollout_corr/chi2_token": d["chi2_token"],
        "rollout_corr/chi2_seq": mean(torch.expm1(2 * S)),
    }


def _prime_rl(s: GroupSummary) -> dict[str, torch.Tensor | float]:
    """prime-rl's mismatch KL per group, and each correction's dropped fraction as its per-sequence loss metric."""
    valid = s.ratios.valid
    out: dict[str, torch.Tensor | float] = {"mismatch_kl/{group}/mean": s.diagnostics["kl_k3"]}
    for label, o in s.outputs.items():
        dropped = 1 - o.rollouts["kept_fraction"]  # (B,)
        out[f"{label}/is_masked/mean"] = torch.where(valid, dropped, 0.0).sum() / valid.sum().clamp(min=1)
        out[f"{label}/is_masked/max"] = torch.where(valid, dropped, 0.0).max() if dropped.numel() else 0.0
    return out


FRAMEWORK_NAMES = {
    "verl": FrameworkNames("volcengine/verl 0.9.1, verl/trainer/ppo/rollout_corr_helper.py (compute_offpolicy_metrics)",
                           _verl),
    "prime-rl": FrameworkNames("PrimeIntellect-ai/prime-rl 559b447, src/prime_rl/trainer/rl/train.py and loss.py",
                               _prime_rl),
}
