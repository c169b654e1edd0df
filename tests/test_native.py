"""The CPU's fused passes (seqis/_native.c) against the formulas their callers state, written here in plain float64
torch: Ratios.of's log-ratios and sums, k3 = expm1(l) - l, the kept sums, the row dots. Then what the C file
promises: the same bits at every register width and thread count, the sums of its pieces equal to its whole
(a row that keeps every token drops exactly 0 of KL), and a process without a compiler (or with SEQIS_NATIVE=0)
computing the same through torch. tests/test_evaluators.py runs the whole evaluator both ways."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from seqis import _native
from seqis._kernels import RHO_M1_CAP, dot_rows, k3_of, k3_row_sums, kept_k3_logp_sums
from seqis.fast import Ratios
from seqis.types import Batch

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(_native.lib() is None, reason=f"no native passes here: {_native.status()}")
WIDTHS = [w for w in (16, 8, 4) if _native.set_width(w)] or [0]
_native.set_width(0)


@pytest.fixture(autouse=True)
def widest():
    yield
    _native.set_width(0)


def k3_exact(x: np.ndarray) -> np.ndarray:
    """expm1(x) - x in long double, by its series where the difference would cancel (|x| < 2^-4)."""
    x = x.astype(np.longdouble)
    series = sum(x ** n / math.factorial(n) for n in range(2, 12))
    with np.errstate(over="ignore"):
        return np.where(np.abs(x) < 1 / 16, series, np.expm1(x) - x)


def values() -> np.ndarray:
    """Log-ratios from tiny to catastrophic, both signs, every binade that matters, and the overflow edge."""
    mags = np.concatenate([np.geomspace(1e-30, 1e-3, 200), np.geomspace(1e-3, 1, 2000), np.linspace(1, 100, 4000)])
    return np.concatenate([mags, -mags, [0.0, 0.3465735, 0.3465736, 88.72, 88.73, 709.7, -40.0, -60.0, -745.0]])


@pytest.mark.parametrize("dtype,ulps", [(torch.float64, 8), (torch.float32, 8)])
def test_k3_is_within_a_few_ulps_of_the_exact_value(dtype, ulps):
    x = torch.from_numpy(values()).to(dtype)
    want = k3_exact(x.double().numpy())
    for w in WIDTHS:
        _native.set_width(w)
        got, sums = _native.k3_tokens(x[None, :])
        got = got[0].double().numpy().astype(np.longdouble)
        finite = np.isfinite(want.astype(np.float64)) & (np.abs(want) < float(torch.finfo(dtype).max))
        eps = torch.finfo(dtype).eps
        rel = np.abs(got[finite] - want[finite]) / np.maximum(np.abs(want[finite]), torch.finfo(dtype).tiny)
        assert rel.max() <= ulps * eps, f"width {w}: worst {float(rel.max()) / eps:.1f} ulps at x = " \
                                        f"{x.numpy()[finite][rel.argmax()]}"
        assert np.isinf(got[~finite & (x.numpy() > 0)]).all()  # overflow: inf, as expm1's
        assert torch.isfinite(sums).all() == bool(finite.all())


def test_k3_beats_expm1_minus_l_where_that_cancels():
    # float32 near 0: expm1(l) - l keeps only the bits of l^2 / 2 that survive eps * |l|; the series keeps them all
    x = torch.tensor([[1e-4, -3e-4, 2e-3, 0.05]], dtype=torch.float32)
    want = k3_exact(x.double().numpy()[0])
    with _native.disabled():
        old = k3_of(x)[0][0].double().numpy()
    new = _native.k3_tokens(x)[0][0].double().numpy()
    assert (np.abs(new - want) <= np.abs(old - want)).all() and (np.abs(new - want) / want < 1e-6).all()


def batch_of(B: int, T: int, dtype, seed: int, pad_t=-math.inf, pad_i=math.nan, wide: bool = False,
             raw: bool = False) -> Batch | SimpleNamespace:
    """A ragged batch; raw: the bare tensors, with a loss token whose log-prob is NaN (a Batch refuses one; the
    pass is defined for it all the same)."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(B, T, generator=g) < 0.7  # holes inside the loss span too (prompt tokens)
    mask[0] = False  # an empty rollout
    inference = -torch.rand(B, T, generator=g, dtype=torch.float64) * 4
    trainer = inference + (3.0 if wide else 0.05) * torch.randn(B, T, generator=g, dtype=torch.float64)
    n = min(T, 3)  # catastrophic tokens
    trainer[1, :n] = inference[1, :n] + torch.tensor([6.0, -9.0, 95.0], dtype=torch.float64)[:n]
    trainer = torch.where(mask, trainer, pad_t)
    inference = torch.where(mask, inference, pad_i)
    if raw and B > 2 and T > 4:  # a loss token whose log-prob is not finite: cleaned to l = 0, as the torch form does
        mask[2, 4] = True
        trainer[2, 4], inference[2, 4] = math.nan, -1.0
    parts = trainer.to(dtype), inference.to(dtype), torch.randn(B, dtype=dtype), mask
    return SimpleNamespace(**dict(zip(("trainer_logprobs", "inference_logprobs", "advantages", "loss_mask"), parts))) \
        if raw else Batch(*parts)


