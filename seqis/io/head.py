"""The sampler's head in a file: the top-k token ids at each position and both policies' log-probs of them, as
`Batch.topk_ids` / `topk_inference_logprobs` / `topk_trainer_logprobs` / `topk_support` (B, T, K).

Read from the forms people have:
    padded arrays   (B, T, K) in npz, safetensors or a .pt dict, under seqis's names or verl's
                    (`rollout_topk_ids`, `rollout_topk_log_probs`: the sampler's head verl's score centering reads)
    rows            per rollout, one list per position of K values (jsonl, json, parquet list<list<...>>)
    vLLM's          per rollout, one {token_id: logprob} per position (`topk_logprobs`, or `top_logprobs`), a
                    value a number or {"logprob": x, ...} as vLLM's Logprob serialises; or [[id, logprob], ...]:
                    the sampler's ids and log-probs in one column, in the order the file gives them
A position may list fewer than K entries: its empty slots hold id -1. A bad entry is refused naming the column, the
row, the token and the slot; nothing from the file is executed.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .columns import BatchFormatError, _Dense, _Objects, _short

# role -> the names looked for, in order (seqis's first)
HEAD_COLUMNS = {
    "topk_ids": ("topk_ids", "rollout_topk_ids"),
    "topk_inference_logprobs": ("topk_inference_logprobs", "rollout_topk_log_probs"),
    "topk_trainer_logprobs": ("topk_trainer_logprobs",),
    "topk_support": ("topk_support",),
    "topk_logprobs": ("topk_logprobs", "top_logprobs"),  # vLLM's {token_id: logprob} per position
}
RAW = frozenset(name for names in HEAD_COLUMNS.values() for name in names)  # read as they are, not as numbers
_FILL = {"topk_ids": -1, "topk_inference_logprobs": 0.0, "topk_trainer_logprobs": 0.0, "topk_support": False}
_DTYPE = {"topk_ids": np.int64, "topk_inference_logprobs": np.float32, "topk_trainer_logprobs": np.float32,
          "topk_support": np.bool_}


def present(names) -> dict[str, str]:
    """role -> the file's column for it, for each head role the file has (two names for one role refused)."""
    out = {}
    for role, aliases in HEAD_COLUMNS.items():
        found = [a for a in aliases if a in names]
        if len(found) > 1:
            raise BatchFormatError(f"columns {found[0]!r} and {found[1]!r} are both the head's {role}; keep one")
        if found:
            out[role] = found[0]
    if "topk_logprobs" in out and ("topk_ids" in out or "topk_inference_logprobs" in out):
        raise BatchFormatError(f"column {out['topk_logprobs']!r} (vLLM's {{token_id: logprob}}) and "
                               f"{out.get('topk_ids', out.get('topk_inference_logprobs'))!r} both give the sampler's "
                               "head; keep one")
    return out


def read(load, names, lengths: torch.Tensor, T: int, kind: str) -> dict[str, torch.Tensor]:
    """The head's tensors (B, T, K) for Batch, {} when the file has none. load(name) -> a column as read;
    lengths (B,) each rollout's positions; kind: the file's layout ("rows", "padded" or "packed")."""
    cols = present(names)
    if not cols:
        return {}
    if kind == "packed":
        raise BatchFormatError(f"column {next(iter(cols.values()))!r}: a packed file (1-D tokens) cannot carry the "
                               "sampler's head; write it by rows or padded")
    padded = kind == "padded"
    if "topk_logprobs" in cols:
        ids, logq = _from_dicts(load(cols["topk_logprobs"]), cols["topk_logprobs"], lengths, T, padded)
        out = {"topk_ids": ids, "topk_inference_logprobs": logq}
    else:
        out = {}
    for role in ("topk_ids", "topk_inference_logprobs", "topk_trainer_logprobs", "topk_support"):
        if role in cols:
            out[role] = _array(load(cols[role]), cols[role], role, lengths, T, padded)
    K = {name: x.shape[-1] for name, x in out.items()}
    if len(set(K.values())) > 1:  # rows of different widths: pad each to the widest
        width = max(K.values())
        out = {role: _widen(x, width, _FILL[role]) for role, x in out.items()}
    return out


def _widen(x: torch.Tensor, width: int, fill) -> torch.Tensor:
    pad = torch.full((*x.shape[:2], width - x.shape[-1]), fill, dtype=x.dtype)
    return torch.cat([x, pad], -1)


