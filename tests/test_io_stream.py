"""A JSONL dump is read line by line (issue 43: a 300 MB dump): the loader never holds the whole text decoded and
split, so its Python-side peak stays near the file's size (it was 4.2x: the bytes, their decoded text and the
split lines at once), and what it reads is what was written."""

import tracemalloc

import torch

from seqis import Batch
from seqis.io import load_batch, save_batch


def _dump(tmp_path):
    B, T = 64, 4000
    g = torch.Generator().manual_seed(0)
    inference = -torch.rand(B, T, generator=g).pow(8) * 8  # (B, T)
    b = Batch(inference - 0.01, inference, torch.randn(B, generator=g), torch.ones(B, T, dtype=torch.bool))
    path = tmp_path / "dump.jsonl"
    save_batch(b, path)
    return b, path


def test_a_jsonl_dump_loads_line_by_line_within_twice_its_size(tmp_path):
    b, path = _dump(tmp_path)
    load_batch(path)  # warm: the readers' imports and caches are not the load's
    tracemalloc.start()
    try:
        got = load_batch(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 * path.stat().st_size, peak / path.stat().st_size
    assert torch.equal(got.trainer_logprobs, b.trainer_logprobs) and torch.equal(got.loss_mask, b.loss_mask)


def test_bytes_in_memory_read_alike_and_a_cut_last_line_is_named(tmp_path):
    b, path = _dump(tmp_path)
    raw = path.read_bytes()
    assert torch.equal(load_batch(raw, format="jsonl").inference_logprobs, b.inference_logprobs)
    cut = raw[: raw.rindex(b"\n", 0, len(raw) - 1) + 200]  # the last line stops mid-record
    try:
        load_batch(cut, format="jsonl")
    except ValueError as e:
        assert "is truncated: its last line (64) stops mid-record" in str(e)
    else:
        raise AssertionError("a cut-off JSONL loaded")
