"""`python -m seqis diagnose PATH [--by COLUMN] [--json] [--strict]`: why a batch's trainer and sampler disagree.

PATH is anything `seqis.io.load_batch` reads (a dump, or a prime-rl token export file or step folder). Prints
the findings worst first: severity, kind, group, the headline evidence and what to do; `--json` prints them
as a JSON list instead. `--strict` exits with status 1 when a finding is bad (for a check in CI or a trainer's
launch script).
"""

from __future__ import annotations

import argparse
import json

HEADLINE = ("shift", "count", "temperature", "log_offset", "dtype")  # the evidence each kind leads with


def main(argv: list[str] | None = None) -> int:
    from .diagnose import diagnose
    from .io import load_batch

    ap = argparse.ArgumentParser(prog="python -m seqis diagnose", description=__doc__.splitlines()[0])
    ap.add_argument("path", help="a batch file or a prime-rl step folder")
    ap.add_argument("--by", help="also diagnose each value of this metadata column (env_name, rank, ...)")
    ap.add_argument("--json", action="store_true", help="print the findings as JSON")
    ap.add_argument("--strict", action="store_true", help="exit with status 1 when a finding is bad")
    args = ap.parse_args(argv)
    findings = diagnose(load_batch(args.path), by=args.by)
    if args.json:
        print(json.dumps([{"kind": f.kind, "severity": f.severity, "group": f.group, "message": f.message,
                           "evidence": f.evidence} for f in findings], default=str, indent=1))
    else:
        for f in findings:
            head = ", ".join(f"{k} {f.evidence[k]:.4g}" if isinstance(f.evidence[k], float) else f"{k} {f.evidence[k]}"
                             for k in HEADLINE if k in f.evidence)
            group = "" if f.group is None else f" [{args.by} = {f.group}]"
            print(f"{f.severity.upper():4s} {f.kind}{group}{': ' + head if head else ''}\n     {f.message}")
    return 1 if args.strict and any(f.severity == "bad" for f in findings) else 0
