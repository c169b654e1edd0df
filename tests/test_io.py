"""Loading and saving batches: round trips for every format and layout, every refusal with its message,
fuzzing (only BatchFormatError may come out), and the shipped assets."""

import io
import json
import math
import pickle
import zipfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file
from strategies import examples

import seqis.io as sio
import seqis.io.load as sio_load
from seqis import Batch, run
from seqis.io import FORMATS, VERL_NAMES, BatchFormatError, list_assets, load_batch, save_batch
from seqis.io.write import LAYOUTS
from seqis.samplers.scenarios import make_batch

COMBOS = [(fmt, layout, split) for fmt in FORMATS for layout in ("rows", "padded", "packed")
          for split in (("position_ids", "seq_lens") if layout == "packed" else ("position_ids",))
          if fmt in LAYOUTS[layout]]


def example(per_token_adv=False, dtype=torch.float32) -> Batch:
    """A small long-tailed batch with text and numeric metadata, an empty rollout, a mask with holes and
    padding that holds -inf and NaN."""
    b = make_batch("catastrophic", seed=3, n_rollouts=12, max_len=40, min_len=1, group_size=4, dtype=dtype)
    B, T = b.shape
    mask = b.loss_mask.clone()
    mask[1, :3] = False  # a prompt-like hole at the start of a rollout
    mask[5] = False  # an empty rollout
    tl = torch.where(mask, b.trainer_logprobs, torch.tensor(-math.inf, dtype=dtype))
    il = torch.where(mask, b.inference_logprobs, torch.tensor(math.nan, dtype=dtype))
    adv = b.advantages[:, None].expand(B, T) * torch.linspace(0.5, 1.5, T, dtype=dtype) if per_token_adv else (
        b.advantages)
    meta = dict(b.metadata, env=[f"env{j % 3}" for j in range(B)], step=[7] * B)
    return Batch(tl, il, adv.contiguous(), mask, meta)


def assert_same(a: Batch, b: Batch, exact_dtype=True):
    """Equal as batches: same rollouts, masks, values on loss tokens, advantages and metadata."""
    assert a.shape[0] == b.shape[0]
    T = max(a.shape[1], b.shape[1])

    def pad(x, value=0):
        return torch.nn.functional.pad(x, (0, T - x.shape[1]), value=value)

    ma, mb = pad(a.loss_mask, False), pad(b.loss_mask, False)
    assert torch.equal(ma, mb)
    for name in ("trainer_logprobs", "inference_logprobs"):
        xa, xb = getattr(a, name), getattr(b, name)
        if exact_dtype:
            assert xa.dtype == xb.dtype, name
        assert torch.equal(pad(xa)[ma].double(), pad(xb)[mb].double()), name
    assert a.advantages.dim() == b.advantages.dim()
    if a.advantages.dim() == 1:
        assert torch.equal(a.advantages.double(), b.advantages.double())
    else:
        assert torch.equal(pad(a.advantages)[ma].double(), pad(b.advantages)[mb].double())
    assert a.metadata == b.metadata


class Upload(io.BytesIO):
    """Streamlit's UploadedFile: a BytesIO with .name and .size."""

    def __init__(self, data: bytes, name: str):
        super().__init__(data)
        self.name, self.size = name, len(data)


def refuse(source, *fragments, **kw):
    with pytest.raises(BatchFormatError) as e:
        load_batch(source, **kw)
    for f in fragments:
        assert f in str(e.value), f"{f!r} not in {str(e.value)!r}"
    return str(e.value)


# ---------------------------------------------------------------------------------------------------------
# round trips


@pytest.mark.parametrize("fmt, layout, split", COMBOS, ids=lambda x: str(x))
@pytest.mark.parametrize("per_token_adv", [False, True], ids=["adv_rollout", "adv_token"])
def test_round_trip(tmp_path, fmt, layout, split, per_token_adv):
    b = example(per_token_adv)
    path = tmp_path / f"batch{fmt}"
    save_batch(b, path, layout=layout, split_by=split)
    loaded = load_batch(path)
    assert_same(b, loaded)
    upload = load_batch(Upload(path.read_bytes(), path.name))  # the same through an upload
    assert_same(b, upload)


@pytest.mark.parametrize("fmt, layout, split", COMBOS, ids=lambda x: str(x))
def test_per_token_extras_round_trip(tmp_path, fmt, layout, split):
    b = example()
    B, T = b.loss_mask.shape
    g = torch.Generator().manual_seed(5)
    entropy, ids = torch.rand(B, T, generator=g), torch.randint(0, 50_000, (B, T), generator=g)
    b = Batch(b.trainer_logprobs, b.inference_logprobs, b.advantages, b.loss_mask, b.metadata,
              extras={"entropy": entropy, "token_ids": ids})
    path = tmp_path / f"batch{fmt}"
    save_batch(b, path, layout=layout, split_by=split)
    loaded = load_batch(path)
    assert_same(b, loaded)
    assert sorted(loaded.extras) == ["entropy", "token_ids"]
    assert loaded.extras["entropy"].dtype == torch.float32 and loaded.extras["token_ids"].dtype == torch.int64
    m, lm = b.loss_mask, loaded.loss_mask
    assert torch.equal(loaded.extras["entropy"][lm], entropy[m])
    assert torch.equal(loaded.extras["token_ids"][lm], ids[m])
    if layout == "rows":  # past a rollout's end: NaN entropy and token id -1, as prime-rl's reader gives
        past = torch.arange(lm.shape[1])[None, :] > lm.int().cumsum(-1).argmax(-1, keepdim=True)
        assert torch.isnan(loaded.extras["entropy"][past]).all() and (loaded.extras["token_ids"][past] == -1).all()


