"""`python -m seqis`: usage with every command, a clear refusal of an unknown one, dispatch to a command; the
diagnose command's column mapping and its one-line refusals."""

import json
import subprocess
import sys

import pytest
import torch

import seqis.io as sio
from seqis import Batch
from seqis.__main__ import COMMANDS, main
from seqis.io import save_batch
from seqis.samplers.scenarios import make_batch


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


@pytest.mark.slow  # make test runs it; the fast suite stays under two minutes
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


# ---------------------------------------------------------------------------------------------------------
# python -m seqis diagnose: --columns, one-line refusals, --debug


@pytest.fixture(scope="module")
def odd_names(tmp_path_factory):
    """A batch saved under column names the loader does not know, and one without a loss token."""
    d = tmp_path_factory.mktemp("cli")
    b = make_batch("gaussian", seed=1, n_rollouts=16, max_len=64)
    save_batch(b, d / "odd.parquet", columns={"trainer_logprobs": "logp_fsdp", "inference_logprobs": "logp_vllm",
                                              "loss_mask": "mask"})
    empty = Batch(b.trainer_logprobs, b.inference_logprobs, b.advantages, torch.zeros(b.shape, dtype=torch.bool))
    save_batch(empty, d / "prompts.npz")
    (d / "broken.parquet").write_bytes(b"PAR1 not really")
    return d


def refusal(capsys, argv) -> str:
    assert main(["diagnose", *argv]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err
    return lines[0]


def test_a_refused_file_is_one_line_naming_the_path(odd_names, capsys):
    path = str(odd_names / "broken.parquet")
    line = refusal(capsys, [path])
    assert line.startswith(f"seqis: {path}: is truncated: it starts as a parquet file but its footer")
    line = refusal(capsys, [str(odd_names / "missing.parquet")])
    assert line.startswith(f"seqis: {odd_names / 'missing.parquet'}: cannot be opened")
    line = refusal(capsys, [str(odd_names / "prompts.npz")])
    assert line == (f"seqis: {odd_names / 'prompts.npz'}: no loss tokens: the loss mask is 0 on every token of its "
                    "16 rollouts (prompts or padding only); nothing to estimate or diagnose")


def test_odd_column_names_are_mapped_with_columns(odd_names, capsys):
    path = str(odd_names / "odd.parquet")
    line = refusal(capsys, [path])
    assert "no trainer logprobs column" in line and "(pass --columns trainer_logprobs=<name>)" in line
    assert "'logp_fsdp'" in line  # the columns present
    assert main(["diagnose", path, "--columns", "trainer_logprobs=logp_fsdp,inference_logprobs=logp_vllm,"
                 "loss_mask=mask", "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found and all(f["kind"] != "no_loss_tokens" for f in found)
    line = refusal(capsys, [path, "--columns", "trainer_logprobs=nope,inference_logprobs=logp_vllm"])
    assert "column 'nope' (given for trainer_logprobs) is not in the file" in line
    line = refusal(capsys, [path, "--columns", "trainer_logprobs=logp_fsdp,inference_logprobs=logp_vllm",
                            "--by", "no_such"])
    assert "by='no_such' is not a metadata column" in line


@pytest.mark.parametrize("spec, message", [
    ("trainer_logprobs", "'trainer_logprobs' is not ROLE=NAME"),
    ("logp=trainer_logprobs", "'logp' is not a role; roles: trainer_logprobs, inference_logprobs"),
    ("loss_mask=a,loss_mask=b", "loss_mask is given twice"),
    (",", "give at least one ROLE=NAME"),
])
def test_a_bad_columns_spec_is_a_usage_error(spec, message, capsys):
    with pytest.raises(SystemExit) as e:
        main(["diagnose", "x.parquet", "--columns", spec])
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_debug_shows_the_traceback(odd_names, capsys):
    assert main(["diagnose", str(odd_names / "broken.parquet"), "--debug"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and err.strip().splitlines()[-1].startswith("seqis: ")


def test_diagnose_of_a_refused_file_as_a_process(odd_names):
    res = subprocess.run([sys.executable, "-m", "seqis", "diagnose", str(odd_names / "broken.parquet")],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 1 and res.stdout == "" and len(res.stderr.strip().splitlines()) == 1


def test_diagnose_help_describes_every_option_in_full_sentences(capsys):
    # issue 43: the description was the docstring's first line, cut off mid-sentence ("...: why a")
    from seqis.diagnosis import cli

    with pytest.raises(SystemExit) as e:
        main(["diagnose", "--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    description = text.split("\n\n", 1)[1].split("\npositional arguments:")[0].strip()
    assert description.startswith("Why a batch's trainer and sampler disagree") and description.endswith(".")
    assert all(p.rstrip().endswith((".", ":")) for p in description.split("\n\n")), description
    options = {o for o in text.split("\noptions:")[1].split() if o.startswith("--") and o != "--help"}
    assert options == {"--columns", "--by", "--max-bytes", "--json", "--strict", "--debug"}
    for option in options:
        assert f"`{option}" in description and f"  {option}" in text, option
    assert cli.ROLES == tuple(sio.ALIASES)  # --columns offers every role the loader has


def test_max_bytes_is_read_with_units_and_named_in_the_refusal(odd_names, capsys):
    path = str(odd_names / "prompts.npz")
    line = refusal(capsys, [path, "--max-bytes", "1K"])
    assert line.startswith(f"seqis: {path}: is ") and line.endswith(" over the 1 KB limit (--max-bytes SIZE raises it)")
    line = refusal(capsys, [path, "--max-bytes", "400MB"])
    assert "no loss tokens" in line  # read, then refused for what it holds
    from seqis.runs.example import write_prime_rl_run

    write_prime_rl_run(odd_names / "export", steps=1, ranks=2, rollouts_per_rank=2, incident=None)
    step = str(odd_names / "export" / "step_0")
    line = refusal(capsys, [step, "--max-bytes", "2KB"])  # a prime-rl step folder: its rank files together
    assert line.startswith(f"seqis: {step}: ") and line.endswith(" KB of rank files, over the 2 KB limit (--max-bytes "
                                                                "SIZE raises it)")
    assert [sio.parse_size(t) for t in ("4096", "1k", "1.5 MB", "2G", "none")] == [4096, 1024, 3 * 2**19, 2**31, None]
    for bad in ("lots", "-1MB", "1TB", "", "nan", "inf"):
        with pytest.raises(ValueError, match="is not a size"):
            sio.parse_size(bad)
    with pytest.raises(SystemExit) as e:
        main(["diagnose", path, "--max-bytes", "lots"])
    assert e.value.code == 2 and "'lots' is not a size: bytes, or a number with K, M, G" in capsys.readouterr().err


def test_two_frameworks_names_for_one_role_name_the_columns_flag(tmp_path, capsys):
    row = {"old_log_probs": [-0.5], "prev_logprobs": [-0.75], "rollout_log_probs": [-0.5], "advantages": 1.0}
    (tmp_path / "both.jsonl").write_text(json.dumps(row))
    line = refusal(capsys, [str(tmp_path / "both.jsonl")])
    assert line.endswith("columns 'old_log_probs' and 'prev_logprobs' are both a trainer logprobs column, as two "
                         "frameworks name it (pass --columns trainer_logprobs=<name> to say which)"), line


def test_the_usage_says_where_the_explorer_runs_and_what_a_package_install_has():
    from seqis.__main__ import usage

    text = usage()
    assert "runs from a clone" in text and "package install has the library and this command line" in text
