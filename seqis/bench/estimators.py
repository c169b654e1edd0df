"""Section `estimators`: each estimator (forward, backward, metrics) on 256 x 4096, all through run_many, and
diagnostics, as ratios to a floor; then what a trainer pays per step for each seed estimator (fresh tensors, a new
`Batch` with its validation, `run`, backward, metrics read)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from .. import registry
from ..core.types import Batch
from ..diagnosis.statistics import diagnostics
from ..estimators import ESTIMATORS, SEED_ESTIMATORS
from ..evaluators import compiled
from ..presets import PRESETS
from ..registry import run_many, runnable, skipped_note
from .timing import (
    floor_pass,
    gradient_writes,
    median_time,
    paired,
    ragged_batch,
    step,
    step_many,
    with_catastrophic_tokens,
)

ORDER = 10
# the rows that hold a ratio to the slowest single correction, not a time against the floor, and their names
RATIO_ROWS = {"run_many": "all through run_many / the slowest single one",
              "run_many_presets": "all + every preset through run_many / the slowest single one",
              "run_many_sum": "all + every preset through run_many / their single calls one after another",
              "gradient_writes": "as many fresh (B, T) gradients written alone / the same single one"}


def table(device: str, quick: bool) -> tuple[dict[str, tuple[float, float, float]], str]:
    """Each estimator alone, all through run_many, diagnostics: prints the table and returns its rows,
    label -> (median seconds, floor seconds, x floor) (the run_many / slowest-single ratios under "run_many",
    "run_many_presets" and "gradient_writes"), and the slowest single correction it found."""
    B, T = (64, 1024) if quick else (256, 4096)
    batch = ragged_batch(B, T, device=device)
    floor_fn = lambda: floor_pass(batch)
    print(f"\n## Estimators: forward + backward + metrics, {B} x {T} fp32, ragged, {device}")
    print("floor: torch.where(mask, t - i, 0).sum(-1), measured alternately with each row; x floor is the "
          "median of per-block ratios\n")
    print("| estimator | median ms | floor ms | x floor |")
    print("|---|---:|---:|---:|")
    rows = {}

    def row(label: str, fn: Callable[[], object]) -> None:
        rows[label] = t, f, x = paired(fn, floor_fn, device=device)
        print(f"| {label} | {t * 1e3:.2f} | {f * 1e3:.2f} | {x:.1f} |")

    for name in ESTIMATORS:
        row(f"{name} (seed)" if name in SEED_ESTIMATORS else name, lambda n=name: step(n, batch))
    # this batch has no token outside mis_po's token band; a real one may have a catastrophic token in many
    # rollouts, and then mis_po takes its dense form (Correction.keep) instead of the sparse one
    spiked = with_catastrophic_tokens(batch, every=4)
    row("mis_po, a catastrophic token in 1 of 4 rollouts", lambda: step("mis_po", spiked))
    all_names = list(ESTIMATORS)
    row(f"all {len(all_names)} through run_many", lambda: step_many(all_names, batch))
    row("four seed estimators through run_many", lambda: step_many(list(SEED_ESTIMATORS), batch))
    row("diagnostics(batch)", lambda: diagnostics(batch))
    slowest = max(ESTIMATORS, key=lambda n: rows[f"{n} (seed)" if n in SEED_ESTIMATORS else n][0])
    # timed against each other in alternating blocks, like every row against the floor
    rows["run_many"] = paired(lambda: step_many(all_names, batch), lambda: step(slowest, batch), device=device)
    print(f"\nall {len(all_names)} through run_many / slowest single ({slowest}): {rows['run_many'][2]:.2f}x "
          f"(target: at most 4x)")
    # every preset too (issue 12): the slowest single one found by a short median each, then timed in
    # alternating blocks against all of them through one run_many
    presets, skipped = runnable(list(PRESETS), batch)  # the bench's batch has no sampler's head
    if skipped:
        print(skipped_note(skipped))
    every = all_names + presets
    single = {k: median_time(lambda k=k: step(k, batch), repeats=3, warmup=1, device=device) for k in presets}
    single.update({n: rows[f"{n} (seed)" if n in SEED_ESTIMATORS else n][0] for n in all_names})
    # the maximum of short, noisy medians picks a light one now and then: the five slowest timed again, alternately
    top = sorted(single, key=single.get, reverse=True)[:5]
    again = {k: [] for k in top}
    for _ in range(3):
        for k in top:
            again[k].append(median_time(lambda k=k: step(k, batch), repeats=3, warmup=1, device=device))
    single.update({k: statistics.median(v) for k, v in again.items()})
    slowest_any = max(top, key=single.get)
    rows["run_many_presets"] = paired(lambda: step_many(every, batch), lambda: step(slowest_any, batch),
                                      device=device)
    # what any backward per output must do, timed the same way: one fresh (B, T) gradient per key, kept
    rows["gradient_writes"] = paired(gradient_writes(batch, len(every)), lambda: step(slowest_any, batch),
                                     device=device)
    print(f"all {len(all_names)} + {len(presets)} presets through run_many / slowest single ({slowest_any}): "
          f"{rows['run_many_presets'][2]:.2f}x (target: at most 4x); {len(every)} fresh (B, T) gradients written "
          f"alone and kept / the same single: {rows['gradient_writes'][2]:.2f}x")
    print("slowest single calls: " + ", ".join(f"{k} {single[k] * 1e3:.1f} ms" for k in top))
    # the same run against the sum of its single calls (issue 12's restated line), timed alternately: every
    # single call one after another, then one run_many of them all (three rounds: a sweep takes ~100 calls)
    rows["run_many_sum"] = paired(lambda: step_many(every, batch), lambda: [step(k, batch) for k in every],
                                  rounds=3, device=device)
    print(f"all {len(every)} through run_many / the {len(every)} single calls one after another: "
          f"{rows['run_many_sum'][2]:.2f}x ({rows['run_many_sum'][0] * 1e3:.0f} / "
          f"{rows['run_many_sum'][1] * 1e3:.0f} ms; target: at most 0.25x)")
    where_the_time_goes(batch, every, rows["run_many_presets"][0], single, device)
    return rows, slowest_any


def where_the_time_goes(batch, keys: list, full: float, single: dict, device: str) -> None:
    """What the all-through-run_many row is made of: its forward (with the metrics) and backward, the same
    number of (B, T) gradients written alone into fresh memory and kept (what any backward per output must
    do, as step_many keeps them), and the run against the sum of the singles. Medians in ms."""
    n, slowest = len(keys), max(single.values())
    forward = median_time(lambda: [o.scalars() for o in run_many(keys, batch).values()], repeats=5, device=device)
    writes = median_time(gradient_writes(batch, n), repeats=5, device=device)
    print(f"  that run: {full * 1e3:.0f} ms = forward + metrics {forward * 1e3:.0f} ms + {n} backwards; "
          f"{n} gradients written alone and kept {writes * 1e3:.0f} ms ({writes / slowest:.1f}x the slowest "
          f"single); the sum of the {n} singles {sum(single.values()) * 1e3:.0f} ms "
          f"(the run is {full / sum(single.values()):.2f}x it)")


def summarise_repeats(runs: list[dict[str, tuple[float, float, float]]]) -> None:
    """The median and range of each row's ratio over repeated runs of the estimators section (on a shared
    machine a whole run's ratios move together: one run is one draw)."""
    print(f"\n## Estimators over {len(runs)} runs: median (min-max) of each run's ratio\n")
    print("| estimator | median ms | x floor | range |")
    print("|---|---:|---:|---:|")
    for label in runs[0]:
        ms = statistics.median(r[label][0] for r in runs) * 1e3
        xs = [r[label][2] for r in runs]
        name = RATIO_ROWS.get(label, label)
        f = ".2f" if label == "run_many_sum" else ".1f"  # a ratio below 1
        print(f"| {name} | {ms:.2f} | {statistics.median(xs):{f}} | {min(xs):{f}}-{max(xs):{f}} |")


