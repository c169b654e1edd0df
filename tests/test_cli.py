"""`python -m seqis`: usage with every command, a clear refusal of an unknown one, dispatch to a command."""

import subprocess
import sys

from seqis.__main__ import COMMANDS, main


def test_no_arguments_prints_usage_listing_every_command(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m seqis COMMAND")
    for name in COMMANDS:
        assert f"  {name}" in out


def test_unknown_command_is_refused_with_usage(capsys):
    assert main(["frobnicate"]) == 2
    err = capsys.readouterr().err
    assert "unknown command 'frobnicate'" in err and "commands:" in err


def test_runs_as_a_module():
    res = subprocess.run([sys.executable, "-m", "seqis"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "bench" in res.stdout


def test_the_seqis_console_script_runs_each_command_as_python_m_seqis(tmp_path):
    # the script pip installed from [project.scripts] (pip install -e . puts it beside this interpreter)
    from pathlib import Path

    import pytest

    script = Path(sys.executable).parent / "seqis"
    if not script.exists():
        pytest.skip(f"no console script at {script} (pip install -e . installs it)")
    root = Path(__file__).resolve().parent.parent
    usage = subprocess.run([str(script)], capture_output=True, text=True, timeout=120)
    assert usage.returncode == 0 and usage.stdout.startswith("usage: seqis COMMAND")
    assert all(f"  {name}" in usage.stdout for name in COMMANDS)
    outputs = {}
    for args in (("diagnose", str(root / "assets" / "catastrophic.jsonl")), ("bench", "--help")):
        got = subprocess.run([str(script), *args], capture_output=True, text=True, timeout=300)
        want = subprocess.run([sys.executable, "-m", "seqis", *args], capture_output=True, text=True, timeout=300)
        assert (got.returncode, got.stdout) == (want.returncode, want.stdout), args
        outputs[args[0]] = got.stdout
    assert "catastrophic_tokens" in outputs["diagnose"] and "--only" in outputs["bench"]
    from seqis.runs.example import write_prime_rl_run

    write_prime_rl_run(tmp_path / "run", steps=2, ranks=1, rollouts_per_rank=4)
    done = subprocess.run([str(script), "scan", str(tmp_path / "run"), "--out", str(tmp_path / "scan.parquet"),
                           "--estimators", "seq_tis", "--workers", "1"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    from seqis.runs import read_scan

    assert set(read_scan(tmp_path / "scan.parquet")["step"]) == {0, 1}
