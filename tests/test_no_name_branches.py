"""No code outside a registry entry branches on an estimator's or a preset's name: what an entry is lives in the
entry (its composition, its summary, its closed form read from the composition), and everything else reads it.

The check is the grep the report quotes: in seqis/ and app/, a comparison with a registry name or preset key
(==, !=, `in (...)`, .startswith) or a choice by registry membership (`... if name in PRESETS else ...`). The
registry entries themselves (seqis/estimators/<name>.py, seqis/presets/) and the registry that looks entries up
(seqis/registry.py, seqis/estimators/__init__.py) are where a name is allowed to mean something.
"""

from __future__ import annotations

import re
from pathlib import Path

from seqis import ESTIMATORS, PRESETS

ROOT = Path(__file__).resolve().parents[1]
ENTRIES = {"seqis/estimators/__init__.py", "seqis/registry.py",
           *(f"seqis/estimators/{name}.py" for name in ESTIMATORS)}


def _pattern() -> re.Pattern:
    names = "|".join(re.escape(k) for k in sorted([*ESTIMATORS, *PRESETS], key=len, reverse=True))
    prefixes = "|".join(sorted({re.escape(k.split("/")[0] + "/") for k in PRESETS}
                               | {re.escape(k.split("_")[0]) for k in ESTIMATORS}))
    quoted = rf"""["']({names})["']"""
    return re.compile("|".join([
        rf"(==|!=)\s*{quoted}", rf"{quoted}\s*(==|!=)",  # name == "seq_tis"
        rf"\bin\s*[(\[{{]\s*{quoted}",  # name in ("seq_tis", ...)
        rf"""startswith\(\s*["']({prefixes})""",  # name.startswith("verl/")
        r"\bif\b[^#\n]*\bin\s+(PRESETS|ESTIMATORS)\b[^#\n]*\belse\b",  # x if name in PRESETS else y
    ]))


def _hits() -> list[str]:
    pattern = _pattern()
    hits = []
    for path in sorted([*ROOT.joinpath("seqis").rglob("*.py"), *ROOT.joinpath("app").rglob("*.py")]):
        rel = path.relative_to(ROOT).as_posix()
        if rel in ENTRIES or rel.startswith("seqis/presets/"):
            continue
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line):
                hits.append(f"{rel}:{i}: {line.strip()}")
    return hits


def test_no_code_outside_a_registry_entry_branches_on_a_name():
    assert _hits() == []


def test_the_check_catches_a_name_branch():
    pattern = _pattern()
    for line in ('if spec.name == "seq_tis":', 'x = sim[sim["estimator"] != "seq_mis_product"]',
                 'if key in ("verl/bypass_pg_is", "trl/opsm"):', 'if name.startswith("verl/"):',
                 "own = PRESETS[name].export_framework if name in PRESETS else None"):
        assert pattern.search(line), line
    for line in ('run("seq_tis", batch)', 'ests = [("seq_tis", "seq_tis", cfg)]', "spec, cfg = entry(name)"):
        assert not pattern.search(line), line