def trainer_step(name: str, batch: Batch) -> Callable[[], object]:
    """One trainer step as a trainer pays it: fresh (B, T) tensors (copies, as a new step's log-probs arrive), a new
    `Batch` (its validation included), `run`, the backward, and the metrics read as floats."""
    tl, il, adv, mask = (batch.trainer_logprobs.detach(), batch.inference_logprobs, batch.advantages,
                         batch.loss_mask)

    def one():
        trainer = tl.clone().requires_grad_()  # (B, T) this step's log pi
        fresh = Batch(trainer, il.clone(), adv.clone(), mask.clone())
        out = registry.run(name, fresh)
        out.loss.backward()
        return out.scalars(), trainer.grad
    return one


def trainer_steps(device: str, quick: bool) -> dict[tuple[str, str], tuple[float, float, float]]:
    """Each seed estimator's trainer step on the compiled path and on the eager one (whatever this process chose:
    `compiled.chosen` sets each for its rows), each against the floor in the same run: prints the table, returns its
    rows, (name, path) -> (median s, floor s, x floor)."""
    B, T = (64, 1024) if quick else (256, 4096)
    batch = ragged_batch(B, T, device=device)
    floor_fn = lambda: floor_pass(batch)
    print(f"\n## Trainer step: fresh tensors, a new Batch, run, backward, metrics; {B} x {T} fp32, ragged, {device}")
    print("compiled: seqis/evaluators/compiled.py (SEQIS_COMPILE=1); eager: evaluators/fast.py (SEQIS_COMPILE=0); "
          "floor as above, measured alternately with each row (targets: compiled at most 3x, eager at most 6x)\n")
    print("| estimator | path | median ms | floor ms | x floor |")
    print("|---|---|---:|---:|---:|")
    rows = {}
    for name in SEED_ESTIMATORS:
        for path, setting in (("compiled", "1"), ("eager", "0")):
            with compiled.chosen(setting) as status:
                if not status.startswith(path):  # the compiler failed: the row says why
                    print(f"| {name} trainer step | {path}: not run ({status}) | | | |")
                    continue
                rows[name, path] = t, f, x = paired(trainer_step(name, batch), floor_fn, device=device)
            print(f"| {name} trainer step | {path} | {t * 1e3:.2f} | {f * 1e3:.2f} | {x:.1f} |")
    validation = paired(lambda: Batch(batch.trainer_logprobs.detach(), batch.inference_logprobs, batch.advantages,
                                      batch.loss_mask), floor_fn, device=device)
    print(f"| a new Batch alone (its validation) | either | {validation[0] * 1e3:.2f} | {validation[1] * 1e3:.2f} | "
          f"{validation[2]:.1f} |")
    return rows


def run(device: str, quick: bool, *, repeat: int = 1, pause: float = 20.0) -> None:
    """The table `repeat` times (each ratio's median and range when repeated), then the trainer-step rows."""
    runs = []
    for i in range(repeat):
        time.sleep(pause if i else 0)
        runs.append(table(device, quick)[0])
    if repeat > 1:
        summarise_repeats(runs)
    trainer_steps(device, quick)