def test_a_per_rollout_entropy_column_is_metadata_not_an_extra(tmp_path):
    b = example()
    b = Batch(b.trainer_logprobs, b.inference_logprobs, b.advantages, b.loss_mask,
              {**b.metadata, "entropy": [0.5] * b.loss_mask.shape[0]})
    save_batch(b, tmp_path / "b.parquet")
    loaded = load_batch(tmp_path / "b.parquet")
    assert "entropy" not in loaded.extras and loaded.metadata["entropy"] == [0.5] * b.loss_mask.shape[0]


@pytest.mark.parametrize("fmt", [".parquet", ".npz", ".safetensors", ".pt"])
def test_float64_survives_binary_formats(tmp_path, fmt):
    b = example(dtype=torch.float64)
    save_batch(b, tmp_path / f"b{fmt}")
    loaded = load_batch(tmp_path / f"b{fmt}")
    assert loaded.trainer_logprobs.dtype == torch.float64
    assert_same(b, loaded)


def test_json_gives_float32_and_the_same_estimates(tmp_path):
    b = example()
    save_batch(b, tmp_path / "b.jsonl")
    loaded = load_batch(tmp_path / "b.jsonl")
    assert loaded.trainer_logprobs.dtype == torch.float32
    assert_same(b, loaded)
    assert run("seq_tis", b).loss.item() == run("seq_tis", loaded).loss.item()


@pytest.mark.parametrize("fmt", [".npz", ".parquet", ".safetensors"])
def test_verl_column_names(tmp_path, fmt):
    b = example(per_token_adv=True)
    save_batch(b, tmp_path / f"v{fmt}", columns=VERL_NAMES)
    names = set(np.load(tmp_path / f"v{fmt}").files) if fmt == ".npz" else (
        set(pq.read_schema(tmp_path / f"v{fmt}").names) if fmt == ".parquet" else None)
    if names is not None:
        assert {"old_log_probs", "rollout_log_probs", "response_mask", "advantages"} <= names
        assert "trainer_logprobs" not in names
    assert_same(b, load_batch(tmp_path / f"v{fmt}"))


def test_file_like_sources(tmp_path):
    b = example()
    save_batch(b, tmp_path / "b.parquet")
    data = (tmp_path / "b.parquet").read_bytes()
    assert_same(b, load_batch(data, format="parquet"))  # bytes, format named
    assert_same(b, load_batch(io.BytesIO(data), format=".parquet"))
    with open(tmp_path / "b.parquet", "rb") as f:  # an open file: its name gives the format
        assert_same(b, load_batch(f))
    up = Upload(data, "upload.parquet")
    up.read()  # Streamlit may have read it already: getvalue() still sees everything
    assert_same(b, load_batch(up))
    assert_same(b, load_batch(str(tmp_path / "b.parquet")))


def test_reward_and_group_id_give_grpo_advantages(tmp_path):
    rows = [{"trainer_logprobs": [-0.1, -0.2], "inference_logprobs": [-0.1, -0.3], "reward": r, "group_id": g,
             "prompt": f"p{g}"} for r, g in [(1.0, "a"), (0.0, "a"), (0.0, "a"), (2.0, "b"), (1.0, "b")]]
    (tmp_path / "r.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    b = load_batch(tmp_path / "r.jsonl")
    # group a: mean 1/3; group b: mean 1.5
    assert torch.allclose(b.advantages, torch.tensor([2 / 3, -1 / 3, -1 / 3, 0.5, -0.5]))
    assert b.metadata["reward"] == [1.0, 0.0, 0.0, 2.0, 1.0]
    assert b.metadata["group_id"] == ["a", "a", "a", "b", "b"] and b.metadata["prompt"][3] == "pb"
    assert b.loss_mask.all()  # no mask column: every token carries loss


def test_extras_become_metadata_and_per_token_extras_are_skipped(tmp_path):
    B, T = 3, 4
    np.savez(tmp_path / "x.npz", old_log_probs=-np.ones((B, T), np.float32), rollout_log_probs=-np.ones((B, T)),
             advantages=np.arange(B, dtype=np.float32), prompt_id=np.array([5, 6, 7]), env=np.array(["a", "b", "c"]),
             step=np.array(12), input_ids=np.zeros((B, T), np.int64), entropy=np.zeros((B, T)))
    b = load_batch(tmp_path / "x.npz")
    assert b.metadata == {"prompt_id": [5, 6, 7], "env": ["a", "b", "c"], "step": [12, 12, 12]}
    assert b.trainer_logprobs.dtype == torch.float32 and b.inference_logprobs.dtype == torch.float64


def test_packed_micro_batch_by_position_ids(tmp_path):
    # prime-rl style: one row of packed tokens [1, N], rollouts of 3, 2 and 4 tokens
    pos = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3]])
    lp = -torch.arange(1, 10, dtype=torch.float32)[None] / 10
    save_file({"trainer_logprobs": lp, "inference_logprobs": lp - 0.01, "position_ids": pos,
               "loss_mask": torch.tensor([[0, 1, 1, 1, 1, 0, 1, 1, 1]], dtype=torch.bool),
               "advantages": torch.tensor([1.0, -1.0, 0.5])}, tmp_path / "p.safetensors")
    b = load_batch(tmp_path / "p.safetensors")
    assert b.shape == (3, 4)
    assert b.loss_mask.tolist() == [[False, True, True, False], [True, True, False, False],
                                    [False, True, True, True]]
    assert b.trainer_logprobs[2, 3].item() == pytest.approx(-0.9)
    assert b.advantages.tolist() == [1.0, -1.0, 0.5]


