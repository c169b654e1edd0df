"""Rollout batches from files: real dumps from RL frameworks in, any Batch out, and clear refusals.

Formats (by suffix, or `format=`): parquet, jsonl, json, npz, safetensors and torch .pt. A .pt file
is read only with `torch.load(weights_only=True)`: tensors and plain containers; any other pickle is
refused and nothing in it runs. Nothing from a file is executed or written to disk.

Layouts, told apart by the shape of the trainer log-prob column:
  rows     one record per rollout with list columns (parquet, jsonl, a json list of objects, a json
           object of lists of lists, a .pt list of dicts or dict of lists): ragged, or padded when
           every list has the same length
  padded   [B, T] arrays (npz, safetensors, .pt); positions past a rollout's end carry loss_mask 0
  packed   1-D (or [1, N]) micro-batches of N tokens, split into rollouts by `position_ids`
           (restarting at 0 for each rollout, counting up by 1) or by `seq_lens` (B lengths summing to N)

Column names, each framework's from its code (seqis's own name wins; else the one framework name present; two
frameworks' names for one role are refused, naming both; `columns=` maps a role to any other name, e.g.
columns={"trainer_logprobs": "logp_fsdp"}):
  trainer_logprobs    trainer_logprobs | old_log_probs (verl) | prev_logprobs (NeMo-RL) | old_per_token_logps (TRL)
                      | log_probs (slime) | action_log_probs (OpenRLHF, SkyRL) | prox_logp (AReaL)
  inference_logprobs  inference_logprobs | rollout_log_probs (verl, slime, OpenRLHF) | generation_logprobs (NeMo-RL)
                      | sampling_per_token_logps (TRL) | sampler_logprobs | rollout_logprobs (SkyRL) | logprobs (AReaL)
  loss_mask           loss_mask | response_mask (verl) | token_mask (NeMo-RL) | completion_mask (TRL) | loss_masks
                      (slime) | action_mask (OpenRLHF); default: every token of every rollout
  sample_mask         sample_mask (NeMo-RL): 0/1 per rollout, multiplied into the loss mask (a 0 drops the rollout)
  advantages          advantages | advantage, one per rollout or one per token; or else
  reward + group_id   advantage = reward - mean reward of the rollout's group (GRPO); the group: group_id | uid (verl)
Every other per-rollout column (prompt id, text, env name, step, a scalar broadcast to every rollout) is
kept in Batch.metadata. Per-token `entropy` and `token_ids` columns are kept in Batch.extras (NaN and -1 past
a rollout's end; save_batch writes them); other per-token columns are skipped.

prime-rl's token export (`token_exports/step_N/rank_R.jsonl`, recognised by its first key
`schema_version`) is read by seqis.io.prime_rl: the rl loss channel's mask, the entropy and token ids
kept in Batch.extras; `load_batch` of a step folder reads every rank file of the step as one batch.

Refusals raise BatchFormatError (a ValueError) naming the file, the column and the row (rows and tokens
count from 0): missing columns (with the names looked for), lengths that differ within a row, shapes
that disagree, non-numeric values, NaN, inf or positive log-probs on loss tokens (above 1e-6: rounding
gives 0 + eps), no rollouts, no loss tokens, empty, unreadable or truncated files, files over `max_bytes`
(200 MB; the command lines' `--max-bytes SIZE`, read by `parse_size`). `check_batch(batch)` refuses a Batch
built in memory as load_batch would refuse its file.

Memory: columns are read one at a time, and each is padded into the Batch before the next is read
(parquet list columns in slices of about 2^17 values, into one preallocated buffer). Loading a
512 x 16384 dump (float32 log-probs, a bool mask, per-rollout advantages: 72 MB as a Batch) peaks at
1.9x the batch's size over the process's baseline from parquet, npz or safetensors (peak RSS in a fresh
process: scripts/measure_load_memory.py).

    from seqis.io import load_batch, save_batch
    batch = load_batch("dump.parquet")                          # or an uploaded file with a .name
    batch = load_batch(upload, columns={"advantages": "adv"})   # other names
    save_batch(batch, "copy.npz", columns=VERL_NAMES)           # verl's column names
"""

from .assemble import check_batch
from .columns import (
    ALIASES,
    ASSETS_DIR,
    FORMATS,
    LIMIT_HINT,
    LOGPROB_TOLERANCE,
    MAX_BYTES,
    VERL_NAMES,
    BatchFormatError,
    list_assets,
    parse_size,
)
from .load import load_batch
from .peek import column_names
from .write import save_batch

__all__ = ["ALIASES", "ASSETS_DIR", "FORMATS", "LIMIT_HINT", "LOGPROB_TOLERANCE", "MAX_BYTES", "VERL_NAMES",
           "BatchFormatError", "check_batch", "column_names", "list_assets", "load_batch", "parse_size", "save_batch"]