def plain_ratios(batch) -> dict[str, torch.Tensor]:
    """The pass's formula (seqis/_native.c, RATIOS) in float64, each token's l and k3 rounded to the element type
    (as the pass stores them; a float's k3 past 3.4e38 is inf): l, its per-row sums, extremes, k3 and rho^2."""
    m, dtype = batch.loss_mask, batch.trainer_logprobs.dtype
    finite = lambda x: torch.where(torch.isfinite(x), x, 0.0)
    as_element = lambda x: x.to(dtype).double()
    logp = torch.where(m, finite(batch.trainer_logprobs.double()), 0.0)
    l = as_element(torch.where(m, finite(as_element(logp - batch.inference_logprobs.double())), 0.0))
    k3 = as_element(torch.from_numpy(k3_exact(l.numpy()).astype(np.float64)))
    e = torch.clamp(k3 + l, max=RHO_M1_CAP)
    return dict(l=l, length=m.double().sum(-1), seq=l.sum(-1), logp_sum=logp.sum(-1), k3_sum=k3.sum(-1),
                row_max=l.amax(-1), row_min=l.amin(-1), rho2=(e * (e + 2)).sum(-1), k3=k3)


def native_ratios(batch: Batch) -> dict[str, torch.Tensor]:
    tl, il, m = batch.trainer_logprobs, batch.inference_logprobs, batch.loss_mask
    B, T = m.shape
    out = {k: torch.empty(B, dtype=tl.dtype) for k in ("length", "seq", "logp_sum", "k3_sum", "row_max", "row_min",
                                                       "rho2")}
    out["l"], out["k3"] = torch.empty(B, T, dtype=tl.dtype), torch.empty(B, T, dtype=tl.dtype)
    _native.ratios(tl, il, m, out["l"], out["k3"], tuple(out[k] for k in ("length", "seq", "logp_sum", "k3_sum",
                                                                          "row_max", "row_min")),
                   out["rho2"], RHO_M1_CAP)
    return out


@pytest.mark.parametrize("T", [1, 15, 16, 17, 333, 4096])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("pads", [(-math.inf, math.nan), (math.nan, -math.inf), (0.0, 0.0), (5.0, math.inf)])
def test_the_ratios_pass_computes_its_formula(T, dtype, pads):
    batch = batch_of(7, T, dtype, seed=T, pad_t=pads[0], pad_i=pads[1], raw=True)
    got, want = native_ratios(batch), plain_ratios(batch)
    tol = dict(rtol=1e-12, atol=1e-12) if dtype == torch.float64 else dict(rtol=2e-6, atol=1e-5)
    for k, v in want.items():
        # l and the mask count exactly (one rounding of logp - log mu); the sums to the dtype's rounding
        exact = dict(rtol=0, atol=0) if k in ("l", "length", "row_max", "row_min") else tol
        torch.testing.assert_close(got[k].double(), v, **exact, msg=k)


def test_the_ratios_pass_on_a_wide_and_strided_batch():
    # log-ratios of scale 3 (every token past the polynomial's range) in rows that are a slice of wider rows
    full = batch_of(9, 300, torch.float32, seed=3, wide=True, raw=True)
    view = SimpleNamespace(trainer_logprobs=full.trainer_logprobs[:, 7:250],
                           inference_logprobs=full.inference_logprobs[:, 7:250], loss_mask=full.loss_mask[:, 7:250])
    assert view.trainer_logprobs.stride(0) == 300
    got, want = native_ratios(view), plain_ratios(view)
    for k in ("seq", "logp_sum", "k3_sum", "length"):
        torch.testing.assert_close(got[k].double(), want[k], rtol=2e-6, atol=1e-4, msg=k)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_every_width_and_thread_count_gives_the_same_bits(dtype):
    batch = batch_of(40, 1000, dtype, seed=1, raw=True)
    threads = torch.get_num_threads()
    runs = []
    try:
        for w in WIDTHS:
            for n in (1, 2, 3):
                _native.set_width(w)
                torch.set_num_threads(n)
                old, _native.MIN_PARALLEL = _native.MIN_PARALLEL, 1  # share even these 40 rows
                try:
                    runs.append(((w, n), native_ratios(batch)))
                finally:
                    _native.MIN_PARALLEL = old
    finally:
        torch.set_num_threads(threads)
    (first, a) = runs[0]
    for what, b in runs[1:]:
        for k in a:
            assert torch.equal(a[k], b[k]), f"{k}: width, threads {what} differ from {first}"