def test_packed_by_seq_lens_with_per_token_advantages(tmp_path):
    lp = -np.linspace(0.1, 0.6, 6, dtype=np.float32)
    np.savez(tmp_path / "s.npz", trainer_logprobs=lp, inference_logprobs=lp, seq_lens=np.array([2, 0, 4]),
             advantages=np.arange(6, dtype=np.float32))
    b = load_batch(tmp_path / "s.npz")
    assert b.shape == (3, 4) and b.loss_mask.sum(-1).tolist() == [2, 0, 4]
    assert b.advantages.shape == (3, 4) and b.advantages[2].tolist() == [2.0, 3.0, 4.0, 5.0]


def test_columns_mapping(tmp_path):
    rows = [{"lp_fsdp": [-0.5, -0.1], "lp_vllm": [-0.4, -0.1], "adv": 1.0, "m": [1, 0]}]
    (tmp_path / "c.json").write_text(json.dumps(rows))
    cols = {"trainer_logprobs": "lp_fsdp", "inference_logprobs": "lp_vllm", "advantages": "adv", "loss_mask": "m"}
    b = load_batch(tmp_path / "c.json", columns=cols)
    assert b.loss_mask.tolist() == [[True, False]] and b.advantages.tolist() == [1.0]
    b2 = load_batch(tmp_path / "c.json", columns={v: k for k, v in cols.items()})  # name -> role works too
    assert torch.equal(b.trainer_logprobs, b2.trainer_logprobs)
    refuse(tmp_path / "c.json", "'trainer_logp' is not a role; roles: trainer_logprobs", columns={
        "trainer_logp": "x"})
    refuse(tmp_path / "c.json", "column 'nope' (given for trainer_logprobs) is not in the file; columns present: "
           "'lp_fsdp'", columns={"trainer_logprobs": "nope"})


def test_list_assets_and_formats():
    assert FORMATS == (".parquet", ".jsonl", ".json", ".npz", ".safetensors", ".pt")
    assert issubclass(BatchFormatError, ValueError)
    assert sio.ASSETS_DIR == Path(__file__).resolve().parent.parent / "assets"
    assert all(p.suffix in FORMATS for p in list_assets())


# ---------------------------------------------------------------------------------------------------------
# refusals, each with its message


def write_rows(path: Path, rows):
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return path


GOOD = {"trainer_logprobs": [-0.5, -0.25, -0.125], "inference_logprobs": [-0.5, -0.25, -0.125], "advantages": 1.0}


def test_missing_columns_say_what_was_looked_for(tmp_path):
    p = write_rows(tmp_path / "m.jsonl", [{"inference_logprobs": [-1.0], "advantages": 1.0, "foo": 1}])
    refuse(p, "m.jsonl: no trainer logprobs column: looked for 'trainer_logprobs', 'old_log_probs'",
           "columns present: 'inference_logprobs', 'advantages', 'foo'")
    p = write_rows(tmp_path / "i.jsonl", [{"old_log_probs": [-1.0], "advantages": 1.0}])
    refuse(p, "no inference logprobs column: looked for 'inference_logprobs', 'rollout_log_probs'")
    p = write_rows(tmp_path / "a.jsonl", [{"old_log_probs": [-1.0], "rollout_log_probs": [-1.0]}])
    refuse(p, "no advantages: looked for 'advantages' / 'advantage', or 'reward' with 'group_id' / 'uid'")
    p = write_rows(tmp_path / "g.jsonl", [{"old_log_probs": [-1.0], "rollout_log_probs": [-1.0], "reward": 1}])
    refuse(p, "column 'reward' needs a group column", "looked for 'group_id' / 'uid'")


# each framework's names for (trainer log-probs, inference log-probs, loss mask), from its code (issue 43)
FRAMEWORK_NAMES = {
    "nemo-rl": ("prev_logprobs", "generation_logprobs", "token_mask"),
    "trl": ("old_per_token_logps", "sampling_per_token_logps", "completion_mask"),
    "slime": ("log_probs", "rollout_log_probs", "loss_masks"),
    "openrlhf": ("action_log_probs", "rollout_log_probs", "action_mask"),
    "skyrl": ("action_log_probs", "rollout_logprobs", "loss_mask"),
    "areal": ("prox_logp", "logprobs", "loss_mask"),
    "verl": ("old_log_probs", "rollout_log_probs", "response_mask"),
}


