"""Benchmarks that print ratios, not timed tests: `python -m seqis.bench [--device cuda] [--quick] [--only ...]`.

Each section prints a table of medians and a ratio to a floor measured in the same run, so the numbers mean
something on a busy machine too. A section is a module of this package with `ORDER` (its place in a full run)
and `run(device, quick, **options)`; its name is the module's, with "-" for "_". Adding one is adding a file.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil

import torch

from ..evaluators import compiled_status
from ._host import host_line

SHARED = {"timing"}  # modules of this package that are not sections


def sections() -> dict[str, object]:
    """name -> section module, in run order."""
    mods = [importlib.import_module(f"{__name__}.{m.name}") for m in pkgutil.iter_modules(__path__)
            if m.name not in SHARED and not m.name.startswith("_")]
    return {m.__name__.rsplit(".", 1)[1].replace("_", "-"): m for m in sorted(mods, key=lambda m: m.ORDER)}


def main(argv=None) -> None:
    found = sections()
    ap = argparse.ArgumentParser(prog="python -m seqis.bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke run")
    ap.add_argument("--only", nargs="*", choices=list(found), help="sections to run (default: all)")
    ap.add_argument("--repeat", type=int, default=1, help="run the estimators section this many times, "
                    "--pause seconds apart, and print the median and range of each ratio")
    ap.add_argument("--pause", type=float, default=20.0)
    args = ap.parse_args(argv)
    print(f"# seqis benchmark: torch {torch.__version__}, {torch.get_num_threads()} CPU threads, device {args.device}; "
          f"evaluators: {compiled_status()}; {host_line()}")
    for name, section in found.items():
        if args.only and name not in args.only:
            continue
        if name == "estimators":
            section.run(args.device, args.quick, repeat=args.repeat, pause=args.pause)
        else:
            section.run(args.device, args.quick)
