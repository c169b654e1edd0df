"""Section `monitor`: what `seqis.monitor.step_metrics` costs a trainer each step, on 256 x 4096, as a ratio to one
seq_tis forward + backward (the target: at most 3x), and what it is made of."""

from __future__ import annotations

from ..diagnose import diagnose
from ..diagnostics import diagnostics
from ..fast import Ratios
from ..monitor import step_metrics
from ..registry import run_many
from .timing import median_time, paired, ragged_batch, step, with_catastrophic_tokens

ORDER = 12


def run(device: str, quick: bool) -> None:
    """step_metrics with no correction, with seq_tis, and with the four seed estimators, each timed in alternating
    blocks against one seq_tis forward + backward (run, then autograd.grad of its loss), on a batch of valid-IS
    noise and (not --quick) one with catastrophic tokens; then its parts, each a median alone: the Ratios,
    diagnostics on them, run_many's forward with the metrics, diagnose."""
    B, T = (64, 1024) if quick else (256, 4096)
    batches = {"ragged, valid-IS noise": ragged_batch(B, T, device=device)}
    if not quick:
        batches["ragged, a catastrophic token in 1 of 4 rollouts"] = with_catastrophic_tokens(
            ragged_batch(B, T, device=device), every=4)
    seed = ["seq_tis", "seq_mis", "geo_mask", "mis_po"]
    print(f"\n## step_metrics: {B} x {T} fp32, ragged, {device}")
    print("against one seq_tis forward + backward, measured alternately; the ratio is the median of per-block "
          "ratios (target: at most 3x)\n")
    print("| batch | corrections | step_metrics ms | seq_tis fwd+bwd ms | ratio |")
    print("|---|---|---:|---:|---:|")
    for label, batch in batches.items():
        reference = lambda b=batch: step("seq_tis", b)
        for corrections in ([], ["seq_tis"], seed):
            t, f, x = paired(lambda b=batch, c=corrections: step_metrics(b, c), reference, rounds=3 if quick else 7,
                             device=device)
            print(f"| {label} | {', '.join(corrections) or 'none'} | {t * 1e3:.1f} | {f * 1e3:.1f} | {x:.2f}x |")
    batch = batches["ragged, valid-IS noise"]
    r = Ratios.of(batch)
    run_many(["seq_tis"], batch, ratios=r)  # the per-batch pieces diagnostics reads, as step_metrics has them
    parts = {
        "Ratios.of (log-ratios, per-rollout sums)": lambda: Ratios.of(batch),
        "diagnostics on a run_many's Ratios": lambda: diagnostics(batch, r),
        "diagnostics alone": lambda: diagnostics(batch),
        "run_many(['seq_tis']) forward + metrics": lambda: run_many(["seq_tis"], batch)["seq_tis"].scalars(),
        "diagnose": lambda: diagnose(batch),
        "seq_tis forward + backward": lambda: step("seq_tis", batch),
    }
    print("\n| part (ragged, valid-IS noise) | median ms |")
    print("|---|---:|")
    for label, fn in parts.items():
        print(f"| {label} | {median_time(fn, repeats=3 if quick else 7, device=device) * 1e3:.1f} |")