@pytest.mark.parametrize("framework", FRAMEWORK_NAMES)
def test_each_frameworks_names_are_read(tmp_path, framework):
    trainer, inference, mask = FRAMEWORK_NAMES[framework]
    rows = [{trainer: [-0.5, -0.25, -9.0], inference: [-0.5, -0.5, -1.0], mask: [1, 1, 0], "advantage": a}
            for a in (1.0, -1.0)]
    b = load_batch(write_rows(tmp_path / "f.jsonl", rows))
    assert b.trainer_logprobs[0].tolist() == [-0.5, -0.25, -9.0] and b.inference_logprobs[1, 1] == -0.5
    assert b.loss_mask.tolist() == [[True, True, False]] * 2 and b.advantages.tolist() == [1.0, -1.0]
    assert not b.metadata  # every column found its role


def test_advantage_with_a_reward_and_no_group_is_read_as_advantages(tmp_path):
    rows = [{"sampler_logprobs": [-0.5], "trainer_logprobs": [-0.5], "advantage": a, "reward": 1.0}
            for a in (0.5, -0.5)]
    b = load_batch(write_rows(tmp_path / "a.jsonl", rows))  # before: "column 'reward' needs a group column"
    assert b.advantages.tolist() == [0.5, -0.5] and b.metadata == {"reward": [1.0, 1.0]}


def test_verls_uid_groups_the_rewards(tmp_path):
    rows = [{"old_log_probs": [-0.1], "rollout_log_probs": [-0.1], "reward": r, "uid": g}
            for r, g in [(1.0, "p0"), (0.0, "p0"), (3.0, "p1"), (1.0, "p1")]]
    b = load_batch(write_rows(tmp_path / "u.jsonl", rows))
    assert b.advantages.tolist() == [0.5, -0.5, 1.0, -1.0]  # reward - its uid's mean (0.5, 2.0)
    assert b.metadata["uid"] == ["p0", "p0", "p1", "p1"]


def test_nemo_rl_sample_mask_drops_its_rollouts_from_the_loss_mask(tmp_path):
    rows = [{"prev_logprobs": [-0.5, -0.25], "generation_logprobs": [-0.5, -0.5], "token_mask": [1, 0],
             "sample_mask": s, "advantages": 1.0} for s in (1, 0, 1)]
    rows[1]["prev_logprobs"] = [math.nan, math.nan]  # a dropped rollout's values are never checked
    b = load_batch(write_rows(tmp_path / "s.jsonl", rows))
    assert b.loss_mask.tolist() == [[True, False], [False, False], [True, False]]  # token_mask * sample_mask
    assert "sample_mask" not in b.metadata
    rows[1]["sample_mask"] = 0.5
    refuse(write_rows(tmp_path / "h.jsonl", rows), "row 1: column 'sample_mask' is 0.5; a mask holds 0/1")
    rows = [{**r, "sample_mask": [1, 0]} for r in rows]
    refuse(write_rows(tmp_path / "l.jsonl", rows), "column 'sample_mask' holds one list per row; expected one number")
    np.savez(tmp_path / "p.npz", trainer_logprobs=-np.ones((3, 2)), inference_logprobs=-np.ones((3, 2)),
             advantages=np.zeros(3), sample_mask=np.array([True, False, True]))
    assert load_batch(tmp_path / "p.npz").loss_mask.tolist() == [[True, True], [False, False], [True, True]]
    np.savez(tmp_path / "w.npz", trainer_logprobs=-np.ones((3, 2)), inference_logprobs=-np.ones((3, 2)),
             advantages=np.zeros(3), sample_mask=np.ones(4))
    refuse(tmp_path / "w.npz", "column 'sample_mask' has shape (4,); expected one 0/1 per rollout (3)")


def test_two_frameworks_names_for_one_role_are_refused_naming_both(tmp_path):
    row = {"old_log_probs": [-0.5], "prev_logprobs": [-0.75], "rollout_log_probs": [-0.5], "advantages": 1.0}
    p = write_rows(tmp_path / "t.jsonl", [row])
    refuse(p, "columns 'old_log_probs' and 'prev_logprobs' are both a trainer logprobs column",
           "pass columns={'trainer_logprobs': <name>}")
    assert load_batch(p, columns={"trainer_logprobs": "prev_logprobs"}).trainer_logprobs.item() == -0.75
    # seqis's own name wins over any framework's (SkyRL writes loss_mask and response_mask, loss_mask the narrower)
    row = {"trainer_logprobs": [-0.5, -0.5], "log_probs": [-0.6, -0.6], "rollout_log_probs": [-0.5, -0.5],
           "loss_mask": [1, 0], "response_mask": [1, 1], "advantages": 1.0, "advantage": 2.0}
    b = load_batch(write_rows(tmp_path / "a.jsonl", [row]))
    assert b.trainer_logprobs.tolist() == [[-0.5, -0.5]] and b.loss_mask.tolist() == [[True, False]]
    assert b.advantages.tolist() == [1.0] and b.metadata == {"advantage": [2.0]}


