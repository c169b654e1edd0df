"""The capture helper: verl's batch fields in, a file load_batch and load_run read out, written whole."""

import numpy as np
import pytest
import torch

from seqis import diagnostics
from seqis.io import load_batch
from seqis.io.capture import capture
from seqis.runs import load_run
from seqis.samplers.scenarios import make_batch


def verl_fields(seed=0):
    """A batch as verl holds it: bf16 (B, T) log-probs on the trainer's side, a 0/1 response mask, token-level
    advantages, a data_source per rollout."""
    b = make_batch("gaussian", seed=seed, n_rollouts=6, max_len=24)
    return b, {
        "old_log_probs": b.trainer_logprobs.clone().requires_grad_(True),
        "rollout_log_probs": b.inference_logprobs.numpy(),
        "response_mask": b.loss_mask.to(torch.int64),
        "advantages": b.advantages[:, None].expand(b.shape) * b.loss_mask,
        "data_source": np.array(["gsm8k", "math"] * 3),
    }


@pytest.mark.parametrize("suffix", [".parquet", ".npz", ".safetensors", ".jsonl"])
def test_verl_fields_round_trip(tmp_path, suffix):
    b, data = verl_fields()
    path = capture(tmp_path / f"step_3{suffix}", trainer_logprobs=data["old_log_probs"],
                   inference_logprobs=data["rollout_log_probs"], loss_mask=data["response_mask"],
                   advantages=data["advantages"], env_name=data["data_source"], step=3)
    got = load_batch(path)
    assert torch.equal(got.loss_mask, b.loss_mask)
    assert torch.equal(got.trainer_logprobs[b.loss_mask], b.trainer_logprobs[b.loss_mask])
    assert got.metadata["env_name"] == ["gsm8k", "math"] * 3 and got.metadata["step"] == [3] * 6
    assert diagnostics(got) == diagnostics(b)
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left behind


def test_a_folder_of_captures_is_a_run(tmp_path):
    for step in (0, 1, 2):
        for rank in (0, 1):
            b, data = verl_fields(seed=step * 2 + rank)
            capture(tmp_path / f"step_{step}_rank_{rank}.parquet", trainer_logprobs=data["old_log_probs"],
                    inference_logprobs=data["rollout_log_probs"], loss_mask=data["response_mask"],
                    advantages=data["advantages"])
    r = load_run(tmp_path)
    assert r.steps == [0, 1, 2] and r.batch(1).shape[0] == 12


def test_bad_inputs_say_what_is_wrong(tmp_path):
    b, data = verl_fields()
    with pytest.raises(ValueError, match="inference_logprobs must have the shape"):
        capture(tmp_path / "x.parquet", trainer_logprobs=data["old_log_probs"],
                inference_logprobs=data["rollout_log_probs"][:, :5], advantages=data["advantages"])
    with pytest.raises(ValueError, match="metadata 'env_name' has 2 values, the batch 6 rollouts"):
        capture(tmp_path / "x.parquet", trainer_logprobs=data["old_log_probs"],
                inference_logprobs=data["rollout_log_probs"], advantages=data["advantages"], env_name=["a", "b"])
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("spoil, message", [
    (lambda d: d["old_log_probs"].detach().index_put_((torch.tensor([2]), torch.tensor([1])), torch.tensor(0.5)),
     "row 2, token 1: column 'trainer_logprobs' is 0.5 on a loss token; a log-probability is at most 0"),
    (lambda d: torch.as_tensor(d["rollout_log_probs"]).index_put((torch.tensor([3, 0]), torch.tensor([0, 1])),
                                                                 torch.tensor(float("nan"))),
     "row 0, token 1: inference_logprobs is nan on a loss token (2 loss tokens with a non-finite log-prob)"),
])
def test_a_batch_load_batch_would_refuse_is_refused_before_any_file_is_written(tmp_path, spoil, message):
    b, data = verl_fields()
    fields = dict(trainer_logprobs=data["old_log_probs"], inference_logprobs=data["rollout_log_probs"],
                  loss_mask=b.loss_mask, advantages=data["advantages"])
    key = "trainer_logprobs" if "trainer" in message else "inference_logprobs"
    fields[key] = spoil(data)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")) as e:
        capture(tmp_path / "run" / "step_1.parquet", **fields)
    assert str(e.value).startswith("capture: ") and "step_1.parquet" in str(e.value)
    assert not (tmp_path / "run").exists() or not list((tmp_path / "run").iterdir())


def test_a_batch_without_loss_tokens_is_refused(tmp_path):
    b, data = verl_fields()
    with pytest.raises(ValueError, match="no loss tokens: the loss mask is 0 on every token of its 6 rollouts"):
        capture(tmp_path / "step_0.npz", trainer_logprobs=data["old_log_probs"],
                inference_logprobs=data["rollout_log_probs"], loss_mask=torch.zeros(b.shape),
                advantages=data["advantages"])
    assert not list(tmp_path.iterdir())
