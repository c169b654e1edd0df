"""prime-rl's first export layout (token_exports/rank_R.jsonl, every step appended) read as a run: the same
steps, batches and scan as the step folders it was later split into; line numbers of the whole file; a
half-written last line, a restarted trainer, lines without a step, a bad line mid-file, rescans, the
Ray task row carrying a step's spans, and a step as the one file the Run page hands to the other pages."""

import io
import json
import shutil

import pandas as pd
import pytest
import torch

from seqis.io import load_batch
from seqis.runs import load_run, scan
from seqis.runs.engines import _ray_scan_step, _task_row
from seqis.runs.example import write_prime_rl_run
from seqis.runs.step import ScanSettings, scan_step

RANKS = (0, 1, 3)
STEPS = 4


def flatten(folders, flat, steps=range(STEPS)):
    """The rank files as prime-rl's first layout wrote them: each rank's steps appended to one file."""
    flat.mkdir(parents=True, exist_ok=True)
    for rank in RANKS:
        with open(flat / f"rank_{rank}.jsonl", "ab") as f:
            for step in steps:
                f.write((folders / f"step_{step}" / f"rank_{rank}.jsonl").read_bytes())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("flat")
    folders = tmp / "folders" / "token_exports"
    write_prime_rl_run(folders, steps=STEPS, ranks=RANKS, rollouts_per_rank=4, envs=("math", "code"),
                       incident=(2, "code"))
    flatten(folders, tmp / "outputs" / "token_exports")
    return folders, tmp / "outputs"


def same_tensor(a, b):
    return a.shape == b.shape and torch.equal(torch.nan_to_num(a, nan=7.0), torch.nan_to_num(b, nan=7.0))


def test_the_first_layout_reads_as_the_step_folders(runs):
    folders, outputs = runs
    by_folder = load_run(folders)
    for path in (outputs, outputs / "token_exports"):
        assert load_run(path).steps == list(range(STEPS))
    flat = load_run(outputs)
    lines = {r: (outputs / "token_exports" / f"rank_{r}.jsonl").read_text().splitlines() for r in RANKS}
    for step in flat.steps:
        a, b = by_folder.batch(step), flat.batch(step)
        for field in ("trainer_logprobs", "inference_logprobs", "advantages", "loss_mask"):
            assert same_tensor(getattr(a, field), getattr(b, field)), (step, field)
        for key in ("entropy", "token_ids"):
            assert same_tensor(a.extras[key], b.extras[key]), (step, key)
        assert {k: v for k, v in a.metadata.items() if k != "line"} == \
               {k: v for k, v in b.metadata.items() if k != "line"}
        for rank, line, idx in zip(b.metadata["rank"], b.metadata["line"], b.metadata["micro_sequence_idx"]):
            record = json.loads(lines[rank][line - 1])  # `line` points into the whole rank file
            assert (record["step"], record["micro_sequence_idx"]) == (step, idx)
    scanned = [scan(path, ("seq_tis", "mis_po"), by="env_name", workers=1) for path in (outputs, folders)]
    pd.testing.assert_frame_equal(*(df.drop(columns="fingerprint") for df in scanned), check_exact=True)


def test_a_half_written_last_line_and_a_restarted_trainer(runs, tmp_path):
    folders, _ = runs
    flat = tmp_path / "token_exports"
    flatten(folders, flat)
    again = tmp_path / "again" / "token_exports"  # the restarted trainer's steps 2 and 3: other rollouts
    write_prime_rl_run(again, steps=STEPS, ranks=RANKS, rollouts_per_rank=4, envs=("math", "code"), seed=1)
    with open(flat / "rank_0.jsonl", "ab") as f:
        for step in (2, 3):
            f.write((again / f"step_{step}" / "rank_0.jsonl").read_bytes())
    text = (flat / "rank_1.jsonl").read_bytes()
    (flat / "rank_1.jsonl").write_bytes(text[:-500])  # step 3's last line still being written
    r = load_run(flat)
    assert r.steps == [0, 1, 2, 3]
    batch, notes = r.read(2)
    assert notes == ["rank_0.jsonl: step 2 is written twice (from line 9, again from line 17: a restarted "
                     "trainer?); the later lines are read"]
    rank0 = [i for i, rank in enumerate(batch.metadata["rank"]) if rank == 0]
    want = load_run(again).batch(2).select(list(range(4)))
    mine = batch.select(rank0)  # padded to this step's longest rollout: compare the loss tokens
    assert torch.equal(mine.trainer_logprobs[mine.loss_mask], want.trainer_logprobs[want.loss_mask])
    assert batch.select(rank0).metadata["line"] == [17, 18, 19, 20]
    batch, notes = r.read(3)
    assert notes[-1] == "rank_1.jsonl: line 16: truncated JSON line (a file still being written?): skipped"
    assert batch.metadata["rank"].count(1) == 3