def test_calls_from_several_threads_at_once_are_each_right():
    batches = [batch_of(64, 2048, torch.float32, seed=s) for s in range(4)]
    want = [native_ratios(b) for b in batches]
    got, errors = [None] * 4, []

    def work(i):
        try:
            for _ in range(5):
                got[i] = native_ratios(batches[i])
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors and all(not t.is_alive() for t in threads)
    for w, g in zip(want, got):
        assert all(torch.equal(w[k], g[k]) for k in w)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_pieces_sum_to_the_whole(dtype):
    # a row keeps every token: its kept sums, its k3 tokens' dot with the mask, and the record's sums, to the bit
    batch = batch_of(12, 777, dtype, seed=5)
    r = Ratios.of(batch, k3=True)
    mask_f = batch.loss_mask.to(dtype)
    kept_k3, kept_logp = kept_k3_logp_sums(r.log_ratio, batch.trainer_logprobs, mask_f)
    assert torch.equal(kept_k3, r.k3_rollout) and torch.equal(kept_logp, r.logp_rowsum)
    assert torch.equal(dot_rows(r.k3, mask_f), r.k3_rollout)
    tokens, sums = k3_of(r.log_ratio)
    assert torch.equal(tokens, r.k3) and torch.equal(sums, r.k3_rollout)
    assert torch.equal(k3_row_sums(r.log_ratio), r.k3_rollout)  # the sums alone, no (B, T) tokens written
    torch.testing.assert_close(dot_rows(r.log_ratio, mask_f).double(), r.seq_log_ratio.double(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_ratios_of_agrees_with_its_torch_form(dtype):
    batch = batch_of(30, 513, dtype, seed=9)
    with _native.disabled():
        old = Ratios.of(batch, k3=True, extremes=True, chi2=True)
    new = Ratios.of(batch, k3=True, extremes=True, chi2=True)
    tol = dict(rtol=1e-12, atol=1e-12) if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-5)
    for k in ("log_ratio", "length", "seq_log_ratio", "logp_rowsum", "k3_rollout", "k3", "row_max", "row_min",
              "rho2_rowsum"):
        torch.testing.assert_close(getattr(new, k), getattr(old, k), **tol, msg=k)


def _in_a_fresh_process(env: dict, code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(ROOT), **env},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip()


CHECK = """
import torch
from seqis import _native, run
from seqis.bench.timing import ragged_batch
b = ragged_batch(8, 100)
out = run("seq_tis", b)
print(_native.status())
print(float(out.loss), float(out.scalars()["mismatch_kl"]))
"""


@pytest.mark.parametrize("env", [{"SEQIS_NATIVE": "0"}, {"CC": "/bin/false"}], ids=["switched off", "no compiler"])
def test_without_the_library_the_torch_forms_give_the_same(env, tmp_path):
    on = _in_a_fresh_process({}, CHECK).splitlines()
    off = _in_a_fresh_process({**env, "SEQIS_CACHE_DIR": str(tmp_path)}, CHECK).splitlines()
    assert on[0].startswith("native passes: on") and off[0].startswith("native passes: off"), (on, off)
    assert ("SEQIS_NATIVE=0" in off[0]) == (env.get("SEQIS_NATIVE") == "0")
    for a, b in zip(map(float, on[1].split()), map(float, off[1].split())):
        assert math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-7)


def test_a_forked_child_makes_its_own_threads():
    # the parent's workers stay in the parent: a child that shares rows starts its own and finishes
    batch = batch_of(64, 4096, torch.float32, seed=2)
    want = native_ratios(batch)["k3_sum"]
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: one pass, its k3 sums to the parent
        try:
            os.write(write, native_ratios(batch)["k3_sum"].numpy().tobytes())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        got = f.read()
    os.waitpid(pid, 0)
    assert np.frombuffer(got, dtype=np.float32).tolist() == want.tolist()
