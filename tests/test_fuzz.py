"""Fuzzing the boundaries a file or a call from outside crosses: the packed layouts and prime-rl's export lines
(tests/test_io.py fuzzes the other layouts and every format's bytes), one bad value (NaN, inf, positive, huge,
a string, null, a mask of 0.5) in a good file of every format under any column names, hostile pickles under
every name, `Batch` itself, `capture`, `load_run` and `scan` (and `python -m seqis scan`) on half-written and
mixed folders, and the diagnose command line. Nothing may escape but a ValueError (BatchFormatError is one)
with a message, a bad value is named by its file, column, row and token, a batch that comes out holds what was
written, no pickle is run, and nothing is half-written. How many inputs each test tried is printed at the end
of the run."""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import pickle
import shutil
from collections import Counter

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import examples

import seqis.io as sio
import seqis.io.load as sio_load
from seqis import Batch
from seqis.__main__ import main as cli
from seqis.io import BatchFormatError, load_batch, save_batch
from seqis.io.capture import capture
from seqis.runs import load_run, read_scan, scan
from seqis.runs.example import write_prime_rl_run
from seqis.samplers.scenarios import make_batch

TRIED: Counter = Counter()  # inputs per boundary
ACCEPTED: Counter = Counter()  # of them, those that came out as a valid batch / file / run
# 40 examples a test (120 under make test, derandomized there as every property test: tests/conftest.py); to hunt,
# SEQIS_FUZZ_EXAMPLES=2000 draws that many
HUNT = os.environ.get("SEQIS_FUZZ_EXAMPLES")
EXAMPLES = int(HUNT) if HUNT else examples(40)
FUZZ = settings(max_examples=EXAMPLES, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module", autouse=True)
def report(summary):
    yield
    summary.append(f"fuzz: {sum(TRIED.values())} inputs: " + ", ".join(f"{k} {v} ({ACCEPTED[k]} accepted)"
                                                                     for k, v in TRIED.items()))


def valid(b: Batch) -> Batch:
    """A batch that comes out of a boundary: finite log-probs at most 0 (up to rounding) on its loss tokens,
    which it has."""
    m = b.loss_mask
    assert bool(m.any())
    for x in (b.trainer_logprobs, b.inference_logprobs):
        assert torch.isfinite(x[m]).all() and (x[m] <= sio.LOGPROB_TOLERANCE).all()
    return b


def refused(e: ValueError) -> None:
    assert str(e).strip(), f"{type(e).__name__} without a message"


class Upload(io.BytesIO):
    def __init__(self, data: bytes, name: str):
        super().__init__(data)
        self.name, self.size = name, len(data)


def load_raw(data: bytes, name: str, what: str):
    """The loader without its last-resort guard: a valid Batch or a BatchFormatError, nothing else."""
    TRIED[what] += 1
    try:
        b = valid(sio_load._load(Upload(data, name), None, None, sio.MAX_BYTES))
        ACCEPTED[what] += 1
        return b
    except BatchFormatError as e:
        refused(e)
        return None


# ---------------------------------------------------------------------------------------------------------
# packed layouts: 1-D (or [1, N]) tokens split by position_ids or seq_lens

SPECIAL = st.sampled_from([0.0, -0.0, -1e-7, 1e-7, 0.5, -1e30, 3e38, math.nan, math.inf, -math.inf])
LOGPROB = st.floats(-20, 0, width=32)
USUALLY = st.sampled_from([True, True, True, False])  # (hypothesis leans to a list's first element, and to 0)


@st.composite
def sprinkled(draw, n: int, base=LOGPROB):
    """n values of base with at most two of them replaced by a special value (NaN, inf, positive, huge, -0):
    most lists are clean, so the accepting path is fuzzed as well as the refusing one."""
    values = draw(st.lists(base, min_size=n, max_size=n))
    for _ in range(draw(st.sampled_from([0, 0, 0, 0, 1, 2])) if n else 0):
        values[draw(st.integers(0, n - 1))] = draw(SPECIAL)
    return values


@st.composite
def packed(draw):
    n = draw(st.integers(0, 24))
    cols = {k: draw(sprinkled(n)) for k in ("trainer_logprobs", "inference_logprobs")}
    if draw(st.booleans()):  # position_ids restarting at 0 for each rollout, or anything
        lengths = draw(st.lists(st.integers(1, 6), min_size=0, max_size=6))
        pos = [i for L in lengths for i in range(L)][:n] + [0] * max(0, n - sum(lengths))
        cols["position_ids"] = pos if draw(USUALLY) else draw(st.lists(st.integers(-2, 8), min_size=n, max_size=n))
        B = max(1, sum(1 for p in cols["position_ids"] if p == 0))
    else:
        cuts = sorted(draw(st.sets(st.integers(1, n - 1), max_size=5))) if n > 1 else []
        split = [b - a for a, b in zip([0, *cuts], [*cuts, n])] if n else []  # lengths that sum to n, or anything
        cols["seq_lens"] = split if draw(USUALLY) else draw(st.lists(st.integers(-1, 8), max_size=6))
        B = max(1, len(cols["seq_lens"]))
    if draw(st.booleans()):
        cols["loss_mask"] = draw(sprinkled(n, st.sampled_from([0.0, 1.0, 1.0])))
    adv_len = draw(st.sampled_from([B, B, n, 1, B + 1]))
    cols["advantages"] = draw(sprinkled(adv_len, st.floats(-3, 3, width=32)))
    wrap = draw(st.booleans())  # [1, N] as verl's micro-batches come
    return cols, wrap


def _arrays(cols: dict, wrap: bool) -> dict[str, np.ndarray]:
    out = {}
    for k, v in cols.items():
        a = np.array(v, dtype=np.int64 if k in ("position_ids", "seq_lens") else np.float32)
        out[k] = a[None] if wrap and k not in ("seq_lens",) and a.ndim == 1 and len(a) else a
    return out


@FUZZ
@given(case=packed())
def test_fuzz_packed_layouts(case):
    cols, wrap = case
    arrays = _arrays(cols, wrap)
    from safetensors.torch import save

    buf, pt = io.BytesIO(), io.BytesIO()
    np.savez(buf, **arrays)
    torch.save({k: torch.from_numpy(a.copy()) for k, a in arrays.items()}, pt)
    files = {"p.npz": buf.getvalue(), "p.pt": pt.getvalue(),
             "p.safetensors": save({k: torch.from_numpy(a.copy()) for k, a in arrays.items()}),
             "p.json": json.dumps({k: a.tolist() for k, a in arrays.items()}).encode()}
    on_loss = np.array(cols["loss_mask"]) != 0 if "loss_mask" in cols else np.ones(len(cols["trainer_logprobs"]), bool)
    for name, data in files.items():
        b = load_raw(data, name, "packed files")
        if b is not None:  # the loss tokens, in order, are the file's: none lost, moved or made up
            for role in ("trainer_logprobs", "inference_logprobs"):
                got = getattr(b, role)[b.loss_mask].double().numpy()
                assert np.array_equal(got, np.array(cols[role], np.float32)[on_loss].astype(np.float64)), (name, role)


# ---------------------------------------------------------------------------------------------------------
# prime-rl's token export lines, damaged


@pytest.fixture(scope="module")
def export_lines(tmp_path_factory) -> list[dict]:
    root = tmp_path_factory.mktemp("export")
    write_prime_rl_run(root, steps=1, ranks=1, rollouts_per_rank=4, max_len=12, prompt_len=3, incident=None)
    return [json.loads(line) for line in (root / "step_0" / "rank_0.jsonl").read_text().splitlines()]


JSON_VALUE = st.recursive(st.none() | st.booleans() | st.integers(-5, 5) | st.floats(-3, 3) | st.text(max_size=3),
                          lambda inner: st.lists(inner, max_size=4), max_leaves=8)


@FUZZ
@given(data=st.data())
def test_fuzz_prime_rl_export_lines(export_lines, data):
    records = json.loads(json.dumps(export_lines))  # a deep copy
    for _ in range(data.draw(st.integers(1, 3))):
        rec = records[data.draw(st.integers(0, len(records) - 1))]
        key = data.draw(st.sampled_from(sorted(rec)))
        action = data.draw(st.sampled_from(["drop", "replace", "shorten", "nan"]))
        if action == "drop":
            del rec[key]
        elif action == "replace":
            rec[key] = data.draw(JSON_VALUE)
        elif action == "shorten" and isinstance(rec[key], list) and rec[key]:
            rec[key] = rec[key][: data.draw(st.integers(0, len(rec[key]) - 1))]
        elif isinstance(rec[key], list) and rec[key] and isinstance(rec[key][-1], float):
            rec[key][-1] = None  # prime-rl writes a non-finite value as null
    text = "".join(json.dumps(r) + "\n" for r in records).encode()
    if data.draw(st.booleans()):
        text = text[: data.draw(st.integers(1, len(text)))]  # a line cut short, as a file being written
    load_raw(text, "rank_0.jsonl", "export files")


# ---------------------------------------------------------------------------------------------------------
# Batch

FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


@st.composite
def tensor(draw, shape):
    """Mostly a float tensor (any width); now and then an integer or a bool one, which only a mask may be."""
    dtype = draw(st.sampled_from([torch.float32, *FLOATS, torch.int64, torch.bool]))  # hypothesis leans to the first
    n = math.prod(shape)
    x = torch.tensor(draw(sprinkled(n, st.floats(-5, 0, width=16))), dtype=torch.float64).reshape(shape)
    if dtype == torch.bool:
        return x > 0
    if not dtype.is_floating_point:
        return torch.nan_to_num(x).clamp(-9, 9).to(dtype)
    return x.to(dtype)


@FUZZ
@given(data=st.data())
def test_fuzz_batch(data):
    B, T = data.draw(st.integers(0, 3)), data.draw(st.integers(0, 4))
    shape = lambda: (B, T) if data.draw(USUALLY) else data.draw(st.sampled_from([(B,), (T, B), (B, T + 1), ()]))
    tl, il = data.draw(tensor(shape())), data.draw(tensor(shape()))
    adv = data.draw(tensor(data.draw(st.sampled_from([(B,), (B,), (B, T), (B + 1,)]))))
    mask = data.draw(st.none() | tensor(shape()))
    meta = data.draw(st.dictionaries(st.sampled_from(["env", "step"]), st.lists(st.integers(), min_size=B,
                                                                                 max_size=B + 1), max_size=2))
    drop = data.draw(st.booleans())
    TRIED["Batch calls"] += 1
    try:
        b = Batch(tl, il, adv, mask, meta, drop_nonfinite=drop)
    except ValueError as e:
        refused(e)
        return
    m = b.loss_mask
    assert m.dtype == torch.bool and m.shape == b.shape
    for x in (b.trainer_logprobs, b.inference_logprobs):
        assert torch.isfinite(x[m]).all()  # no NaN or inf reaches a loss token
    given_mask = torch.ones(b.shape, dtype=torch.bool) if mask is None else (mask != 0)
    assert not (m & ~given_mask).any()  # dropping only removes tokens
    for x, sent in ((b.trainer_logprobs, tl), (b.inference_logprobs, il)):  # and the values are the caller's
        assert torch.equal(x[m].double(), sent.double()[m])
    assert b.n_dropped_nonfinite == int((given_mask & ~m).sum()) and (drop or b.n_dropped_nonfinite == 0)
    text = repr(b)
    assert "\n" not in text and text.startswith(f"Batch({B} rollouts x {T} positions")
    ACCEPTED["Batch calls"] += 1


# ---------------------------------------------------------------------------------------------------------
# capture


@st.composite
def captured(draw):
    B, T = draw(st.integers(0, 3)), draw(st.integers(0, 5))
    form = draw(st.sampled_from(["tensor", "numpy", "list", "ragged"]))

    def values(shape):
        x = draw(st.lists(LOGPROB, min_size=math.prod(shape), max_size=math.prod(shape)))
        a = np.array(x, dtype=np.float32).reshape(shape)
        if form == "tensor":
            return torch.from_numpy(a).to(draw(st.sampled_from([torch.float32, torch.bfloat16, torch.float64])))
        if form == "numpy":
            return a
        if form == "ragged" and B > 1 and len(shape) == 2:
            return [list(r[: draw(st.integers(0, T))]) for r in a.tolist()]
        return a.tolist()

    fields = dict(trainer_logprobs=values((B, T)), inference_logprobs=values((B, draw(st.sampled_from([T, T + 1])))),
                  advantages=values(draw(st.sampled_from([(B,), (B, T)]))))
    if draw(st.booleans()):
        fields["loss_mask"] = draw(st.lists(st.lists(st.sampled_from([0, 1, 1]), min_size=T, max_size=T),
                                            min_size=B, max_size=B))
    meta = draw(st.dictionaries(st.sampled_from(["env_name", "step", "note"]),
                                st.integers() | st.text(max_size=3) | st.lists(st.text(max_size=2), min_size=B,
                                                                               max_size=B + 1), max_size=2))
    suffix = draw(st.sampled_from([".parquet", ".npz", ".safetensors", ".jsonl"]))
    return fields, meta, suffix


@FUZZ
@given(case=captured())
def test_fuzz_capture(tmp_path_factory, case):
    fields, meta, suffix = case
    folder = tmp_path_factory.mktemp("capture")
    TRIED["capture calls"] += 1
    try:
        path = capture(folder / "run" / f"step_1{suffix}", **fields, **meta)
    except ValueError as e:
        refused(e)
        left = list((folder / "run").iterdir()) if (folder / "run").exists() else []
        assert left == [], left  # a refused batch writes nothing, not even a temporary file
        return
    assert [p.name for p in path.parent.iterdir()] == [path.name]
    valid(load_batch(path))  # what capture wrote, load_batch reads
    ACCEPTED["capture calls"] += 1


# ---------------------------------------------------------------------------------------------------------
# one bad value in a good file: refused, naming the file, the column as the file names it, the row and the token;
# the command line says the same in one line. Without the bad value the file loads to exactly what was written.

NAMINGS = {  # role -> the file's column name, and the --columns / columns= a user passes for names not known
    "ours": ({}, None),
    "verl": ({"trainer_logprobs": "old_log_probs", "inference_logprobs": "rollout_log_probs",
              "loss_mask": "response_mask"}, None),
    "other": ({"trainer_logprobs": "logp_fsdp", "inference_logprobs": "logp_vllm", "loss_mask": "valid"},
              {"trainer_logprobs": "logp_fsdp", "inference_logprobs": "logp_vllm", "loss_mask": "valid"}),
}
BAD = {  # role -> values no file may hold there (on a loss token; for advantages, in a rollout with one)
    "trainer_logprobs": [math.nan, math.inf, -math.inf, 1e-4, 0.5, 3e38, "text", None],
    "inference_logprobs": [math.nan, math.inf, -math.inf, 1e-4, 0.5, 3e38, "text", None],
    "advantages": [math.nan, math.inf, -math.inf, "text"],
    "loss_mask": [0.5, 2.0, -1.0, math.nan, math.inf],
}
TEXT_FORMATS = (".jsonl", ".json")  # where a value can be a string or null


def _write_columns(path, cols: dict[str, np.ndarray], bad: tuple | None) -> None:
    """The columns ([B, T] per token, [B] per rollout) in path's format, with bad = (column, row, token, value)
    put in (a string or null only where the format holds one)."""
    fmt = path.suffix
    if fmt in TEXT_FORMATS or fmt == ".parquet":
        rows = [{k: v[i].tolist() for k, v in cols.items()} for i in range(len(cols["advantages"]))]
        if bad is not None:
            name, r, t, value = bad
            if t is None:
                rows[r][name] = value
            else:
                rows[r][name][t] = value
        if fmt == ".parquet":
            import pyarrow as pa
            import pyarrow.parquet as pq

            pq.write_table(pa.Table.from_pylist(rows), path)
        elif fmt == ".json":
            path.write_text(json.dumps(rows))
        else:
            path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return
    arrays = {k: v.copy() for k, v in cols.items()}
    if bad is not None:
        name, r, t, value = bad
        arrays[name][(r,) if t is None else (r, t)] = value
    if fmt == ".npz":
        np.savez(path, **arrays)
        return
    tensors = {k: torch.from_numpy(a) for k, a in arrays.items()}
    if fmt == ".safetensors":
        from safetensors.torch import save_file

        save_file(tensors, path)
    else:
        torch.save(tensors, path)


@st.composite
def one_bad_value(draw):
    B, T = draw(st.integers(1, 5)), draw(st.integers(1, 8))
    tl = np.array(draw(st.lists(st.lists(LOGPROB, min_size=T, max_size=T), min_size=B, max_size=B)), np.float32)
    il = np.array(draw(st.lists(st.lists(LOGPROB, min_size=T, max_size=T), min_size=B, max_size=B)), np.float32)
    mask = np.array(draw(st.lists(st.lists(st.booleans(), min_size=T, max_size=T), min_size=B, max_size=B)))
    mask[draw(st.integers(0, B - 1)), draw(st.integers(0, T - 1))] = True  # a batch has a loss token
    adv = np.array(draw(st.lists(st.floats(width=32, allow_nan=False, allow_infinity=False), min_size=B, max_size=B)),
                   np.float32)  # up to 3.4e38: a huge advantage is a valid one
    fmt = draw(st.sampled_from(sio.FORMATS))
    naming = draw(st.sampled_from(sorted(NAMINGS)))
    bad = None
    if draw(st.sampled_from([True, True, False])):
        role = draw(st.sampled_from(sorted(BAD)))
        value = draw(st.sampled_from([v for v in BAD[role] if fmt in TEXT_FORMATS or isinstance(v, float)]))
        r, t = map(int, draw(st.sampled_from(np.argwhere(mask).tolist())))  # a loss token
        bad = (role, r, None if role == "advantages" else t, value)
    return dict(trainer_logprobs=tl, inference_logprobs=il, loss_mask=mask, advantages=adv), fmt, naming, bad


@FUZZ
@given(case=one_bad_value())
def test_fuzz_one_bad_value_is_named_by_its_column_row_and_token(tmp_path_factory, case):
    cols, fmt, naming, bad = case
    names, columns = NAMINGS[naming]
    name = lambda role: names.get(role, role)
    written = {name(k): (v.astype(np.float32) if bad and bad[0] == "loss_mask" else v) for k, v in cols.items()}
    path = tmp_path_factory.mktemp("bad") / f"step_3{fmt}"
    _write_columns(path, written, None if bad is None else (name(bad[0]), *bad[1:]))
    TRIED["one bad value"] += 1
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli(["diagnose", str(path), *(["--columns", ",".join(f"{k}={v}" for k, v in columns.items())]
                                             if columns else [])])
    if bad is None:  # exactly what was written
        b = valid(load_batch(path, columns=columns))
        assert torch.equal(b.loss_mask, torch.from_numpy(cols["loss_mask"]))
        for role in ("trainer_logprobs", "inference_logprobs"):
            assert torch.equal(getattr(b, role)[b.loss_mask].float(), torch.from_numpy(cols[role][cols["loss_mask"]]))
        assert torch.equal(b.advantages.float(), torch.from_numpy(cols["advantages"]))
        assert code == 0 and not err.getvalue(), err.getvalue()
        ACCEPTED["one bad value"] += 1
        return
    role, r, t, value = bad
    with pytest.raises(BatchFormatError) as refusal:
        load_batch(path, columns=columns)
    msg = str(refusal.value)
    where = f"row {r}" + ("" if t is None or value == "text" else f", token {t}")  # (a string: its row's list)
    assert msg.startswith(f"{path.name}: {where}: column '{name(role)}' "), (value, msg)
    assert code == 1 and not out.getvalue()
    [line] = err.getvalue().splitlines()  # one line, the same words
    assert line == f"seqis: {path}: {msg.removeprefix(f'{path.name}: ')}"


# ---------------------------------------------------------------------------------------------------------
# hostile pickles under every name: refused, and never run


class Trap:
    """Unpickling this makes a folder: if the folder exists, something ran code from a file."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return os.mkdir, (self.marker,)


@FUZZ
@given(fmt=st.sampled_from(sio.FORMATS), protocol=st.integers(0, pickle.HIGHEST_PROTOCOL),
       wrap=st.sampled_from(["bare", "torch.save", "npz object array"]),
       where=st.sampled_from(["alone", "in a column", "beside good columns"]))
def test_fuzz_pickles_are_refused_and_never_run(tmp_path_factory, fmt, protocol, wrap, where):
    d = tmp_path_factory.mktemp("pickle")
    marker = str(d / "ran")
    trap = Trap(marker)
    good = {"trainer_logprobs": torch.full((2, 3), -0.5), "inference_logprobs": torch.full((2, 3), -0.5),
            "advantages": torch.zeros(2)}
    obj = {"alone": trap, "in a column": {"trainer_logprobs": trap},
           "beside good columns": {**good, "extra": trap}}[where]
    if wrap == "bare":
        data = pickle.dumps(obj, protocol=protocol)
    elif wrap == "torch.save":
        buf = io.BytesIO()
        torch.save(obj, buf, pickle_protocol=max(protocol, 2))
        data = buf.getvalue()
    else:
        buf = io.BytesIO()
        arrays = {k: v.numpy() for k, v in good.items()} if where == "beside good columns" else {}
        np.savez(buf, **arrays, **{"advantages" if where == "in a column" else "extra": np.array([trap, trap])})
        data = buf.getvalue()
    path = d / f"batch{fmt}"
    path.write_bytes(data)
    TRIED["pickles"] += 1
    with pytest.raises(BatchFormatError) as refusal:
        sio_load._load(Upload(data, path.name), None, None, sio.MAX_BYTES)
    refused(refusal.value)
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        assert cli(["diagnose", str(path)]) == 1
    assert len(err.getvalue().splitlines()) == 1 and err.getvalue().startswith(f"seqis: {path}: ")
    assert not os.path.exists(marker), "a pickle was run"


# ---------------------------------------------------------------------------------------------------------
# load_run and scan on half-written and mixed folders


@pytest.fixture(scope="module")
def run_parts(tmp_path_factory):
    """A small prime-rl export and a few step dumps, to copy, cut and mix."""
    root = tmp_path_factory.mktemp("parts")
    write_prime_rl_run(root / "export", steps=3, ranks=2, rollouts_per_rank=3, max_len=10, prompt_len=2,
                       incident=None)
    (root / "dumps").mkdir()
    for step in range(2):
        save_batch(make_batch("gaussian", seed=step, n_rollouts=4, max_len=24), root / "dumps" / f"step_{step}.npz")
    return root


@st.composite
def damages(draw):
    """What to do to each file of a run: keep, cut short, overwrite with bytes, empty, remove."""
    return draw(st.lists(st.tuples(st.integers(0, 99), st.sampled_from(["keep", "cut", "bytes", "empty", "remove",
                                                                        "unstable"]),
                                   st.integers(0, 2**16)), min_size=1, max_size=4))


@pytest.mark.slow  # a run copied, damaged, loaded and scanned twice per example: ~0.2 s each
@FUZZ
@given(plan=damages(), mixed=st.booleans(), junk=st.sampled_from(["", "step_9.parquet", "step_x", "notes.txt"]))
def test_fuzz_load_run_and_scan_on_half_written_and_mixed_folders(tmp_path_factory, run_parts, plan, mixed, junk):
    root = tmp_path_factory.mktemp("run") / "token_exports"
    shutil.copytree(run_parts / "export", root)
    if mixed:  # a folder of dumps inside the export: a layout nobody writes, but somebody will
        shutil.copytree(run_parts / "dumps", root / "dumps")
    if junk:
        (root / junk).write_bytes(b"\x00PAR1 junk")
    files = sorted(p for p in root.rglob("*") if p.is_file())
    for index, action, size in plan:
        p = files[index % len(files)]
        if not p.exists():
            continue
        if action == "cut":
            p.write_bytes(p.read_bytes()[: size % max(p.stat().st_size, 1)])
        elif action == "bytes":
            p.write_bytes(np.random.default_rng(size).bytes(size % 300 + 1))
        elif action == "empty":
            p.write_bytes(b"")
        elif action == "remove":
            p.unlink()
        elif action == "unstable" and (p.parent / "STABLE").exists():
            (p.parent / "STABLE").unlink()
    TRIED["run folders"] += 1
    try:
        run = load_run(root)
    except ValueError as e:
        refused(e)
        return
    ACCEPTED["run folders"] += 1
    for step in run.steps + run.unstable_steps:
        TRIED["run steps"] += 1
        try:
            valid(run.read(step, extras=False)[0])
            ACCEPTED["run steps"] += 1
        except ValueError as e:
            refused(e)
    out = root.parent / "scan.parquet"
    try:
        df = scan(root, ("seq_tis",), by="env_name", workers=1, out=out)
    except ValueError as e:  # nothing readable at all
        refused(e)
        df = None
    else:
        s = df.attrs["summary"]
        assert s["scanned"] + len(s["failed"]) + s["cached"] == s["steps"]
        assert all(isinstance(f, str) and f for f in s["failed"])
        assert read_scan(out).shape == df.shape  # written whole
    cli_out, err = root.parent / "cli.parquet", io.StringIO()  # the command line on the same folder
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = cli(["scan", str(root), "--out", str(cli_out), "--estimators", "seq_tis", "--by", "env_name",
                    "--workers", "1"])
    TRIED["scan command lines"] += 1
    assert "Traceback" not in err.getvalue()
    if code == 2:  # refused: one line, no table
        [line] = [x for x in err.getvalue().splitlines() if x.startswith("python -m seqis scan: ")]
        assert line.strip() != "python -m seqis scan:" and not cli_out.exists()
    else:
        ACCEPTED["scan command lines"] += 1
        assert code in (0, 1) and df is not None  # 1: a step not read, said in the summary
        assert read_scan(cli_out).shape == df.shape
    assert sorted(p.name for p in root.parent.iterdir() if p.is_file()) == sorted(
        p.name for p in (out, cli_out) if p.exists())  # nothing half-written beside them


# ---------------------------------------------------------------------------------------------------------
# the diagnose command line


@pytest.fixture(scope="module")
def cli_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    b = make_batch("gaussian", seed=2, n_rollouts=8, max_len=32)
    b.metadata["env"] = ["a", "b"] * 4
    save_batch(b, d / "good.parquet")
    save_batch(b, d / "odd.parquet", columns={"trainer_logprobs": "lp", "inference_logprobs": "mu"})
    (d / "broken.npz").write_bytes(b"PK\x03\x04 nope")
    (d / "empty.jsonl").write_bytes(b"")
    (d / "folder").mkdir()
    return d


@FUZZ
@given(name=st.sampled_from(["good.parquet", "odd.parquet", "broken.npz", "empty.jsonl", "folder", "missing.pt"]),
       columns=st.none() | st.lists(st.tuples(st.sampled_from(["trainer_logprobs", "inference_logprobs", "loss_mask",
                                                               "nope", ""]),
                                              st.sampled_from(["lp", "mu", "advantages", "", "x=y"])),
                                    max_size=3),
       by=st.none() | st.sampled_from(["env", "group_id", "nope"]), flags=st.sets(st.sampled_from(["--json",
                                                                                                 "--strict"])))
def test_fuzz_the_diagnose_command_line(cli_files, name, columns, by, flags):
    argv = ["diagnose", str(cli_files / name), *sorted(flags)]
    if columns is not None:
        argv += ["--columns", ",".join(f"{r}={n}" for r, n in columns)]
    if by is not None:
        argv += ["--by", by]
    out, err = io.StringIO(), io.StringIO()
    TRIED["command lines"] += 1
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli(argv)
        except SystemExit as e:  # argparse: a bad --columns is a usage error
            code = e.code
    assert code in (0, 1, 2), code
    assert "Traceback" not in err.getvalue()
    ACCEPTED["command lines"] += code == 0
    if code == 2:
        assert "--columns" in err.getvalue()
    elif code == 1 and not out.getvalue():
        lines = err.getvalue().strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"seqis: {cli_files / name}: "), err.getvalue()
    elif "--json" in flags:
        assert isinstance(json.loads(out.getvalue()), list)
