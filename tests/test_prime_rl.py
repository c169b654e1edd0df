"""prime-rl's token export read as a Batch: every schema variant against the rollouts that were written,
the rl channel's mask (not the union), extras, refusals naming file and line, a folder's truncated last
line skipped with a warning."""

import io
import json
import warnings

import pytest
import torch

from seqis.io import BatchFormatError, load_batch, prime_rl_lines
from seqis.io.prime_rl import read_prime_rl, read_prime_rl_files
from seqis.runs.example import SCHEMAS, write_prime_rl_run


@pytest.fixture(scope="module", params=SCHEMAS)
def written(request, tmp_path_factory):
    """A small export in each schema, ranks 0 and 2 (a gap), and the rollouts written."""
    root = tmp_path_factory.mktemp(request.param)
    truth = write_prime_rl_run(root, steps=2, ranks=(0, 2), rollouts_per_rank=6, incident=(1, "code"),
                               schema=request.param)
    return root, truth


def loss_tokens(b, x):
    return x[b.loss_mask]  # (n_tokens,) in rollout order


def test_step_folder_is_the_rollouts_written(written):
    root, truth = written
    for step, want in truth.items():
        got = load_batch(root / f"step_{step}")
        assert got.shape[0] == want.shape[0] == 12
        assert torch.equal(got.loss_mask.sum(1), want.loss_mask.sum(1))  # the rl channel's tokens, not the union
        for field in ("trainer_logprobs", "inference_logprobs"):
            assert torch.equal(loss_tokens(got, getattr(got, field)), loss_tokens(want, getattr(want, field)))
        assert torch.equal(got.advantages, want.advantages)  # one per rollout: constant over its tokens
        assert got.metadata["env_name"] == want.metadata["env_name"]
        assert got.metadata["rank"] == [0] * 6 + [2] * 6
        assert got.metadata["step"] == [step] * 12
        assert got.metadata["line"] == list(range(1, 7)) * 2


def test_extras_are_per_token_and_aligned(written):
    root, _ = written
    b = load_batch(root / "step_0" / "rank_2.jsonl")
    records = [json.loads(line) for line in (root / "step_0" / "rank_2.jsonl").read_text().splitlines()]
    assert set(b.extras) == {"entropy", "token_ids"}
    for i, rec in enumerate(records):
        n = len(rec["token_ids"])
        assert b.extras["token_ids"][i, :n].tolist() == rec["token_ids"]
        assert (b.extras["token_ids"][i, n:] == -1).all()
        assert torch.equal(b.extras["entropy"][i, :n], torch.tensor(rec["entropy"], dtype=torch.float32))
    sub = b.select([1, 3])
    assert sub.extras["entropy"].shape == sub.shape  # carried by select


def test_prompt_tokens_are_outside_the_mask_and_their_nulls_are_fine(written):
    root, _ = written
    b = load_batch(root / "step_0" / "rank_0.jsonl")
    rec = json.loads((root / "step_0" / "rank_0.jsonl").read_text().splitlines()[0])
    assert rec["trainer_logprobs"][0] is None  # non-finite, written as null, on a prompt token
    assert not b.loss_mask[:, :8].any()


def test_prime_rls_own_results_are_not_read(tmp_path):
    write_prime_rl_run(tmp_path, steps=1, ranks=1, rollouts_per_rank=4, incident=None)
    path = tmp_path / "step_0" / "rank_0.jsonl"
    before = load_batch(path)
    records = [json.loads(line) for line in path.read_text().splitlines()]
    for r in records:  # garbage in every field prime-rl computes itself
        r["mismatch_kl"] = [123.0] * len(r["mismatch_kl"])
        r["is_masked"] = [True] * len(r["is_masked"])
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    after = load_batch(path)
    assert torch.equal(after.loss_mask, before.loss_mask) and torch.equal(after.inference_logprobs,
                                                                          before.inference_logprobs)


@pytest.fixture()
def one_rank(tmp_path):
    write_prime_rl_run(tmp_path, steps=1, ranks=(0, 1), rollouts_per_rank=4, incident=None)
    return tmp_path / "step_0"


