"""Capture a trainer's batch to a file seqis loads: a few lines in any training loop, no framework needed.

For trainers without an export of their own (verl, TRL, your own loop). Call it where the trainer holds
both log-probs, once per step (and rank); a folder of such files, the step in each name, is a run that
`seqis.runs.load_run` and `python -m seqis scan` read.

    from seqis.io.capture import capture

    # verl: in the actor's update, `data` a DataProto (rollout correction on, so rollout_log_probs exist)
    capture(f"seqis_dumps/step_{step}_rank_{rank}.parquet",
            trainer_logprobs=data.batch["old_log_probs"],        # (B, T) the trainer's log-probs
            inference_logprobs=data.batch["rollout_log_probs"],  # (B, T) the sampler's
            loss_mask=data.batch["response_mask"],               # (B, T) 0/1
            advantages=data.batch["advantages"],                 # (B, T) or (B,)
            env_name=data.non_tensor_batch["data_source"])       # optional per-rollout metadata

With score centering, pass the sampler's head as well: `topk_ids` (B, T, K) and both policies' log-probs of those
tokens, `topk_inference_logprobs` and `topk_trainer_logprobs` (verl: `rollout_topk_ids`, `rollout_topk_log_probs`
and the trainer's log-softmax gathered at those ids); `topk_support` for a replayed sampling support.

Inputs are torch tensors (any device or dtype; detached and copied to the CPU as float32), numpy arrays
or lists. Metadata keywords take one value per rollout, or one value for all of them. The batch is checked
as `load_batch` checks a file (`seqis.io.check_batch`: finite log-probs at most 0 on loss tokens, some loss
tokens, finite advantages) before anything is written: a refused batch raises ValueError and writes no file.
The file is written whole or not at all (a temporary file renamed into place), so a scan running beside the
trainer never reads half of it. Formats as `save_batch` (by suffix): parquet (the default choice), npz,
safetensors, jsonl.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from ..core.types import Batch
from . import BatchFormatError, check_batch, save_batch


def _tensor(x, name: str, dtype: torch.dtype) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        t = x.detach()
    else:
        try:
            t = torch.as_tensor(np.asarray(x))
        except (TypeError, ValueError) as e:
            raise ValueError(f"capture: {name} must be a tensor, an array or a list of numbers ({e})") from None
    return t.to(device="cpu", dtype=dtype)


def _per_rollout(name: str, value, B: int) -> list:
    if isinstance(value, (torch.Tensor, np.ndarray)):
        value = value.tolist()
    if isinstance(value, (str, bytes, int, float, bool)) or value is None:
        return [value] * B
    values = list(value)
    if len(values) != B:
        raise ValueError(f"capture: metadata {name!r} has {len(values)} values, the batch {B} rollouts")
    return values


def capture(path, *, trainer_logprobs, inference_logprobs, advantages, loss_mask=None, topk_ids=None,
            topk_inference_logprobs=None, topk_trainer_logprobs=None, topk_support=None, **metadata) -> Path:
    """Write one batch to `path` (its suffix picks the format) and return the path. See the module docstring."""
    trainer = _tensor(trainer_logprobs, "trainer_logprobs", torch.float32)  # (B, T)
    inference = _tensor(inference_logprobs, "inference_logprobs", torch.float32)  # (B, T)
    adv = _tensor(advantages, "advantages", torch.float32)  # (B,) or (B, T)
    mask = None if loss_mask is None else _tensor(loss_mask, "loss_mask", torch.float32) != 0  # (B, T)
    B = trainer.shape[0] if trainer.dim() > 0 else 0
    meta = {k: _per_rollout(k, v, B) for k, v in metadata.items()}
    head = {name: None if x is None else _tensor(x, name, dtype) for name, x, dtype in (
        ("topk_ids", topk_ids, torch.int64), ("topk_inference_logprobs", topk_inference_logprobs, torch.float32),
        ("topk_trainer_logprobs", topk_trainer_logprobs, torch.float32), ("topk_support", topk_support, torch.bool))}
    try:
        batch = Batch(trainer, inference, adv, mask, meta, **head)  # ValueError naming the shapes when they disagree
        check_batch(batch)  # what load_batch would refuse in the file, refused before it is written
    except ValueError as e:
        message = str(e).removeprefix("Batch: ")
        raise BatchFormatError(f"capture: {path}: {message}") from None
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp{path.suffix}")  # hidden: load_run skips it
    try:
        save_batch(batch, tmp, format=path.suffix)
        os.replace(tmp, path)  # atomic on one filesystem: readers see the old file or the whole new one
    finally:
        tmp.unlink(missing_ok=True)
    return path
