"""Whole runs: load_run's layouts, scan's rows against diagnostics and run on each step's subset, the
incident on top, bad files reported while the scan goes on, steps still being written, incremental
rescans, the engines agreeing (local processes, Ray), and the command line."""

import shutil
from pathlib import Path

import pandas as pd
import pytest

from seqis import diagnostics, run
from seqis.io import save_batch
from seqis.runs import load_run, read_scan, scan
from seqis.runs.cli import main as cli_main
from seqis.runs.example import write_prime_rl_run
from seqis.runs.layout import StepFiles
from seqis.runs.step import ScanSettings, scan_step
from seqis.samplers.scenarios import make_batch

ESTIMATORS = ("seq_tis", "mis_po", "geo_mask", "token_tis")
ENVS = ("math", "code", "chat")
INCIDENT = (3, "code")


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """A prime-rl export: 6 steps x ranks 0, 1, 3 x three environments, an incident at step 3 in code."""
    root = tmp_path_factory.mktemp("run") / "outputs"
    truth = write_prime_rl_run(root / "token_exports", steps=6, ranks=(0, 1, 3), rollouts_per_rank=6, envs=ENVS,
                               incident=INCIDENT)
    return root, truth


@pytest.fixture(scope="module")
def scanned(generated):
    root, _ = generated
    return scan(root, ESTIMATORS, by="env_name", workers=1)


def copy_run(generated, tmp_path):
    dst = tmp_path / "token_exports"
    shutil.copytree(generated[0] / "token_exports", dst)
    return dst


def rows_of(df, step, group, estimator):
    in_group = df["group"].isna() if group is None else df["group"] == group
    rows = df[(df["step"] == step) & in_group & (df["estimator"] == estimator)]
    assert len(rows) == 1, (step, group, estimator)
    return rows.iloc[0]


def test_load_run_finds_the_tree_from_any_level(generated):
    root, truth = generated
    for path in (root, root / "token_exports"):
        r = load_run(path)
        assert r.steps == list(truth) and r.unstable_steps == []
        assert r.batch(2).metadata["rank"] == [0] * 6 + [1] * 6 + [3] * 6


def test_scan_rows_equal_diagnostics_and_run_on_each_steps_subset(generated, scanned):
    _, truth = generated  # the rollouts as written: the scan's reading, grouping and metrics all checked
    assert len(scanned) == len(truth) * (1 + len(ENVS)) * len(ESTIMATORS)
    for step, batch in truth.items():
        envs = batch.metadata["env_name"]
        for group in (None, *ENVS):
            sub = batch if group is None else batch.select([i for i, e in enumerate(envs) if e == group])
            want = diagnostics(sub)
            for name in ESTIMATORS:
                out = run(name, sub)
                row = rows_of(scanned, step, group, name)
                for key, value in {**want, **out.scalars()}.items():
                    assert row[key] == pytest.approx(value, rel=1e-5, abs=1e-9), (step, group, name, key)
                kept = out.masks["kept"].sum().item() / sub.loss_mask.sum().item()
                assert row["dropped"] == pytest.approx(1 - kept, abs=1e-12)


def test_the_incident_is_the_top_row(scanned):
    top = scanned.iloc[0]
    assert (top["step"], top["group"]) == INCIDENT
    assert (top["severity"], top["finding"]) == ("bad", "catastrophic_tokens")  # seqis.diagnosis.causes names it
    assert top["kl_k3"] > 10 * scanned[scanned["step"] != INCIDENT[0]]["kl_k3"].max()


