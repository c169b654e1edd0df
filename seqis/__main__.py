"""`python -m seqis COMMAND ...` (or the `seqis` console script, the same): the library's command line. Each
command is a module with `main(argv)`."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

# command -> (module with main(argv), one line of help)
COMMANDS: dict[str, tuple[str, str]] = {
    "bench": ("seqis.bench", "benchmarks that print ratios to a floor (python -m seqis bench --help)"),
    "diagnose": ("seqis.diagnosis.cli", "why a batch's trainer and sampler disagree (python -m seqis diagnose --help)"),
    "scan": ("seqis.runs.cli", "scan every step of a run into a parquet table (python -m seqis scan --help)"),
}


def prog() -> str:
    """How this command line was started: the console script, or the module."""
    return "seqis" if Path(sys.argv[0]).name == "seqis" else "python -m seqis"


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {help_}" for name, (_, help_) in COMMANDS.items()]
    return f"usage: {prog()} COMMAND [options]\n\ncommands:\n" + "\n".join(lines) + \
        "\n\nThe explorer runs from a clone of the repository (make run, or streamlit run app there); a package " \
        "install has the library and this command line."


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    if argv[0] not in COMMANDS:
        print(f"{prog()}: unknown command {argv[0]!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module, _ = COMMANDS[argv[0]]
    return importlib.import_module(module).main(argv[1:]) or 0


if __name__ == "__main__":
    sys.exit(main())
