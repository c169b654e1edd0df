"""save_batch: any Batch out in every format and layout load_batch reads."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from ..core.types import Batch
from . import head
from .assemble import _scalar
from .columns import _SAFETENSORS_META, FORMATS
from .load import _suffix

# ---------------------------------------------------------------------------------------------------------
# save_batch

LAYOUTS = {
    "rows": (".parquet", ".jsonl", ".json", ".pt"),
    "padded": FORMATS,
    "packed": (".npz", ".safetensors", ".pt", ".json"),
}


def save_batch(batch: Batch, path, *, format: str | None = None, layout: str | None = None,
               columns: dict[str, str] | None = None, split_by: str = "position_ids", compress: bool = False):
    """Write a batch in any format `load_batch` reads.

    layout: "rows" (one record per rollout, each as long as its last loss token; the default for parquet,
    jsonl and json), "padded" ([B, T]; the default for npz, safetensors and pt) or "packed" (1-D tokens split
    by `split_by`, "position_ids" or "seq_lens"). columns: role -> name to write, e.g. VERL_NAMES.
    compress: zip-deflate an npz. Positions off the loss mask that are not finite are written as 0.
    Metadata becomes per-rollout columns (text columns of a safetensors file go into its header); per-token
    extras (entropy, token ids) become token columns, which load_batch reads back into Batch.extras. The sampler's
    head (Batch.topk_*) becomes (B, T, K) arrays (padded) or one list of K values per position (rows), under
    seqis's names; a packed layout cannot carry it.
    """
    path = Path(path)
    fmt = _suffix(format, path.name)
    layout = layout or ("rows" if fmt in (".parquet", ".jsonl", ".json") else "padded")
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    if fmt not in LAYOUTS[layout]:
        raise ValueError(f"layout {layout!r} cannot be written as {fmt}; it can as {', '.join(LAYOUTS[layout])}")
    if split_by not in ("position_ids", "seq_lens"):
        raise ValueError(f"split_by must be 'position_ids' or 'seq_lens', got {split_by!r}")
    if batch.has_head and layout == "packed":
        raise ValueError("a packed layout (1-D tokens) cannot carry the sampler's head; write it by rows or padded")
    names = {r: (columns or {}).get(r, r) for r in ("trainer_logprobs", "inference_logprobs", "loss_mask",
                                                     "advantages")}
    written = set(names.values()) | ({split_by} if layout == "packed" else set())
    clash = sorted((set(batch.metadata) | set(batch.extras)) & written) or sorted(set(batch.metadata) & set(
        batch.extras))
    if clash:
        raise ValueError(f"metadata or extras column {clash[0]!r} clashes with another column of that name")

    mask = batch.loss_mask.detach().cpu()  # (B, T)
    B, T = mask.shape

    def clean(x):  # (B, T) off-mask non-finite values -> 0; bf16 only where the format has it
        x = x.detach().cpu()
        if x.dtype == torch.bfloat16 and fmt not in (".safetensors", ".pt"):
            x = x.float()
        return torch.where(mask | torch.isfinite(x), x, torch.zeros((), dtype=x.dtype))

    token_cols = {names["trainer_logprobs"]: clean(batch.trainer_logprobs),
                  names["inference_logprobs"]: clean(batch.inference_logprobs),
                  names["loss_mask"]: mask,
                  **{k: clean(x) for k, x in batch.extras.items()}}  # per-token extras (entropy, token ids)
    adv = batch.advantages.detach().cpu()
    if adv.dtype == torch.bfloat16 and fmt not in (".safetensors", ".pt"):
        adv = adv.float()
    if adv.dim() == 2:
        token_cols[names["advantages"]] = clean(adv)
    row_cols = {names["advantages"]: adv} if adv.dim() == 1 else {}

    # each row's length: through its last loss token (rows, packed) or T (padded)
    last = torch.where(mask.any(-1), T - mask.flip(-1).to(torch.uint8).argmax(-1), 0)  # (B,)
    if layout == "padded":
        lengths = torch.full((B,), T, dtype=torch.int64)
    elif layout == "packed" and split_by == "position_ids":
        lengths = last.clamp(min=1)  # an empty rollout keeps one off-mask token, so it is not lost
    else:
        lengths = last
    pos = torch.arange(T)[None, :] < lengths[:, None]  # (B, T)
    names_of_head = ("topk_ids", "topk_inference_logprobs", "topk_trainer_logprobs", "topk_support")
    heads = {k: x.detach().cpu() for k, x in zip(names_of_head, batch.head()) if x is not None}  # (B, T, K) each
    nested = {k: head.rows_of(x, lengths) for k, x in heads.items()} if layout == "rows" else {}

    if fmt == ".parquet":
        _write_parquet(path, token_cols, row_cols, batch.metadata, lengths, pos, nested)
    elif fmt in (".jsonl", ".json") and layout != "packed":
        _write_json_rows(path, token_cols, row_cols, batch.metadata, lengths, jsonl=fmt == ".jsonl", nested=nested)
    elif layout == "rows":  # .pt
        rows = {k: list(torch.split(v[pos], lengths.tolist())) for k, v in token_cols.items()}
        torch.save({**rows, **row_cols, **nested, **_plain_metadata(batch.metadata)}, path)
    else:
        if layout == "packed":
            cols = {k: v[pos] for k, v in token_cols.items()}  # (N,) each
            if split_by == "position_ids":
                cols["position_ids"] = torch.arange(T).expand(B, T)[pos]  # (N,) restarting at 0
            else:
                cols["seq_lens"] = lengths
        else:
            cols = {**token_cols, **heads}
        cols.update(row_cols)
        _write_arrays(path, fmt, cols, batch.metadata, compress)


def _plain_metadata(metadata: dict) -> dict[str, list]:
    return {k: [_scalar(v) for v in vs] for k, vs in metadata.items()}


def _numeric_metadata(values: list) -> np.ndarray | None:
    if values and all(isinstance(v, (bool, np.bool_)) for v in values):
        return np.array(values, dtype=bool)
    if values and all(isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)
                      for v in values):
        a = np.array(values)
        return a if a.dtype.kind in "if" else None
    return None


def _write_parquet(path, token_cols, row_cols, metadata, lengths, pos, nested=None):
    import pyarrow as pa
    import pyarrow.parquet as pq

    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths.numpy(), out=offsets[1:])
    big = offsets[-1] >= 2**31
    data = {}
    for k, v in token_cols.items():
        values = pa.array(v[pos].numpy())
        cls = pa.LargeListArray if big else pa.ListArray
        data[k] = cls.from_arrays(pa.array(offsets if big else offsets.astype(np.int32)), values)
    for k, v in row_cols.items():
        data[k] = pa.array(v.numpy())
    for k, rows in (nested or {}).items():  # the head: list<list<...>>, one list of K per position
        data[k] = pa.array(rows)
    for k, vs in _plain_metadata(metadata).items():
        try:
            data[k] = pa.array(vs)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            data[k] = pa.array([None if v is None else str(v) for v in vs])
    pq.write_table(pa.table(data), path, compression="zstd")


def _json_numbers(x: torch.Tensor) -> str:
    """A 1-D tensor as a JSON array; float32 in its shortest exact form, NaN/Infinity as Python writes them."""
    if x.dtype == torch.bool:
        return "[" + ",".join("true" if v else "false" for v in x.tolist()) + "]"
    if not x.is_floating_point():
        return json.dumps(x.tolist())
    a = x.numpy()
    items = [str(v) for v in a] if a.dtype == np.float32 else [repr(v) for v in a.tolist()]
    if not np.isfinite(a).all():
        special = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}
        items = [special.get(s, s) for s in items]
    return "[" + ",".join(items) + "]"


def _write_json_rows(path, token_cols, row_cols, metadata, lengths, jsonl: bool, nested=None):
    meta = _plain_metadata(metadata)
    rows = []
    for j, n in enumerate(lengths.tolist()):  # a writer walks its rows; all math is elsewhere
        parts = [f"{json.dumps(k)}: {_json_numbers(v[j, :n])}" for k, v in token_cols.items()]
        parts += [f"{json.dumps(k)}: {_json_numbers(v[j:j + 1])[1:-1]}" for k, v in row_cols.items()]
        parts += [f"{json.dumps(k)}: {json.dumps(rows[j])}" for k, rows in (nested or {}).items()]
        parts += [f"{json.dumps(k)}: {json.dumps(vs[j], default=str)}" for k, vs in meta.items()]
        rows.append("{" + ", ".join(parts) + "}")
    text = "\n".join(rows) + "\n" if jsonl else "[\n" + ",\n".join(rows) + "\n]\n"
    Path(path).write_text(text)


def _write_arrays(path, fmt, cols: dict[str, torch.Tensor], metadata, compress):
    meta = _plain_metadata(metadata)
    if fmt == ".json":  # the head's (B, T, K) arrays as nested lists, the rest flat
        doc = ", ".join(f"{json.dumps(k)}: {json.dumps(v.tolist()) if v.dim() == 3 else _json_numbers(v.reshape(-1))}"
                        for k, v in cols.items())
        doc += "".join(f", {json.dumps(k)}: {json.dumps(vs, default=str)}" for k, vs in meta.items())
        Path(path).write_text("{" + doc + "}\n")
    elif fmt == ".pt":
        torch.save({**cols, **meta}, path)
    elif fmt == ".npz":
        arrays = {k: v.numpy() for k, v in cols.items()}
        for k, vs in meta.items():
            a = _numeric_metadata(vs)
            arrays[k] = a if a is not None else np.array(["" if v is None else str(v) for v in vs])
        (np.savez_compressed if compress else np.savez)(path, **arrays)
    else:  # safetensors: numeric metadata as tensors, the rest as JSON in the header
        from safetensors.torch import save_file

        tensors = {k: v.contiguous() for k, v in cols.items()}
        text = {}
        for k, vs in meta.items():
            a = _numeric_metadata(vs)
            if a is not None:
                tensors[k] = torch.from_numpy(a)
            else:
                text[k] = vs
        save_file(tensors, str(path), metadata={_SAFETENSORS_META: json.dumps(text)} if text else None)