def _array(col, name: str, role: str, lengths: torch.Tensor, T: int, padded: bool) -> torch.Tensor:
    """One head column as (B, T, K) of its role's dtype."""
    B = lengths.numel()
    if isinstance(col, _Dense):
        t = col.tensor
        if t.dim() != 3 or t.shape[0] != B or t.shape[1] < T:
            raise BatchFormatError(f"column '{name}' has shape {tuple(t.shape)}; the head is ({B}, {T}, K): one "
                                   f"list of K per position")
        t = t[:, :T]
        if role == "topk_ids":
            return t.to(torch.int64).clone()
        if role == "topk_support":
            return (t != 0).clone()
        return t.to(torch.float64 if t.dtype == torch.float64 else torch.float32).clone()
    if not isinstance(col, _Objects):
        raise BatchFormatError(f"column '{name}' is not the head's lists: expected ({B}, {T}, K) values, or one list "
                               f"of K per position per rollout")
    rows = _rows(col, name, lengths, T, padded)
    K = max((len(pos) if isinstance(pos, (list, tuple)) else 0 for row in rows for pos in row), default=0)
    out = np.full((B, T, K), _FILL[role], dtype=_DTYPE[role])
    for r, row in enumerate(rows):
        for t, pos in enumerate(row):
            if not isinstance(pos, (list, tuple)):
                raise BatchFormatError(f"row {r}, token {t}: column '{name}' is {_short(pos)}, not a list of the "
                                       "head's values")
            for k, v in enumerate(pos):
                out[r, t, k] = _value(v, name, role, r, t, k)
    return torch.from_numpy(out)


def _rows(col: _Objects, name: str, lengths: torch.Tensor, T: int, padded: bool) -> list:
    """The column's rows, each a list of positions, checked against the rollouts' lengths."""
    rows = col.values
    if len(rows) != lengths.numel():
        raise BatchFormatError(f"column '{name}' has {len(rows)} rows; the batch has {lengths.numel()}")
    for r, row in enumerate(rows):
        want = T if padded else int(lengths[r])
        if not isinstance(row, (list, tuple)) or len(row) < want:
            got = f"{len(row)} positions" if isinstance(row, (list, tuple)) else _short(row)
            raise BatchFormatError(f"row {r}: column '{name}' has {got}; the rollout has {want}")
    return rows


def _value(v, name: str, role: str, r: int, t: int, k: int):
    ok = (isinstance(v, (bool, np.bool_)) if role == "topk_support" else
          isinstance(v, (int, np.integer)) and not isinstance(v, bool) if role == "topk_ids" else
          isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool) or v is None)
    if not ok:
        raise BatchFormatError(f"row {r}, token {t}, slot {k}: column '{name}' is {_short(v)}, not "
                               + {"topk_ids": "a token id", "topk_support": "true or false"}.get(role, "a log-prob"))
    return math.nan if v is None else v


def _from_dicts(col, name: str, lengths: torch.Tensor, T: int, padded: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's per-position {token_id: logprob} (or [[id, logprob], ...]) as (B, T, K) ids and log-probs."""
    if not isinstance(col, _Objects):
        raise BatchFormatError(f"column '{name}' is not vLLM's top log-probs: one {{token_id: logprob}} per position")
    rows = _rows(col, name, lengths, T, padded)
    K = max((len(pos) for row in rows for pos in row if isinstance(pos, (dict, list, tuple))), default=0)
    B = lengths.numel()
    ids = np.full((B, T, K), -1, dtype=np.int64)
    logq = np.zeros((B, T, K), dtype=np.float32)
    for r, row in enumerate(rows):
        for t, pos in enumerate(row[:T]):
            items = pos.items() if isinstance(pos, dict) else pos
            if not isinstance(pos, (dict, list, tuple)):
                raise BatchFormatError(f"row {r}, token {t}: column '{name}' is {_short(pos)}, not "
                                       "{token_id: logprob}")
            for k, item in enumerate(items):
                token, lp = _pair(item, name, r, t, k)
                ids[r, t, k], logq[r, t, k] = token, lp
    return torch.from_numpy(ids), torch.from_numpy(logq)


def _pair(item, name: str, r: int, t: int, k: int) -> tuple[int, float]:
    """(token id, log-prob) of one entry: a dict item (id, lp or {"logprob": lp}), or [id, lp]."""
    try:
        token, lp = item
        if isinstance(lp, dict):
            lp = lp["logprob"]
        token = int(token)
        lp = math.nan if lp is None else float(lp)
    except (TypeError, ValueError, KeyError):
        raise BatchFormatError(f"row {r}, token {t}, slot {k}: column '{name}' holds {_short(item)}, not a "
                               "token id and its log-prob") from None
    return token, lp


def rows_of(x: torch.Tensor, lengths: torch.Tensor) -> list:
    """A (B, T, K) head tensor as each rollout's positions (its first lengths[r]), as nested lists, for a writer."""
    return [x[r, :n].tolist() for r, n in enumerate(lengths.tolist())]