def test_lengths_that_differ_within_a_row(tmp_path):
    rows = [dict(GOOD), {"old_log_probs": [-0.1] * 312, "rollout_log_probs": [-0.1] * 311, "advantages": 0.0}]
    rows[0] = {"old_log_probs": [-0.1], "rollout_log_probs": [-0.1], "advantages": 0.0}
    rows = rows[:1] * 17 + rows[1:]
    msg = refuse(write_rows(tmp_path / "d.jsonl", rows),
                 "row 17: column 'rollout_log_probs' has 311 values but 'old_log_probs' has 312")
    assert msg.startswith("d.jsonl: ")
    table = pa.table({"trainer_logprobs": [[-0.1, -0.2], [-0.3]], "inference_logprobs": [[-0.1, -0.2], [-0.3]],
                      "loss_mask": [[1, 1], [1, 0]], "advantages": [0.0, 1.0]})
    pq.write_table(table, tmp_path / "d.parquet")
    refuse(tmp_path / "d.parquet", "row 1: column 'loss_mask' has 2 values but 'trainer_logprobs' has 1")


def test_shapes_that_disagree(tmp_path):
    np.savez(tmp_path / "s.npz", trainer_logprobs=-np.ones((4, 10)), inference_logprobs=-np.ones((4, 12)),
             advantages=np.zeros(4))
    refuse(tmp_path / "s.npz", "column 'inference_logprobs' has shape (4, 12) but 'trainer_logprobs' has shape "
           "(4, 10)")
    np.savez(tmp_path / "a.npz", trainer_logprobs=-np.ones((4, 10)), inference_logprobs=-np.ones((4, 10)),
             advantages=np.zeros(5))
    refuse(tmp_path / "a.npz", "column 'advantages' has shape (5,) but 'trainer_logprobs' has shape (4, 10)")
    np.savez(tmp_path / "p.npz", trainer_logprobs=-np.ones(10), inference_logprobs=-np.ones(10),
             advantages=np.zeros(1), seq_lens=np.array([4, 5]))
    refuse(tmp_path / "p.npz", "column 'seq_lens' sums to 9 but 'trainer_logprobs' has 10 tokens")
    np.savez(tmp_path / "q.npz", trainer_logprobs=-np.ones(5), inference_logprobs=-np.ones(5),
             advantages=np.zeros(1), position_ids=np.array([0, 1, 3, 0, 1]))
    refuse(tmp_path / "q.npz", "column 'position_ids' jumps from 1 to 3 at token 2")
    np.savez(tmp_path / "r.npz", trainer_logprobs=-np.ones(5), inference_logprobs=-np.ones(5),
             advantages=np.zeros(1), position_ids=np.array([2, 3, 4, 0, 1]))
    refuse(tmp_path / "r.npz", "column 'position_ids' must start at 0")
    np.savez(tmp_path / "n.npz", trainer_logprobs=-np.ones(5), inference_logprobs=-np.ones(5), advantages=np.zeros(1))
    refuse(tmp_path / "n.npz", "is 1-D (5 values) but there is no 'position_ids' or 'seq_lens'")
    np.savez(tmp_path / "c.npz", trainer_logprobs=-np.ones(4), inference_logprobs=-np.ones(4), advantages=np.zeros(2),
             seq_lens=np.array([5, -1]))
    refuse(tmp_path / "c.npz", "row 1: column 'seq_lens' is negative")


def test_non_numeric_values(tmp_path):
    rows = [dict(GOOD), dict(GOOD, inference_logprobs=[-0.5, "abc", -0.1])]
    refuse(write_rows(tmp_path / "n.jsonl", rows), "row 1: column 'inference_logprobs' holds a non-numeric value 'abc'")
    rows = [dict(GOOD, trainer_logprobs=[[-0.5], [-0.25]])]
    refuse(write_rows(tmp_path / "nest.jsonl", rows), "row 0: column 'trainer_logprobs' holds nested lists")
    rows = [dict(GOOD), dict(GOOD, trainer_logprobs=-0.5)]
    refuse(write_rows(tmp_path / "s.jsonl", rows), "row 1: column 'trainer_logprobs' is -0.5, not a list")
    rows = [dict(GOOD), dict(GOOD, advantages="high")]
    refuse(write_rows(tmp_path / "a.jsonl", rows), "row 1: column 'advantages' holds a non-numeric value 'high'")
    pq.write_table(pa.table({"trainer_logprobs": [["a", "b"]], "inference_logprobs": [[-0.1, -0.1]],
                             "advantages": [1.0]}), tmp_path / "t.parquet")
    refuse(tmp_path / "t.parquet", "column 'trainer_logprobs' holds string values, not numbers")
    rows = [dict(GOOD, loss_mask=[1, 1, 0]), dict(GOOD, loss_mask=[1, 0.5, 1])]
    refuse(write_rows(tmp_path / "m.jsonl", rows), "row 1, token 1: column 'loss_mask' is 0.5; a mask holds 0/1")


@pytest.mark.parametrize("value, shown", [(math.nan, "nan"), (math.inf, "inf"), (-math.inf, "-inf")])
def test_non_finite_log_probs_on_loss_tokens(tmp_path, value, shown):
    B, T = 3, 5
    lp = -np.ones((B, T), np.float32)
    lp[2, 3] = value
    mask = np.ones((B, T), bool)
    np.savez(tmp_path / "f.npz", trainer_logprobs=lp, inference_logprobs=-np.ones((B, T)), loss_mask=mask,
             advantages=np.zeros(B))
    refuse(tmp_path / "f.npz", f"row 2, token 3: column 'trainer_logprobs' is {shown} on a loss token")
    mask[2, 3] = False  # off the loss mask it is padding, and ignored
    np.savez(tmp_path / "f.npz", trainer_logprobs=lp, inference_logprobs=-np.ones((B, T)), loss_mask=mask,
             advantages=np.zeros(B))
    assert load_batch(tmp_path / "f.npz").shape == (B, T)