def test_lines_without_a_step_are_one_step(runs, tmp_path):
    folders, _ = runs
    flat = tmp_path / "token_exports"
    flatten(folders, flat)
    for rank in RANKS:
        path = flat / f"rank_{rank}.jsonl"
        records = [json.loads(line) for line in path.read_text().splitlines()]
        path.write_text("".join(json.dumps({k: v for k, v in rec.items() if k != "step"}) + "\n" for rec in records))
    r = load_run(flat)
    assert r.steps == [0] and r.batch(0).shape[0] == STEPS * len(RANKS) * 4
    (flat / "rank_1.jsonl").write_text((flat / "rank_1.jsonl").read_text() + '{"schema_version":1,"step":5}\n')
    with pytest.raises(ValueError, match=r"rank_0.jsonl, line 1: no 'step' field, while other lines have one"):
        load_run(flat)


def test_a_bad_line_mid_file_names_its_line_and_the_scan_goes_on(runs, tmp_path):
    folders, _ = runs
    flat = tmp_path / "token_exports"
    flatten(folders, flat)
    lines = (flat / "rank_1.jsonl").read_text().splitlines()
    lines[9] = lines[9].replace('"schema_version":1', '"schema_version":7')  # step 2's second line
    (flat / "rank_1.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.warns(UserWarning, match="line 10: schema_version 7"):
        df = scan(flat, ("seq_tis",), workers=1)
    assert df.attrs["summary"]["failed"] == ["step 2: rank_1.jsonl: line 10: schema_version 7; seqis reads prime-rl "
                                             "token exports of schema_version 1"]
    assert sorted(df["step"].unique()) == [0, 1, 3]


def test_rescans_read_only_the_steps_appended(runs, tmp_path):
    folders, _ = runs
    flat = tmp_path / "token_exports"
    flatten(folders, flat, steps=range(STEPS - 1))
    out = tmp_path / "scan.parquet"
    assert scan(flat, ("seq_tis",), workers=1, out=out).attrs["summary"]["scanned"] == STEPS - 1
    flatten(folders, flat, steps=[STEPS - 1])  # the trainer appends a step to every rank file
    again = scan(flat, ("seq_tis",), workers=1, out=out)
    assert (again.attrs["summary"]["scanned"], again.attrs["summary"]["cached"]) == (1, STEPS - 1)
    pd.testing.assert_frame_equal(again, scan(flat, ("seq_tis",), workers=1))
    shutil.copy(flat / "rank_0.jsonl", tmp_path / "copy")
    (flat / "rank_0.jsonl").write_bytes((tmp_path / "copy").read_bytes().replace(b'"env_name":"math"',
                                                                                  b'"env_name":"htam"', 1))
    changed = scan(flat, ("seq_tis",), workers=1, out=out)  # step 0's lines rewritten in place: reread
    assert (changed.attrs["summary"]["scanned"], changed.attrs["summary"]["cached"]) == (1, STEPS - 1)


def test_rays_task_row_carries_the_steps_lines(runs):
    _, outputs = runs
    files = load_run(outputs).files(2)
    settings = ScanSettings(("seq_tis",), "env_name")
    via_row = json.loads(_ray_scan_step(_task_row(files), ["seq_tis"], "env_name")["result"])
    assert via_row == json.loads(json.dumps(scan_step(files, settings)))


def test_a_step_as_one_file_for_the_pages(runs):
    _, outputs = runs
    r = load_run(outputs)
    name, payload = r.step_file(2)  # what the Run page hands to Explore and Diagnose
    assert name == "outputs step_2.jsonl" and payload.count(b"\n") == len(RANKS) * 4
    upload = io.BytesIO(payload)
    upload.name = name
    got, want = load_batch(upload), r.batch(2)
    assert same_tensor(got.trainer_logprobs, want.trainer_logprobs)
    assert got.metadata["step"] == want.metadata["step"] and got.metadata["rank"] == want.metadata["rank"]
