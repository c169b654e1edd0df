"""`python -m seqis scan PATH --out scan.parquet [--follow]`: scan a run from the terminal, with a progress bar;
with --follow, keep scanning steps as they land (a line per step) until SIGINT or SIGTERM."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
import warnings

from ..diagnosis.cli import CLI_LIMIT_HINT, parse_max_bytes
from ..io import LIMIT_HINT, MAX_BYTES
from ..io.columns import size_text


class ProgressBar:
    """One line on a terminal, redrawn in place: `[#####.....] 12/30 steps  4.1 steps/s  step 17`."""

    def __init__(self, stream=None, width: int = 30):
        self.stream = stream if stream is not None else sys.stderr
        self.width, self.started = width, time.perf_counter()

    def __call__(self, done: int, total: int, step: int) -> None:
        filled = self.width * done // max(total, 1)
        rate = done / max(time.perf_counter() - self.started, 1e-9)
        self.stream.write(f"\r[{'#' * filled}{'.' * (self.width - filled)}] {done}/{total} steps  "
                          f"{rate:.1f} steps/s  step {step}  ")
        if done == total:
            self.stream.write("\n")
        self.stream.flush()


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m seqis scan", description=(
        "Scan every step of a run (prime-rl's token_exports tree or a folder of step_N.* dumps): diagnostics, "
        "each estimator's metrics and the diagnosis per (step, group, estimator), written as parquet. Scanning "
        "again into the same --out reads only new or changed steps. Exit status 1 when a step could not be read "
        "(the others are in the table)."))
    p.add_argument("path", help="the run: token_exports/, its parent, <run_id>/, or a folder of step-named dumps")
    p.add_argument("--out", required=True, help="the scan's parquet (also its cache)")
    p.add_argument("--estimators", default=None,
                   help="comma-separated estimator names or preset keys (default: every registry estimator)")
    p.add_argument("--by", default=None, help="metadata column to group by ('none': whole steps only; default: "
                   "env_name when the run's first step has it)")
    p.add_argument("--engine", default="local", choices=("local", "ray"),
                   help="local processes, or Ray Data (a cluster when RAY_ADDRESS is set)")
    p.add_argument("--workers", type=int, default=None, help="processes / local Ray CPUs (default: every core)")
    p.add_argument("--run-id", default=None, help="which run of a multi-run export")
    p.add_argument("--max-bytes", type=parse_max_bytes, default=MAX_BYTES, metavar="SIZE",
                   help=f"refuse a larger dump file (its step is not read): bytes, or with K, M, G (KB, MB, GB; 1 MB "
                        f"= 2**20 bytes), or none (default {size_text(MAX_BYTES)}; prime-rl rank files have no limit)")
    p.add_argument("--include-unstable", action="store_true", help="also read steps still being written")
    p.add_argument("--follow", action="store_true", help="keep scanning steps as they land, the parquet rewritten "
                   "after each, until SIGINT or SIGTERM (exit status 0, the parquet intact)")
    p.add_argument("--interval", type=float, default=5.0,
                   help="with --follow: seconds between looks at the run (default 5)")
    return p


def where_ray() -> str:
    """Which Ray a scan with engine="ray" runs on."""
    address = os.environ.get("RAY_ADDRESS")
    return f"the cluster at {address} (RAY_ADDRESS)" if address else \
        "no RAY_ADDRESS: the cluster this machine is part of, else a local Ray"


def _default_by(path, run_id, max_bytes) -> str | None:
    """env_name when the run's first readable step carries it (prime-rl exports do), else None. A step that
    cannot be read is the scan's to report (issue 43: step 0's refusal here ended the scan, nothing written)."""
    from .run import load_run

    r = load_run(path, run_id)
    for step in r.steps:
        try:
            batch, _ = r.read(step, extras=False, max_bytes=max_bytes)
        except (ValueError, OSError):  # BatchFormatError is a ValueError
            continue
        return "env_name" if "env_name" in batch.metadata else None
    return None


def _cli_terms(message: str) -> str:
    """A loader's refusal with this command line's flag for load_batch's argument."""
    return message.replace(LIMIT_HINT, CLI_LIMIT_HINT)


def step_line(result: dict, out: str) -> str:
    """One step of a followed run, as a line: its whole-step kl_k3, the worst finding, its groups."""
    from .scan import SEVERITY_RANK

    if result["error"] is not None:
        return f"step {result['step']}: NOT READ: {_cli_terms(result['error'])}"
    rows = result["rows"]
    if not rows:
        return f"step {result['step']}: no rows"
    whole = next((r for r in rows if r["group"] is None), rows[0])
    groups = sorted({r["group"] for r in rows if r["group"] is not None})
    worst = min(rows, key=lambda r: SEVERITY_RANK.get(r["severity"], len(SEVERITY_RANK)))
    found = "" if worst["severity"] in (None, "ok") else \
        f", {worst['severity']}: {worst['finding']}" + (f" ({worst['group']})" if worst["group"] is not None else "")
    skipped = f", {len(result['notes'])} line(s) skipped" if result["notes"] else ""
    return (f"step {result['step']}: {whole['n_rollouts']} rollouts, kl_k3 {whole['kl_k3']:.3g}{found}"
            + (f", groups {', '.join(groups)}" if groups else "") + f"{skipped} -> {out}")