def rewrite(path, edit):
    lines = path.read_text().splitlines()
    records = [json.loads(line) for line in lines]
    edit(records)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_truncated_last_line_single_file_refused_folder_skips_with_warning(one_rank):
    path = one_rank / "rank_1.jsonl"
    text = path.read_text()
    path.write_text(text[: len(text) - 200])  # the exporter is half-way through line 4
    with pytest.raises(BatchFormatError, match=r"rank_1\.jsonl: line 4: truncated JSON line"):
        load_batch(path)
    with pytest.warns(UserWarning, match=r"rank_1\.jsonl: line 4: truncated JSON line .*skipped"):
        b = load_batch(one_rank)
    assert b.shape[0] == 7 and b.metadata["rank"] == [0] * 4 + [1] * 3


@pytest.mark.parametrize("edit, message", [
    (lambda rs: rs[2].update(schema_version=2), r"line 3: schema_version 2; seqis reads .* schema_version 1"),
    (lambda rs: rs[1].pop("inference_logprobs"), r"line 2: no field 'inference_logprobs'"),
    (lambda rs: [r.pop("trainer_logprobs") for r in rs], r"no field 'trainer_logprobs' in any record"),
    (lambda rs: rs[3]["inference_logprobs"].append(-1.0), r"line 4: field 'inference_logprobs' has \d+ tokens"),
    (lambda rs: rs[0]["trainer_logprobs"].__setitem__(10, None), r"line 1, token 10: 'trainer_logprobs' is null"),
    (lambda rs: rs[0]["inference_logprobs"].__setitem__(9, 0.5), r"line 1, token 9: 'inference_logprobs' is 0.5"),
    (lambda rs: rs[2]["advantages"].__setitem__(9, None), r"line 3, token 9: 'advantages' is null"),
    (lambda rs: rs[1].update(trainer_logprobs="oops"), r"line 2: field 'trainer_logprobs' holds a str"),
    (lambda rs: rs[1]["entropy"].__setitem__(3, "x"), r"line 2, token 3: field 'entropy' holds str"),
])
def test_refusals_name_file_and_line(one_rank, edit, message):
    path = one_rank / "rank_0.jsonl"
    rewrite(path, edit)
    with pytest.raises(BatchFormatError, match=r"rank_0\.jsonl: " + message):
        load_batch(path)
    with pytest.raises(BatchFormatError, match=r"rank_0\.jsonl: " + message):
        load_batch(one_rank)  # a bad line mid-file is not a partial write: the folder refuses it too


def test_not_json_mid_file_names_the_line(one_rank):
    path = one_rank / "rank_0.jsonl"
    lines = path.read_text().splitlines()
    lines[1] = lines[1][:50]
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(BatchFormatError, match=r"rank_0\.jsonl: line 2: not valid JSON"):
        read_prime_rl(path)


def test_an_upload_is_recognised_and_its_records_read(one_rank):
    data = (one_rank / "rank_0.jsonl").read_bytes()
    upload = io.BytesIO(data)
    upload.name = "rank_0.jsonl"
    b = load_batch(upload)
    assert b.shape[0] == 4 and "entropy" in b.extras


def test_lines_longer_than_a_block_and_no_extras(tmp_path, monkeypatch):
    write_prime_rl_run(tmp_path, steps=1, ranks=1, rollouts_per_rank=3, incident=None)
    want = load_batch(tmp_path / "step_0" / "rank_0.jsonl")
    monkeypatch.setattr(prime_rl_lines, "_BLOCK", 1024)  # lines of several KB: blocks grow to the longest + 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        b, notes = read_prime_rl_files([tmp_path / "step_0" / "rank_0.jsonl"], extras=False)
    assert b.extras == {} and notes == []
    assert torch.equal(loss_tokens(b, b.trainer_logprobs), loss_tokens(want, want.trainer_logprobs))


@pytest.mark.parametrize("data", [b"", b"a\n", b"abc", b"ab\n\ncdefg\nh", b"x" * 50 + b"\n" + b"y" * 20,
                                  b"\n" * 9, b"12345678901234\n1\n"])
def test_longest_line_and_newlines_counted_chunk_by_chunk(tmp_path, monkeypatch, data):
    monkeypatch.setattr(prime_rl_lines, "_CHUNK", 7)  # lines across chunk edges
    *complete, last = data.split(b"\n")
    longest = max([len(line) + 1 for line in complete] + [len(last)])  # a line's bytes, its newline counted
    path = tmp_path / "f.jsonl"
    path.write_bytes(data)
    for source in (data, path):
        assert prime_rl_lines.line_stats(source, len(data)) == (len(complete), longest)
        assert prime_rl_lines._count_newlines(source, len(data)) == len(complete)
    if data:
        assert prime_rl_lines._count_newlines(path, len(data) - 1) == data[:-1].count(b"\n")