def test_positive_log_probs(tmp_path):
    rows = [dict(GOOD), dict(GOOD, inference_logprobs=[-0.5, 0.3, -0.1])]
    refuse(write_rows(tmp_path / "p.jsonl", rows), "row 1, token 1: column 'inference_logprobs' is 0.3 on a loss "
           "token; a log-probability is at most 0 (up to 1e-06 for rounding)")
    rows = [dict(GOOD, inference_logprobs=[-0.5, 5e-7, -0.1])]  # rounding: 0 + eps is accepted
    assert load_batch(write_rows(tmp_path / "ok.jsonl", rows)).shape == (1, 3)
    rows = [dict(GOOD, advantages=[1.0, math.nan, 0.0])]
    refuse(write_rows(tmp_path / "a.jsonl", rows), "row 0, token 1: column 'advantages' is nan on a loss token")


def test_no_rollouts_and_empty_files(tmp_path):
    (tmp_path / "e.json").write_text("[]")
    refuse(tmp_path / "e.json", "e.json: no rollouts")
    (tmp_path / "e.jsonl").write_text("\n\n")
    refuse(tmp_path / "e.jsonl", "no rollouts")
    (tmp_path / "z.parquet").write_bytes(b"")
    refuse(tmp_path / "z.parquet", "z.parquet: is empty (0 bytes)")
    refuse(Upload(b"", "u.npz"), "u.npz: is empty")
    pq.write_table(pa.table({"trainer_logprobs": pa.array([], pa.list_(pa.float32())),
                             "inference_logprobs": pa.array([], pa.list_(pa.float32())),
                             "advantages": pa.array([], pa.float32())}), tmp_path / "0.parquet")
    refuse(tmp_path / "0.parquet", "no rollouts")
    refuse(write_rows(tmp_path / "t.jsonl", [dict(GOOD, trainer_logprobs=[], inference_logprobs=[])]),
           "no loss tokens: every rollout in column 'trainer_logprobs' is empty")
    np.savez(tmp_path / "0.npz", trainer_logprobs=np.zeros((0, 4)), inference_logprobs=np.zeros((0, 4)),
             advantages=np.zeros(0))
    refuse(tmp_path / "0.npz", "no rollouts")
    refuse(tmp_path / "missing.parquet", "missing.parquet: cannot be opened")


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_batch_without_loss_tokens_is_refused(tmp_path, fmt):
    b = example()
    save_batch(Batch(b.trainer_logprobs, b.inference_logprobs, b.advantages, torch.zeros(b.shape, dtype=torch.bool)),
               tmp_path / f"prompts{fmt}")
    msg = refuse(tmp_path / f"prompts{fmt}", f"prompts{fmt}: no loss tokens: ")
    # a rows file keeps a rollout's tokens up to its last loss token: here every list is empty
    assert msg.endswith("the loss mask is 0 on every token of its 12 rollouts (prompts or padding only); nothing to "
                        "estimate or diagnose") or msg.endswith("every rollout in column 'trainer_logprobs' is empty")


def test_check_batch_refuses_what_load_batch_refuses():
    from seqis.io import check_batch

    b = example()
    check_batch(b)  # a valid batch passes
    tl = b.trainer_logprobs.clone()
    tl[3, 2] = 0.25
    with pytest.raises(BatchFormatError, match="row 3, token 2: column 'logp' is 0.25 on a loss token; a log-prob"):
        check_batch(Batch(tl, b.inference_logprobs, b.advantages, b.loss_mask), names={"trainer_logprobs": "logp"})
    adv = b.advantages.clone()
    adv[4] = math.inf
    with pytest.raises(BatchFormatError, match="row 4: column 'advantages' is inf"):
        check_batch(Batch(b.trainer_logprobs, b.inference_logprobs, adv, b.loss_mask))
    adv[4], adv[5] = 0.0, math.nan  # rollout 5 is empty: its advantage does not count
    check_batch(Batch(b.trainer_logprobs, b.inference_logprobs, adv, b.loss_mask))
    with pytest.raises(BatchFormatError, match="no loss tokens"):
        check_batch(Batch(b.trainer_logprobs, b.inference_logprobs, b.advantages, torch.zeros_like(b.loss_mask)))
    with pytest.raises(BatchFormatError, match="no rollouts"):
        check_batch(Batch(torch.zeros(0, 3), torch.zeros(0, 3), torch.zeros(0)))


