"""Whole training runs: every step of a run read, scanned and charted, locally or on Ray.

    from seqis.runs import load_run, scan
    r = load_run("outputs/token_exports")   # prime-rl's export tree, or a folder of step_N.* dumps
    r.steps, r.batch(r.steps[-1])           # complete steps; one step's rollouts as a Batch
    df = scan("outputs/token_exports", estimators=["seq_tis", "mis_po"], by="env_name", engine="local",
              out="scan.parquet")           # one row per (step, group, estimator), worst first

  layout    where the steps are on disk (prime-rl's STABLE markers, step-named dumps)
  run       Run / load_run: a step's files as one Batch
  step      one step's rows (the unit of work), ScanSettings
  engines   local processes or Ray Data, streaming the steps' rows back
  scan      scan / read_scan / write_scan: the table, incremental through its parquet; follow: as the run grows
  example   a generated prime-rl run with an incident (tests, bench, assets)
  cli       python -m seqis scan PATH --out scan.parquet [--follow]
"""

from .run import Run, load_run
from .scan import Scanner, follow, incidents, read_scan, scan, write_scan

__all__ = ["Run", "Scanner", "follow", "incidents", "load_run", "read_scan", "scan", "write_scan"]
