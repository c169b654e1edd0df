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