@pytest.mark.parametrize("fmt", FORMATS)
def test_truncated_and_unreadable_files(tmp_path, fmt):
    b = example()
    save_batch(b, tmp_path / f"b{fmt}")
    data = (tmp_path / f"b{fmt}").read_bytes()
    for cut in (len(data) // 2, len(data) - 7):
        refuse(Upload(data[:cut], f"cut{fmt}"), f"cut{fmt}: ")
    refuse(Upload(b"\x00\x01garbage" * 50, f"junk{fmt}"), f"junk{fmt}: ")


@pytest.mark.parametrize("fmt", [".parquet", ".npz", ".safetensors", ".pt", ".jsonl", ".json"])
def test_a_truncated_file_is_called_truncated(tmp_path, fmt):
    save_batch(example(), tmp_path / f"b{fmt}")
    data = (tmp_path / f"b{fmt}").read_bytes()
    for cut in (len(data) // 2, len(data) - 7):
        msg = refuse(Upload(data[:cut], f"b{fmt}"), f"b{fmt}: is truncated")
        assert "pickle" not in msg and "column" not in msg.lower()


def test_a_malformed_line_is_not_called_truncated(tmp_path):
    save_batch(example(), tmp_path / "b.jsonl")
    text = (tmp_path / "b.jsonl").read_text()
    refuse(Upload(text.replace(":", ";", 1).encode(), "b.jsonl"), "b.jsonl: line 1: not valid JSON")


@pytest.mark.parametrize("fmt", [".parquet", ".npz", ".safetensors", ".jsonl", ".json"])
def test_a_pickle_under_any_name_is_called_a_pickle(tmp_path, fmt):
    import pickle

    msg = refuse(Upload(pickle.dumps({"trainer_logprobs": [[-0.1]]}), f"p{fmt}"), f"p{fmt}: is a Python pickle")
    assert "refused" in msg and "can run code" in msg


def test_a_nan_in_a_list_column_names_its_row_and_token(tmp_path):
    import pandas as pd

    save_batch(example(), tmp_path / "b.parquet")
    df = pd.read_parquet(tmp_path / "b.parquet")
    values = [list(v) for v in df["trainer_logprobs"]]
    values[2][5] = float("nan")
    df["trainer_logprobs"] = values
    df.to_parquet(tmp_path / "n.parquet")
    refuse(tmp_path / "n.parquet", "row 2, token 5: column 'trainer_logprobs' is null or NaN")


def test_size_limit(tmp_path):
    save_batch(example(), tmp_path / "b.npz")
    size = (tmp_path / "b.npz").stat().st_size
    refuse(tmp_path / "b.npz", "over the 1000 bytes limit (load_batch(..., max_bytes=...) raises it)", max_bytes=1000)
    refuse(tmp_path / "b.npz", "over the 1.5 KB limit", max_bytes=1536)
    refuse(Upload((tmp_path / "b.npz").read_bytes(), "u.npz"), "u.npz: is ", "KB limit", max_bytes=size - 1)
    assert load_batch(tmp_path / "b.npz", max_bytes=size).shape[0] == 12
    assert load_batch(tmp_path / "b.npz", max_bytes=None).shape[0] == 12
    assert sio.MAX_BYTES == 200 * 2**20


EXECUTED = []


def _side_effect():
    EXECUTED.append(True)
    return {"trainer_logprobs": torch.zeros(1, 1)}


class Evil:
    def __reduce__(self):
        return (_side_effect, ())


def test_pickles_are_refused_and_never_executed(tmp_path):
    torch.save({"trainer_logprobs": torch.zeros(1, 1), "x": Evil()}, tmp_path / "evil.pt")
    refuse(tmp_path / "evil.pt", "evil.pt: refused", "weights_only=True", "nothing in it was executed")
    (tmp_path / "raw.pt").write_bytes(pickle.dumps(Evil()))  # a bare pickle, not even a torch file
    refuse(tmp_path / "raw.pt", "raw.pt: ")
    assert EXECUTED == []
    np.savez(tmp_path / "obj.npz", trainer_logprobs=np.array([[-1.0]]), inference_logprobs=np.array([[-1.0]]),
             advantages=np.array([object()], dtype=object))
    refuse(tmp_path / "obj.npz", "column 'advantages' is an object array, i.e. a pickle: refused")
    torch.save(torch.zeros(2, 2), tmp_path / "t.pt")
    refuse(tmp_path / "t.pt", "holds a single tensor; expected a dict of columns")


def test_unknown_format_and_sources():
    refuse(Upload(b"a,b\n", "x.csv"), "x.csv: unknown format '.csv' (from the name 'x.csv'); accepted: .parquet, "
           ".jsonl, .json, .npz, .safetensors, .pt")
    refuse(b"[]", "<bytes>: cannot tell the format: the name '<bytes>' has no suffix; pass format= one of")
    assert load_batch(json.dumps([GOOD]).encode(), format="json").shape == (1, 3)
    refuse(12345, "cannot read a int")


def test_zip_bomb_is_refused(tmp_path):
    with zipfile.ZipFile(tmp_path / "bomb.npz", "w", zipfile.ZIP_DEFLATED) as z:
        with z.open("trainer_logprobs.npy", "w") as f:
            np.lib.format.write_array(f, np.zeros((2048, 4096)))  # 64 MB of zeros, a few hundred kB zipped
    refuse(tmp_path / "bomb.npz", "unpacks to 64 MB, over 8x the 1 MB limit", max_bytes=2**20)


# ---------------------------------------------------------------------------------------------------------
# fuzzing: nothing but BatchFormatError comes out (the loader without its last-resort guard)


def load_raw(data: bytes, name: str):
    """The unguarded loader; a Batch that comes out must be a valid one."""
    try:
        b = sio_load._load(Upload(data, name), None, None, sio.MAX_BYTES)
    except BatchFormatError:
        return None
    m = b.loss_mask
    for x in (b.trainer_logprobs, b.inference_logprobs):
        assert torch.isfinite(x[m]).all() and (x[m] <= sio.LOGPROB_TOLERANCE).all()
    return b


FUZZ = settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("fmt", FORMATS)
@FUZZ
@given(data=st.binary(max_size=600))
def test_fuzz_random_bytes(fmt, data):
    load_raw(data, f"f{fmt}")


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=5), inner, max_size=5),
    max_leaves=25)


