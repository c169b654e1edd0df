"""prime-rl's first token export layout: `token_exports/rank_R.jsonl`, every step appended to one file per
rank, cut into steps by each line's own `step` field.

prime-rl wrote this layout for its first 40 minutes (PrimeIntellect-ai/prime-rl e971d905a, 2026-05-22,
"Add trainer token JSONL export": the file opened in append mode; badd2b0fe, "write token exports per
step", moved to step_N/ folders). Every record then began `{"schema_version":1,"step":N,"rank":R,...}`,
its per-token lists after; later exports add `export_step` (a multi-run export's run step), which wins
when a line has it, as in seqis.io.prime_rl.

A step is the lines of that step in each rank file (a LineSpan per file). Reading the layout reads every
file once, line by line, looking only at each line's first bytes. Since the file was appended to, a
restarted trainer writes its steps again after the old ones: a step found in two places in one file is
read from its later lines, with a note. Lines without any step (no line of any file has one): the whole
run is one step, 0. There are no STABLE markers in this layout: every step counts as complete (a
half-written last line is skipped by the reader, with a note), and a rescan rereads a step whose lines
moved or grew.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

from ..io.prime_rl_lines import LineSpan

_HEAD = 4096  # the first bytes of a line: prime-rl writes its scalar fields before the per-token lists
_STEP = {key: re.compile(rb'(?<!\\)"' + key + rb'"\s*:\s*(-?\d+)') for key in (b"export_step", b"step")}
_CHUNK = 1 << 20


def _lines(path: Path) -> Iterator[tuple[int, int, bytes, bool]]:
    """(start, end, head, complete) of every line: its bytes [start, end) (end past its newline), its first
    bytes, and whether its newline is written; the file read in chunks."""
    with open(path, "rb") as f:
        pos = start = 0
        head = b""
        while chunk := f.read(_CHUNK):
            i = 0
            while True:
                j = chunk.find(b"\n", i)
                stop = len(chunk) if j < 0 else j
                if len(head) < _HEAD:
                    head += chunk[i:min(stop, i + _HEAD - len(head))]
                if j < 0:
                    break
                yield start, pos + j + 1, head, True
                start, head, i = pos + j + 1, b"", j + 1
            pos += len(chunk)
        if pos > start:
            yield start, pos, head, False  # a last line without its newline (maybe still being written)


def _step_of(path: Path, start: int, end: int, head: bytes) -> int | None:
    """The line's export_step or step (None: it has neither, or it is cut off before saying)."""
    for pattern in _STEP.values():
        if m := pattern.search(head):
            return int(m.group(1))
    if end - start <= len(head):
        return None  # the whole line was looked at
    with open(path, "rb") as f:  # a line whose first bytes do not say: parse it whole
        f.seek(start)
        try:
            record = json.loads(f.read(end - start))
        except ValueError:
            return None
    value = record.get("export_step", record.get("step")) if isinstance(record, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def step_spans(path: Path) -> tuple[dict[int | None, LineSpan], dict[int | None, list[str]]]:
    """Each step's lines in one rank file (None: lines that carry no step) and notes per step (written twice)."""
    blocks: list[list] = []  # [step, start, end, first_line], in file order
    for line_no, (start, end, head, complete) in enumerate(_lines(path), start=1):
        if not head.strip() and complete:
            if blocks:
                blocks[-1][2] = end  # a blank line: part of the step it follows
            continue
        step = _step_of(path, start, end, head)
        if blocks and (step == blocks[-1][0] or (step is None and not complete)):
            blocks[-1][2] = end  # a half-written last line stays with the step it follows (the reader skips it)
        else:
            blocks.append([step, start, end, line_no])
    spans: dict[int | None, LineSpan] = {}
    notes: dict[int | None, list[str]] = {}
    for step, start, end, first_line in blocks:
        if step in spans:
            notes.setdefault(step, []).append(
                f"{path.name}: step {step} is written twice (from line {spans[step].first_line}, again from line "
                f"{first_line}: a restarted trainer?); the later lines are read")
        spans[step] = LineSpan(start, end, first_line)
    return spans, notes


def flat_steps(files: list[Path]) -> dict[int, tuple[list[Path], list[LineSpan], list[str]]]:
    """step -> (its rank files, the step's span of each, notes) over a layout's rank files, ranks in order."""
    per_file = [(p, *step_spans(p)) for p in files]
    stepless = [(p, s[None]) for p, s, _ in per_file if None in s]
    if stepless and any(step is not None for _, s, _ in per_file for step in s):
        p, span = stepless[0]
        raise ValueError(f"{p.name}, line {span.first_line}: no 'step' field, while other lines have one (prime-rl's "
                         f"first export layout cuts a rank file into steps by it)")
    steps: dict[int, tuple[list[Path], list[LineSpan], list[str]]] = {}
    for p, spans, notes in per_file:
        for step, span in spans.items():
            paths, spans_of_step, step_notes = steps.setdefault(0 if step is None else step, ([], [], []))
            paths.append(p)
            spans_of_step.append(span)
            step_notes += notes.get(step, [])
    return steps
