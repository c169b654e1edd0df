"""python -m seqis.presets check FRAMEWORK SOURCE_DIR [--seeds N] [--key KEY ...]

Loads FRAMEWORK's own functions from SOURCE_DIR (a checkout, or a wheel unzipped) and compares every one of its
presets with them on random ragged batches; exits 1 when a preset differs, 2 when nothing could be compared.
"""

from __future__ import annotations

import argparse
import sys

from .check import CHECKED, MissingCode, check, report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m seqis.presets", description=__doc__.splitlines()[2])
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("check", help="compare a framework's presets with its own code")
    c.add_argument("framework", choices=sorted(CHECKED))
    c.add_argument("source", help="the framework's checkout (or an unzipped wheel)")
    c.add_argument("--seeds", type=int, default=3, help="random ragged batches per preset (default 3)")
    c.add_argument("--key", action="append", help="only this preset key (repeatable)")
    args = parser.parse_args(argv)
    try:
        rows = check(args.framework, args.source, seeds=args.seeds, keys=args.key)
    except MissingCode as why:
        print(f"seqis: {args.source}: {why}", file=sys.stderr)
        return 2
    print(report(rows))
    if any(r.status == "differs" for r in rows):
        return 1
    return 0 if any(r.status == "ok" for r in rows) else 2


if __name__ == "__main__":
    sys.exit(main())
