"""Section `monitor`: what `seqis.runs.monitor.step_metrics` costs a trainer each step, on 256 x 4096, as a ratio to one
seq_tis forward + backward (the target: at most 3x with the four seed estimators), and what it is made of."""

from __future__ import annotations

import statistics

from ..core.ratios import Ratios
from ..diagnosis.causes import diagnose
from ..diagnosis.statistics import diagnostics
from ..estimators import SEED_ESTIMATORS
from ..evaluators.fast import ratios_for
from ..registry import resolve, run_many
from ..runs.monitor import FINDINGS_TOKENS, PERCENTILE_SAMPLE, findings_rows, step_metrics
from .timing import median_time, paired, ragged_batch, step, with_catastrophic_tokens

ORDER = 12
SEED = list(SEED_ESTIMATORS)  # the four seed estimators the target is stated with
TARGET = 3.0


def run(device: str, quick: bool) -> None:
    """step_metrics with no correction, with seq_tis, and with the four seed estimators, each timed in alternating
    blocks against one seq_tis forward + backward (run, then autograd.grad of its loss), on a batch of valid-IS
    noise and (not --quick) one with catastrophic tokens; the target's ratio said on a line of its own; then
    step_metrics' parts, each a median alone: the Ratios, run_many of the four on them with their metrics,
    diagnostics on them, diagnose on the rollouts the findings read (and on the whole batch, which step_metrics
    does not run)."""
    B, T = (64, 1024) if quick else (256, 4096)
    batches = {"ragged, valid-IS noise": ragged_batch(B, T, device=device)}
    if not quick:
        batches["ragged, a catastrophic token in 1 of 4 rollouts"] = with_catastrophic_tokens(
            ragged_batch(B, T, device=device), every=4)
    print(f"\n## step_metrics: {B} x {T} fp32, ragged, {device}")
    print("against one seq_tis forward + backward, measured alternately; the ratio is the median of per-block "
          f"ratios (target: at most {TARGET:g}x with {', '.join(SEED)})\n")
    print("| batch | corrections | step_metrics ms | seq_tis fwd+bwd ms | ratio |")
    print("|---|---|---:|---:|---:|")
    target = []
    for label, batch in batches.items():
        reference = lambda b=batch: step("seq_tis", b)
        for corrections in ([], ["seq_tis"], SEED):
            t, f, x = paired(lambda b=batch, c=corrections: step_metrics(b, c), reference, rounds=3 if quick else 7,
                             device=device)
            print(f"| {label} | {', '.join(corrections) or 'none'} | {t * 1e3:.1f} | {f * 1e3:.1f} | {x:.2f}x |")
            if corrections == SEED:
                target.append(x)
    print(f"\nthe target's ratio (step_metrics with {', '.join(SEED)} / one seq_tis forward + backward): "
          f"{statistics.median(target):.2f}x (target {TARGET:g}x; the median over the batches above)")
    batch = batches["ragged, valid-IS noise"]
    comps = [resolve(name, None) for name in SEED]
    r = ratios_for(batch, comps, k3=False, chi2=True)  # as step_metrics makes them
    run_many(SEED, batch, ratios=r)
    rows = findings_rows(r.length, FINDINGS_TOKENS)
    sample = batch if rows is None else batch.select(rows)
    n_rows, n_tokens = sample.shape[0], int(sample.loss_mask.sum())
    parts = {
        "Ratios.of (log-ratios, per-rollout sums)": lambda: Ratios.of(batch),
        "the same with the rows' extremes and rho^2 sums (what step_metrics makes)": lambda: ratios_for(
            batch, comps, k3=False, chi2=True),
        f"run_many({SEED}) on them, forward + metrics": lambda: [
            o.scalars() for o in run_many(SEED, batch, ratios=r).values()],
        f"diagnostics on them, percentiles from {PERCENTILE_SAMPLE:,} positions": lambda: diagnostics(
            batch, r, percentile_sample=PERCENTILE_SAMPLE),
        "diagnostics on them, exact percentiles": lambda: diagnostics(batch, r),
        f"diagnose on the findings' rollouts ({n_rows} rollouts, {n_tokens:,} tokens)": lambda: diagnose(sample),
        "step_metrics with the four (all of the above, and the dict)": lambda: step_metrics(batch, SEED),
        "diagnostics alone": lambda: diagnostics(batch),
        "diagnose (the whole batch: not part of step_metrics)": lambda: diagnose(batch),
        "seq_tis forward + backward": lambda: step("seq_tis", batch),
    }
    print(f"\n| part (ragged, valid-IS noise; findings_tokens={FINDINGS_TOKENS:,}) | median ms |")
    print("|---|---:|")
    for label, fn in parts.items():
        print(f"| {label} | {median_time(fn, repeats=3 if quick else 7, device=device) * 1e3:.1f} |")
