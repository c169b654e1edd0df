"""Live runs: `seqis scan PATH --out scan.parquet --follow` (the installed console script, a subprocess) reads each
step moved into the run folder within a few intervals, rewriting the parquet whole; SIGTERM (and SIGINT) end it
with status 0 and a parquet that reads back; in-process, `follow` and the `Scanner` read only new or changed
steps, pick up a step once its STABLE marker lands, drop a step that left the disk and do not reread a step that
failed until its files change.

Steps are generated whole in a staging folder (seqis.runs.example) and moved in with a rename, as a trainer's
step folder appears with its files and STABLE marker."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from seqis.runs import Scanner, follow, read_scan, scan
from seqis.runs.example import write_prime_rl_run

ESTIMATORS = ("seq_tis", "mis_po")
INTERVAL = 0.5


def script() -> str:
    """The installed `seqis` console script of this interpreter's environment."""
    path = Path(sys.executable).parent / "seqis"
    if not path.exists():
        pytest.skip(f"no console script at {path} (pip install -e . installs it)")
    return str(path)


@pytest.fixture(scope="module")
def staged(tmp_path_factory):
    """A generated 6-step prime-rl run (two environments, an incident at step 2) to move into a run folder."""
    root = tmp_path_factory.mktemp("staged") / "token_exports"
    write_prime_rl_run(root, steps=6, ranks=1, rollouts_per_rank=6, incident=(2, "code"), max_len=32)
    return root


def land(staged: Path, run: Path, step: int) -> None:
    """Step `step` appears in the run folder at once (copied beside it, then renamed in)."""
    run.mkdir(parents=True, exist_ok=True)
    tmp = run.parent / f".incoming_{step}"
    shutil.copytree(staged / f"step_{step}", tmp)
    tmp.rename(run / f"step_{step}")


def steps_in(out: Path) -> set[int]:
    try:
        return set(int(s) for s in read_scan(out)["step"].unique())
    except (OSError, ValueError):
        return set()


def wait_for(condition, timeout: float, what: str, proc=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the follower exited ({proc.returncode}) before {what}: {proc.stdout.read()}")
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def start(run: Path, out: Path, *extra: str) -> subprocess.Popen:
    cmd = [script(), "scan", str(run), "--out", str(out), "--follow", "--interval", str(INTERVAL),
           "--estimators", ",".join(ESTIMATORS), "--by", "env_name", "--workers", "1", *extra]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})