def test_bad_files_mid_run_are_reported_and_the_scan_goes_on(generated, tmp_path):
    root = copy_run(generated, tmp_path)
    text = (root / "step_1" / "rank_3.jsonl").read_text()
    (root / "step_1" / "rank_3.jsonl").write_text(text[:-300])  # truncated: its last line skipped
    lines = (root / "step_2" / "rank_1.jsonl").read_text().splitlines()
    lines[4] = lines[4].replace('"schema_version":1', '"schema_version":7')
    (root / "step_2" / "rank_1.jsonl").write_text("\n".join(lines) + "\n")
    lines = (root / "step_4" / "rank_0.jsonl").read_text().splitlines()
    lines[0] = lines[0].replace('"inference_logprobs"', '"renamed"')
    (root / "step_4" / "rank_0.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.warns(UserWarning) as caught:
        df = scan(root, ("seq_tis",), by="env_name", workers=1)
    summary = df.attrs["summary"]
    assert summary["failed"] == ["step 2: rank_1.jsonl: line 5: schema_version 7; seqis reads prime-rl token "
                                 "exports of schema_version 1",
                                 "step 4: rank_0.jsonl: line 1: no field 'inference_logprobs'"]
    assert summary["skipped"] == ["rank_3.jsonl: line 6: truncated JSON line (a file still being written?): skipped"]
    assert summary["scanned"] == 4 and sorted(df["step"].unique()) == [0, 1, 3, 5]
    assert len(caught) == 3
    assert rows_of(df, 1, None, "seq_tis")["n_rollouts"] == 17  # 18 written, one half-written line skipped


def test_steps_still_being_written_are_read_only_when_asked(generated, tmp_path):
    root = copy_run(generated, tmp_path)
    (root / "step_5" / "STABLE").unlink()
    text = (root / "step_5" / "rank_1.jsonl").read_text()
    (root / "step_5" / "rank_1.jsonl").write_text(text[:-100])
    r = load_run(root)
    assert r.steps == [0, 1, 2, 3, 4] and r.unstable_steps == [5]
    with pytest.warns(UserWarning, match="rank_1.jsonl: line 6: truncated"):
        assert r.batch(5).shape[0] == 17
    df = scan(root, ("seq_tis",), workers=1)
    assert 5 not in set(df["step"]) and df.attrs["summary"]["unstable_left_out"] == [5]
    with pytest.warns(UserWarning, match="truncated"):
        df = scan(root, ("seq_tis",), workers=1, include_unstable=True)
    assert 5 in set(df["step"])


def test_rescans_read_only_new_steps(generated, tmp_path):
    root = copy_run(generated, tmp_path)
    shutil.move(root / "step_5", tmp_path / "later")
    out = tmp_path / "scan.parquet"
    first = scan(root, ESTIMATORS, by="env_name", workers=1, out=out)
    assert first.attrs["summary"]["scanned"] == 5
    shutil.move(tmp_path / "later", root / "step_5")
    again = scan(root, ESTIMATORS, by="env_name", workers=1, out=out)
    assert (again.attrs["summary"]["scanned"], again.attrs["summary"]["cached"]) == (1, 5)
    fresh = scan(root, ESTIMATORS, by="env_name", workers=1)
    pd.testing.assert_frame_equal(again, fresh)
    pd.testing.assert_frame_equal(read_scan(out), fresh)
    (root / "step_2" / "rank_0.jsonl").write_text((root / "step_2" / "rank_0.jsonl").read_text())  # touched
    changed = scan(root, ESTIMATORS, by="env_name", workers=1, out=out)
    assert (changed.attrs["summary"]["scanned"], changed.attrs["summary"]["cached"]) == (1, 5)
    other = scan(root, ("seq_tis",), by="env_name", workers=1, out=out)  # other settings: nothing reused
    assert other.attrs["summary"]["cached"] == 0


def test_local_processes_give_the_same_table(generated, scanned):
    pd.testing.assert_frame_equal(scan(generated[0], ESTIMATORS, by="env_name", workers=2), scanned,
                                  check_exact=True)  # one thread in every worker: to the bit


@pytest.mark.slow  # a local Ray (~10 s to start); a real two-node cluster: tests/test_runs_cluster.py
def test_ray_gives_the_same_table_and_progress(generated, local_ray):
    calls = {"local": [], "ray": []}
    local, on_ray = (scan(generated[0], ("seq_tis", "mis_po"), by="env_name", engine=engine, workers=1,
                          progress=lambda *call, engine=engine: calls[engine].append(call)) for engine in calls)
    pd.testing.assert_frame_equal(on_ray, local, check_exact=True)
    for engine, made in calls.items():  # progress(done, total, step) once per step as it finishes, either engine
        assert [(done, total) for done, total, _ in made] == [(k, 6) for k in range(1, 7)], engine
        assert sorted(step for _, _, step in made) == list(range(6)), engine


def test_paths_are_absolute_before_a_task_leaves_this_process(generated, monkeypatch, scanned):
    from seqis.runs.engines import _task_row

    root = generated[0]
    monkeypatch.chdir(root.parent)
    r = load_run(root.name)  # relative to this process's folder
    assert r.path == root and all(p.is_absolute() for s in r.steps for p in r.files(s).files)
    row = _task_row(StepFiles(0, (Path(root.name) / "token_exports" / "step_0" / "rank_0.jsonl",), True, True))
    assert row["files"] == [str(root / "token_exports" / "step_0" / "rank_0.jsonl")]
    df = scan(root.name, ESTIMATORS, by="env_name", workers=1)
    assert df.attrs["path"] == str(root)
    pd.testing.assert_frame_equal(df, scanned)


def test_a_step_file_gone_after_listing_is_reported_with_its_path_and_the_scan_goes_on(tmp_path):
    root = tmp_path / "token_exports"
    write_prime_rl_run(root, steps=3, ranks=2, rollouts_per_rank=4)
    gone = root / "step_1" / "rank_1.jsonl"
    removed = lambda done, total, step: gone.unlink() if step == 0 else None  # listed, then gone before its read
    with pytest.warns(UserWarning, match="step 1"):
        df = scan(root, ("seq_tis",), workers=1, progress=removed)  # workers=1: the steps in order, here
    [error] = df.attrs["summary"]["failed"]
    assert error.startswith("step 1: ") and str(gone) in error  # (its stat failed: the file's whole path)
    assert sorted(df["step"].unique()) == [0, 2]
    result = scan_step(StepFiles(1, (gone,), stable=True, prime_rl=True), ScanSettings(("seq_tis",)))
    assert result["rows"] == [] and result["unreadable"] == str(gone)


def test_a_folder_of_step_named_dumps(tmp_path):
    for step in (3, 10):
        for part in range(2):
            b = make_batch("gaussian", seed=step * 10 + part, n_rollouts=8, max_len=32 + 8 * part)
            save_batch(b, tmp_path / f"global_step_{step}_part{part}.parquet")
    r = load_run(tmp_path)
    b = r.batch(10)
    assert r.steps == [3, 10] and b.shape[0] == 16
    assert b.metadata["step"] == [10] * 16 and b.metadata["file"][-1] == "global_step_10_part1.parquet"
    df = scan(tmp_path, ("seq_tis",), by="group_id", workers=1)
    assert set(df["step"]) == {3, 10}
    out = tmp_path / "scan.parquet"
    assert cli_main([str(tmp_path), "--out", str(out), "--estimators", "seq_tis", "--workers", "1"]) == 0
    assert read_scan(out)["group"].isna().all()  # no env_name in these dumps: whole steps only


def test_a_step_without_the_by_column_is_one_group_with_a_note(tmp_path, capsys):
    # verl-style dumps: only step 2 carries env_name (a mixed folder); by="env_name" skips none of them
    for step in range(4):
        b = make_batch("gaussian", seed=step, n_rollouts=8, max_len=32)
        if step == 2:
            b.metadata["env_name"] = ["math", "code"] * 4
        save_batch(b, tmp_path / f"step_{step}.parquet")
    df = scan(tmp_path, ("seq_tis",), by="env_name", workers=1)
    s = df.attrs["summary"]
    assert sorted(df["step"].unique()) == [0, 1, 2, 3] and s["failed"] == [] and s["scanned"] == 4
    assert set(df.loc[df["step"] == 2, "group"].dropna()) == {"math", "code"}
    assert df.loc[df["step"] != 2, "group"].isna().all()
    assert s["ungrouped"] == [0, 1, 3]
    assert s["notes"] == ["3 of 4 steps have no metadata column 'env_name': each is scanned as one group "
                          "(group None): steps 0, 1, 3"]
    out = tmp_path / "scan.parquet"
    assert cli_main([str(tmp_path), "--out", str(out), "--estimators", "seq_tis", "--workers", "1",
                     "--by", "data_source"]) == 0
    printed = capsys.readouterr().out
    assert "4 steps (4 read" in printed and "note: 4 of 4 steps have no metadata column 'data_source'" in printed
    again = scan(tmp_path, ("seq_tis",), by="data_source", workers=1, out=out)  # from the cache: the same note
    assert again.attrs["summary"]["cached"] == 4 and again.attrs["summary"]["ungrouped"] == [0, 1, 2, 3]


def test_multi_run_exports_need_a_run_id(tmp_path):
    for run_id in ("a", "b"):
        write_prime_rl_run(tmp_path / run_id / "token_exports", steps=2 if run_id == "a" else 3, ranks=1,
                           rollouts_per_rank=2, incident=None)
    with pytest.raises(ValueError, match=r"several runs \(a, b\): pass run_id="):
        load_run(tmp_path)
    assert load_run(tmp_path, run_id="b").steps == [0, 1, 2]
    assert load_run(tmp_path / "a").steps == [0, 1]


def test_exports_from_before_the_stable_marker_count_as_complete(tmp_path):
    write_prime_rl_run(tmp_path, steps=3, ranks=1, rollouts_per_rank=2, incident=None, stable=False)
    assert load_run(tmp_path).steps == [0, 1, 2]


def test_command_line(generated, tmp_path, capsys):
    out = tmp_path / "scan.parquet"
    assert cli_main([str(generated[0]), "--out", str(out), "--estimators", "seq_tis,mis_po", "--workers", "1"]) == 0
    printed = capsys.readouterr()
    assert "6 steps (6 read, 0 from" in printed.out and "worst: step 3, group code" in printed.out
    assert "6/6 steps" in printed.err
    assert len(read_scan(out)) == 6 * 4 * 2
    assert cli_main([str(tmp_path / "nowhere"), "--out", str(out)]) == 2


def test_a_step_as_one_file_for_the_pages(generated, tmp_path):
    import io

    from seqis.io import load_batch

    root = copy_run(generated, tmp_path)
    text = (root / "step_2" / "rank_1.jsonl").read_text()
    (root / "step_2" / "rank_1.jsonl").write_text(text[:-50])
    r = load_run(root)
    name, data = r.step_file(2)
    upload = io.BytesIO(data)
    upload.name = name
    b = load_batch(upload)
    assert name.endswith("step_2.jsonl") and b.shape[0] == 17 and b.metadata["rank"][-1] == 3
    assert "entropy" in b.extras


def test_incidents_are_the_outlying_step_and_group(scanned):
    from seqis.runs import incidents

    found = incidents(scanned)
    assert (found.iloc[0]["step"], found.iloc[0]["group"]) == INCIDENT
    assert found.iloc[0]["reason"].startswith(("bad:", "warn:", "kl_k3"))
    assert len(found) <= 2  # the code environment of step 3, and step 3 as a whole at most


def test_a_scan_of_a_run_with_no_readable_step_writes_a_table_that_reads_back(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "step_0.parquet").write_bytes(b"PAR1 cut short")  # found by load_run, refused by its reader
    out = tmp_path / "scan.parquet"
    with pytest.warns(UserWarning, match="step 0"):
        df = scan(tmp_path / "run", ("seq_tis",), workers=1, out=out)
    assert df.empty and len(df.attrs["summary"]["failed"]) == 1
    again = read_scan(out)  # found by the fuzz test: an empty scan used to be written without kl_k3
    assert again.empty and again.attrs["summary"]["failed"] == df.attrs["summary"]["failed"]


def dumps_with_an_unreadable_first_step(folder: Path) -> Path:
    folder.mkdir()
    (folder / "step_0.parquet").write_bytes(b"PAR1 cut short")  # found by load_run, refused by its reader
    for step in (1, 2):
        b = make_batch("gaussian", seed=step, n_rollouts=8, max_len=32)
        b.metadata["env_name"] = ["math", "code"] * 4
        save_batch(b, folder / f"step_{step}.parquet")
    return folder


def test_command_line_keeps_the_readable_steps_when_the_first_is_unreadable(tmp_path, capsys):
    # issue 43: the default --by read step 0 first, so its refusal ended the scan (exit 2, nothing written)
    run_dir = dumps_with_an_unreadable_first_step(tmp_path / "run")
    out = tmp_path / "scan.parquet"
    assert cli_main([str(run_dir), "--out", str(out), "--estimators", "seq_tis", "--workers", "1"]) == 1
    printed = capsys.readouterr().out
    assert "3 steps (2 read" in printed and "NOT READ: step 0: step_0.parquet: is truncated" in printed
    df = read_scan(out)
    assert sorted(df["step"].unique()) == [1, 2] and set(df["group"].dropna()) == {"math", "code"}  # by env_name


def test_command_line_max_bytes(tmp_path, capsys):
    run_dir = dumps_with_an_unreadable_first_step(tmp_path / "run")
    (run_dir / "step_0.parquet").unlink()
    out = tmp_path / "scan.parquet"
    assert cli_main([str(run_dir), "--out", str(out), "--estimators", "seq_tis", "--workers", "1",
                     "--max-bytes", "1K"]) == 1
    printed = capsys.readouterr().out
    assert "NOT READ: step 1: step_1.parquet: is " in printed and "over the 1 KB limit (--max-bytes SIZE raises it)" \
        in printed and "max_bytes=" not in printed
    assert cli_main([str(run_dir), "--out", str(out), "--estimators", "seq_tis", "--workers", "1",
                     "--max-bytes", "1MB"]) == 0
    assert sorted(read_scan(out)["step"].unique()) == [1, 2]
    with pytest.raises(SystemExit) as e:
        cli_main([str(run_dir), "--out", str(out), "--max-bytes", "lots"])
    assert e.value.code == 2 and "'lots' is not a size" in capsys.readouterr().err
