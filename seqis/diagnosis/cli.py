"""Why a batch's trainer and sampler disagree: `python -m seqis diagnose PATH [options]`.

PATH is anything `seqis.io.load_batch` reads (a dump, or a prime-rl token export file or step folder).
`--columns` names the file's column for a role when it is not one the loader knows (the mapping the
explorer's upload offers): `--columns trainer_logprobs=logp_fsdp,loss_mask=mask`. `--max-bytes SIZE` raises
the loader's size limit (200MB; `400MB`, `2G`, or `none`). Prints the findings worst first: severity, kind,
group, the headline evidence and what to do; `--json` prints them as a JSON list instead. Without `--by`, each
metadata column of 2 to 32 values is scanned, and a fault one of its groups shows while the whole batch does not is
printed first, its line naming the group (`[env = math]`; docs/diagnose.md, "The scan of the metadata columns").
`--by COLUMN` diagnoses each value of that column instead. `--strict` exits with status 1 when a finding is bad
(for a check in CI or a trainer's launch script).

A file the loader refuses prints one line, `seqis: PATH: why`, and exits with status 1 (`--debug`: the
traceback too); so does a batch without a loss token (its one finding, `no_loss_tokens`, is bad).
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from pathlib import Path

from ..io.columns import ALIASES, LIMIT_HINT, MAX_BYTES, parse_size, size_text

HEADLINE = ("shift", "count", "temperature", "log_offset", "dtype")  # the evidence each kind leads with
ROLES = tuple(ALIASES)
CLI_LIMIT_HINT = "--max-bytes SIZE raises it"  # what a size refusal's LIMIT_HINT says on a command line


def parse_columns(spec: str) -> dict[str, str]:
    """'trainer_logprobs=logp,loss_mask=mask' -> {'trainer_logprobs': 'logp', 'loss_mask': 'mask'}."""
    out: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        role, eq, name = part.partition("=")
        role, name = role.strip(), name.strip()
        if not eq or not name:
            raise argparse.ArgumentTypeError(f"{part!r} is not ROLE=NAME (e.g. trainer_logprobs=logp_fsdp)")
        if role not in ROLES:
            raise argparse.ArgumentTypeError(f"{role!r} is not a role; roles: {', '.join(ROLES)}")
        if role in out:
            raise argparse.ArgumentTypeError(f"{role} is given twice")
        out[role] = name
    if not out:
        raise argparse.ArgumentTypeError("give at least one ROLE=NAME")
    return out


def parse_max_bytes(text: str) -> int | None:
    """--max-bytes SIZE (also scan's): seqis.io.parse_size, a refusal as a usage error."""
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _why(message: str, path: str) -> str:
    """The loader's message without its own file-name prefix (the line names the path), in the CLI's terms."""
    why = message.removeprefix(f"{Path(path).name}: ").replace(LIMIT_HINT, CLI_LIMIT_HINT)
    return why.replace("(pass columns={'", "(pass --columns ").replace("': <name>} to say which)", "=<name> to say "
                       "which)").replace("': <name>} for another name)", "=<name>)")


def main(argv: list[str] | None = None) -> int:
    # the whole docstring (its first line alone stopped mid-sentence, issue 43), its paragraphs kept
    ap = argparse.ArgumentParser(prog="python -m seqis diagnose", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("path", help="a batch file or a prime-rl step folder")
    ap.add_argument("--columns", type=parse_columns, metavar="ROLE=NAME,...",
                    help=f"the file's column for a role the loader does not find by name (roles: {', '.join(ROLES)})")
    ap.add_argument("--by", metavar="COLUMN",
                    help="also diagnose each value of this metadata column (env_name, rank, ...); without it, a "
                         "fault that only a group of a metadata column shows is printed first")
    ap.add_argument("--max-bytes", type=parse_max_bytes, default=MAX_BYTES, metavar="SIZE",
                    help=f"refuse a larger file: bytes, or with K, M, G (KB, MB, GB; 1 MB = 2**20 bytes), or none "
                         f"(default {size_text(MAX_BYTES)})")
    ap.add_argument("--json", action="store_true", help="print the findings as JSON")
    ap.add_argument("--strict", action="store_true", help="exit with status 1 when a finding is bad")
    ap.add_argument("--debug", action="store_true", help="print the traceback of a refusal")
    args = ap.parse_args(argv)

    from ..io import load_batch
    from .causes import diagnose

    try:
        findings = diagnose(load_batch(args.path, columns=args.columns, max_bytes=args.max_bytes), by=args.by)
    except (ValueError, OSError) as e:  # BatchFormatError is a ValueError; a bad --by is one too
        if args.debug:
            traceback.print_exc()
        print(f"seqis: {args.path}: {_why(str(e), args.path)}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps([{"kind": f.kind, "severity": f.severity, "group": f.group, "message": f.message,
                           "evidence": f.evidence} for f in findings], default=str, indent=1))
    else:
        for f in findings:
            head = ", ".join(f"{k} {f.evidence[k]:.4g}" if isinstance(f.evidence[k], float) else f"{k} {f.evidence[k]}"
                             for k in HEADLINE if k in f.evidence)
            group = "" if f.group is None else f" [{f.evidence.get('by', args.by)} = {f.group}]"
            print(f"{f.severity.upper():4s} {f.kind}{group}{': ' + head if head else ''}\n     {f.message}")
    if any(f.kind == "no_loss_tokens" for f in findings):
        return 1  # nothing was diagnosed: never a pass
    return 1 if args.strict and any(f.severity == "bad" for f in findings) else 0