def read_line(proc, starts: str, timeout: float = 120.0) -> str:
    """The follower's next line that starts with `starts` (its earlier lines skipped)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith(starts):
            return line
        if not line and proc.poll() is not None:
            raise AssertionError(f"the follower exited ({proc.returncode}) before a line '{starts}...'")
    raise AssertionError(f"no line '{starts}...'")


@pytest.mark.slow
def test_follow_reads_each_step_as_it_lands_and_sigterm_leaves_a_readable_parquet(staged, tmp_path):
    run, out = tmp_path / "outputs" / "token_exports", tmp_path / "scan.parquet"
    proc = start(run, out)  # before the trainer wrote anything: it waits for the first step
    try:
        assert read_line(proc, "waiting for the first step")
        for step in range(3):
            land(staged, run, step)
            line = read_line(proc, f"step {step}:")  # a line per step on the terminal
            if step == 2:
                assert "bad: catastrophic_tokens" in line
            # written whole right after the step: within a few intervals of its line
            wait_for(lambda s=step: s in steps_in(out), 6 * INTERVAL + 5, f"step {step} in the parquet", proc)
        assert steps_in(out) == {0, 1, 2}
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        rest = proc.stdout.read()
        assert "stopped: 3 steps" in rest
    finally:
        if proc.poll() is None:
            proc.kill()
    got = read_scan(out)
    want = scan(run, list(ESTIMATORS), by="env_name", workers=1)  # the same table as one plain scan
    key = ["step", "group", "estimator"]
    got, want = (d.sort_values(key, na_position="first").reset_index(drop=True) for d in (got, want))
    pd.testing.assert_frame_equal(got[want.columns], want, check_dtype=False)
    assert not list(tmp_path.glob("*.tmp"))


@pytest.mark.slow
def test_sigint_mid_catch_up_ends_with_status_0_and_the_steps_read_so_far(staged, tmp_path):
    run, out = tmp_path / "run", tmp_path / "scan.parquet"
    for step in range(6):
        land(staged, run, step)
    proc = start(run, out)
    try:
        read_line(proc, "step 0:")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    held = steps_in(out)
    assert 0 in held and held <= set(range(6))  # whole: every step it holds was read completely
    df = read_scan(out)
    assert len(df) == len(held) * 3 * len(ESTIMATORS)  # (whole step, code, math) x estimators per step


def test_follow_reads_only_new_steps_and_reuses_the_parquet(staged, tmp_path):
    run, out = tmp_path / "run", tmp_path / "scan.parquet"
    for step in (0, 1):
        land(staged, run, step)
    lines = []
    df = follow(run, ESTIMATORS, by="env_name", out=out, interval=0.01, workers=1, looks=1,
                on_step=lambda r: lines.append(r["step"]))
    assert sorted(lines) == [0, 1] and set(df["step"]) == {0, 1}
    land(staged, run, 2)
    lines.clear()
    df = follow(run, ESTIMATORS, by="env_name", out=out, interval=0.01, workers=1, looks=2,
                on_step=lambda r: lines.append(r["step"]))
    assert lines == [2]  # steps 0 and 1 came from the parquet, and the second look read nothing
    s = df.attrs["summary"]
    assert (s["steps"], s["scanned"], s["cached"]) == (3, 1, 2)
    assert set(read_scan(out)["step"]) == {0, 1, 2}


def test_a_scanner_follows_markers_removals_and_failures(staged, tmp_path):
    run = tmp_path / "run"
    for step in (0, 1, 2):
        land(staged, run, step)
    (run / "step_2" / "STABLE").unlink()  # still being written
    s = Scanner(run, ESTIMATORS, by=None, workers=1)
    assert [r["step"] for r in s.update()] == [0, 1]
    assert set(s.table()["step"]) == {0, 1} and s.table().attrs["summary"]["unstable_left_out"] == [2]
    assert s.pending() == []  # nothing new: nothing read again
    (run / "step_2" / "STABLE").touch()
    assert [f.step for f in s.pending()] == [2]
    list(s.update())
    shutil.rmtree(run / "step_0")
    assert s.pending() == [] and set(s.table()["step"]) == {1, 2}  # a step that left the disk leaves the table
    rank = next((run / "step_1").glob("rank_*.jsonl"))
    rank.write_text(rank.read_text().replace('"inference_logprobs"', '"renamed"'))
    assert [f.step for f in s.pending()] == [1]
    with pytest.warns(UserWarning):
        list(s.update())
    assert set(s.table()["step"]) == {2} and len(s.table().attrs["summary"]["failed"]) == 1
    assert s.pending() == []  # an unchanged failing step is not read again every look
    shutil.copy(staged / "step_1" / rank.name, rank)  # fixed
    assert [f.step for f in s.pending()] == [1]
    list(s.update())
    assert set(s.table()["step"]) == {1, 2} and s.table().attrs["summary"]["failed"] == []


def test_scan_reuses_an_earlier_table_in_memory(staged, tmp_path):
    run = tmp_path / "run"
    for step in (0, 1):
        land(staged, run, step)
    first = scan(run, list(ESTIMATORS), workers=1)
    land(staged, run, 3)
    again = scan(run, list(ESTIMATORS), workers=1, reuse=first)
    assert (again.attrs["summary"]["scanned"], again.attrs["summary"]["cached"]) == (1, 2)
    assert set(again["step"]) == {0, 1, 3}