def _stop_on_signals(stop: threading.Event) -> None:
    """SIGINT and SIGTERM set `stop` (the step in progress finishes, the parquet is written); a second one
    interrupts at once (the parquet on disk is still whole: it is only ever replaced by a rename)."""
    def handler(signum, frame):
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()
        print(f"{signal.Signals(signum).name}: stopping after the step in progress", file=sys.stderr, flush=True)

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)


def _wait_for_steps(path, run_id, interval: float, stop: threading.Event) -> bool:
    """Block until the run has a step (a trainer that has not exported one yet); False when stopped first."""
    from .layout import NoSteps
    from .run import load_run

    said = False
    while not stop.is_set():
        try:
            r = load_run(path, run_id)
            if r.steps or r.unstable_steps:
                return True
        except (FileNotFoundError, NoSteps):
            pass
        if not said:
            print(f"waiting for the first step in {path}", flush=True)
            said = True
        stop.wait(interval)
    return False


def follow_main(args, names) -> int:
    from .scan import follow

    stop = threading.Event()
    _stop_on_signals(stop)
    try:
        if not _wait_for_steps(args.path, args.run_id, args.interval, stop):
            return 0
        by = _default_by(args.path, args.run_id, args.max_bytes) if args.by is None else None \
            if args.by.lower() == "none" else args.by
        print(f"following {args.path} every {args.interval:g} s -> {args.out} (SIGINT or SIGTERM stops)", flush=True)
        if args.engine == "ray":
            print(f"engine ray: {where_ray()}", file=sys.stderr, flush=True)
        with warnings.catch_warnings():  # each step's problems are on its own line
            warnings.simplefilter("ignore")
            df = follow(args.path, names, by=by, engine=args.engine, out=args.out, interval=args.interval,
                        include_unstable=args.include_unstable, workers=args.workers, run_id=args.run_id,
                        on_step=lambda result: print(step_line(result, args.out), flush=True), stop=stop,
                        max_bytes=args.max_bytes)
    except (ValueError, OSError, ImportError) as e:  # OSError: also no Ray worker could read the run
        print(f"python -m seqis scan: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # a second signal
        print(f"stopped; {args.out} holds the steps written before", file=sys.stderr)
        return 0
    print(f"stopped: {df['step'].nunique() if not df.empty else 0} steps, {len(df)} rows in {args.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    from .scan import scan

    args = parser().parse_args(argv)
    names = [n.strip() for n in args.estimators.split(",") if n.strip()] if args.estimators else None
    if args.follow:
        if args.interval <= 0:
            print(f"python -m seqis scan: --interval must be positive, got {args.interval}", file=sys.stderr)
            return 2
        return follow_main(args, names)
    with warnings.catch_warnings(record=True):  # every problem is in the summary printed below
        warnings.simplefilter("always")
        try:
            by = _default_by(args.path, args.run_id, args.max_bytes) if args.by is None else None \
                if args.by.lower() == "none" else args.by
            if args.engine == "ray":  # said before Ray starts: a cluster's workers take seconds to the first step
                print(f"engine ray: {where_ray()}", file=sys.stderr, flush=True)
            df = scan(args.path, names, by=by, engine=args.engine,
                      out=args.out, include_unstable=args.include_unstable, workers=args.workers,
                      run_id=args.run_id, progress=ProgressBar(), max_bytes=args.max_bytes)
        except (ValueError, OSError, ImportError) as e:  # OSError: also no Ray worker could read the run
            print(f"python -m seqis scan: {e}", file=sys.stderr)
            return 2
    s = df.attrs["summary"]
    print(f"{len(df)} rows from {s['steps']} steps ({s['scanned']} read, {s['cached']} from {args.out}) "
          f"in {s['seconds']:.1f} s -> {args.out}")
    if s["unstable_left_out"]:
        print(f"left out, still being written: steps {', '.join(map(str, s['unstable_left_out']))}")
    for what, notes in (("NOT READ", s["failed"]), ("skipped", s["skipped"]), ("note", s.get("notes", []))):
        for note in notes:
            print(f"{what}: {_cli_terms(note)}")
    if not df.empty:
        top = df.iloc[0]
        group = "" if top["group"] is None or top["group"] != top["group"] else f", group {top['group']}"
        print(f"worst: step {top['step']}{group} (kl_k3 {top['kl_k3']:.3g}"
              + (f", {top['severity']}: {top['finding']})" if isinstance(top["severity"], str) else ")"))
    return 1 if s["failed"] else 0