@FUZZ
@given(doc=_JSON)
def test_fuzz_random_json(doc):
    text = json.dumps(doc)
    load_raw(text.encode(), "f.json")
    lines = doc if isinstance(doc, list) else [doc]
    load_raw("\n".join(json.dumps(x) for x in lines).encode(), "f.jsonl")


NAMES = ["trainer_logprobs", "old_log_probs", "inference_logprobs", "rollout_log_probs", "loss_mask", "response_mask",
         "advantages", "reward", "group_id", "position_ids", "seq_lens", "extra"]
_NUM = st.floats(-10, 1) | st.sampled_from([0.0, -0.0, math.nan, math.inf, -math.inf, 0.5]) | st.integers(-3, 3)
_COLUMN = st.one_of(
    st.lists(st.lists(_NUM, max_size=4), min_size=0, max_size=4),  # ragged rows
    st.lists(_NUM, max_size=6),  # 1-D
    _NUM,
    st.text(max_size=3),
    st.lists(st.text(max_size=2) | st.none(), max_size=4),
    st.lists(st.lists(st.lists(_NUM, max_size=2), max_size=2), max_size=2),  # nested
)


@FUZZ
@given(cols=st.dictionaries(st.sampled_from(NAMES), _COLUMN, min_size=1, max_size=8))
def test_fuzz_random_column_sets(cols):
    load_raw(json.dumps(cols).encode(), "c.json")
    buf = io.BytesIO()
    torch.save(cols, buf)
    load_raw(buf.getvalue(), "c.pt")
    arrays = {}
    for k, v in cols.items():
        try:
            a = np.array(v)
        except ValueError:
            continue
        if a.dtype.kind in "biufU":
            arrays[k] = a
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    load_raw(buf.getvalue(), "c.npz")
    tensors = {k: torch.from_numpy(a.copy()) for k, a in arrays.items() if a.dtype.kind in "biuf"}
    if tensors:
        from safetensors.torch import save

        load_raw(save(tensors), "c.safetensors")
    try:
        table = pa.table({k: pa.array(v if isinstance(v, list) else [v]) for k, v in cols.items()})
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, ValueError, OverflowError):
        return
    buf = io.BytesIO()
    pq.write_table(table, buf)
    load_raw(buf.getvalue(), "c.parquet")


@pytest.fixture(scope="module")
def valid_files(tmp_path_factory) -> dict[str, bytes]:
    """One small valid file per format, to damage."""
    d = tmp_path_factory.mktemp("valid")
    out = {}
    for fmt in FORMATS:
        save_batch(make_batch("gaussian", seed=0, n_rollouts=4, max_len=16), d / f"v{fmt}")
        out[fmt] = (d / f"v{fmt}").read_bytes()
    return out


@pytest.mark.parametrize("fmt", FORMATS)
@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzz_damaged_valid_files(valid_files, fmt, data):
    raw = bytearray(valid_files[fmt])
    for _ in range(data.draw(st.integers(1, 4))):  # overwrite a few bytes, then maybe cut the file short
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(1, len(raw)))
    load_raw(bytes(raw[:cut]), f"d{fmt}")


def test_last_resort_guard_turns_any_error_into_batch_format_error(monkeypatch):
    def boom(*a, **k):
        raise KeyError("unexpected")

    monkeypatch.setattr(sio_load, "_load", boom)
    refuse(Upload(b"x", "x.json"), "x.json: could not be loaded (KeyError")


# ---------------------------------------------------------------------------------------------------------
# the shipped assets


def test_assets_load_and_are_documented():
    assets = list_assets()
    assert len(assets) >= 5
    readme = (sio.ASSETS_DIR / "README.md").read_text()
    names = set()
    for path in assets:
        assert path.stat().st_size < 5 * 2**20, path
        assert path.name in readme, f"{path.name} is not described in assets/README.md"
        b = load_batch(path)
        assert b.loss_mask.any()
        names |= set(b.metadata)
        assert "group_id" in b.metadata
    suffixes = {p.suffix for p in assets}
    assert {".parquet", ".npz", ".safetensors"} <= suffixes
    verl = [p for p in assets if p.suffix == ".npz" and "old_log_probs" in np.load(p).files]
    assert verl, "one asset uses verl's column names"
    long = [load_batch(p) for p in assets if "long" in p.name]
    assert long and long[0].loss_mask.sum(-1).max() >= 16000


def test_column_names_lists_a_files_names_without_building_a_batch(tmp_path):
    from seqis.io import column_names

    path = tmp_path / "b.npz"
    save_batch(make_batch("gaussian", n_rollouts=4, max_len=32, seed=0), path, columns=VERL_NAMES)
    names = column_names(path)
    assert {"old_log_probs", "rollout_log_probs", "response_mask", "advantages"} <= set(names)
    with pytest.raises(BatchFormatError):
        column_names(tmp_path / "missing.parquet")
