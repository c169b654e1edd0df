"""Reproducibility on CPUs the developers do not have (docs/reliability.md, "Reproducibility").

The bitwise claims (tests marked `reproducibility`) run again in subprocesses under ATEN_CPU_CAPABILITY=default,
avx2 and avx512, so the scalar, AVX2 and AVX-512 kernels each get their turn whatever this machine's CPU is (a
CPU without AVX-512 falls back to AVX2: the run says which it got). A training run gives the same bytes with
1, 2 or 3 threads. The pieces that make a seed independent of the runs beside it (seqis.lab.fixed) are
checked against what they promise."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from seqis.lab.fixed import ROW_MULTIPLE, SERIAL_ELEMENTS, pointwise, row_blocks
from seqis.lab.poisson_binomial import value_and_gradient

ROOT = Path(__file__).resolve().parents[1]
# the files that hold `reproducibility` tests (a file without one would only cost its import)
FILES = ["tests/test_train.py", "tests/test_lab.py", "tests/test_determinism.py"]


def _capability(env) -> str:
    code = "import torch; print(torch.backends.cpu.get_cpu_capability())"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120).stdout.strip()


@pytest.mark.slow
@pytest.mark.parametrize("capability", ["default", "avx2", "avx512"])
def test_the_bitwise_claims_hold_under_each_cpu_capability(capability):
    env = dict(os.environ, ATEN_CPU_CAPABILITY=capability)
    got = _capability(env)
    fallback = {"default": {"DEFAULT"}, "avx2": {"AVX2", "DEFAULT"}, "avx512": {"AVX512", "AVX2", "DEFAULT"}}
    assert got in fallback[capability], f"torch ran {capability} as {got!r}"
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "reproducibility",
                          *FILES], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    print(f"ATEN_CPU_CAPABILITY={capability} (torch: {got}): {res.stdout.strip().splitlines()[-1]}")
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]


TRAIN = r"""
import hashlib, sys, torch
torch.set_num_threads(int(sys.argv[1]))
from seqis.lab import BitChain, TabularAR, train
a = train(BitChain(48, 26, 0.5, 0.5), ["seq_is", "token_tis"], steps=3, lr=1.0, lag=2, batch_size=700, seeds=[1, 2])
b = train(TabularAR(3, 4, seed=1), ["seq_is", "geo_is"], steps=3, lr=1.0, lag=2, batch_size=50, seeds=[1, 2])
print(hashlib.sha256(a.J.tobytes() + b.J.tobytes()).hexdigest())
"""


@pytest.mark.slow
def test_a_training_run_gives_the_same_bytes_with_any_thread_count():
    # 700 rollouts x 48 positions x 2 runs: torch splits the estimators' element-wise ops between threads
    procs = [subprocess.Popen([sys.executable, "-c", TRAIN, str(n)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, cwd=ROOT) for n in (1, 2, 3)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in outs]
    digests = {out.strip() for out, _ in outs}
    assert len(digests) == 1 and len(digests.pop()) == 64


# ---------------------------------------------------------------------------------------------------------
# seqis.lab.fixed


FUNCTIONS = {"sigmoid": torch.sigmoid, "logsigmoid": F.logsigmoid, "exp": torch.exp, "log": torch.log,
             "log1p": torch.log1p}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_pointwise_gives_each_element_what_it_gets_alone(name, dtype):
    fn = FUNCTIONS[name]
    g = torch.Generator().manual_seed(0)
    x = torch.randn(70007, generator=g, dtype=dtype) * 6  # over 32,768: torch would split it between threads
    if name in ("log", "log1p"):
        x = x.abs()
    got = pointwise(fn, x)
    assert got.shape == x.shape and got.dtype == x.dtype
    one_by_one = torch.cat([fn(x[i : i + 1]) for i in range(0, 70007, 97)])  # a 1-element tensor: the scalar loop
    assert torch.equal(got[::97], one_by_one)
    for n in (1, 15, 16, 33, 1000):  # where the tensor ends does not matter
        assert torch.equal(pointwise(fn, x[:n]), got[:n])
    assert torch.equal(pointwise(fn, x.view(-1, 7)[:, 2:5]), got.view(-1, 7)[:, 2:5])  # nor its strides


@pytest.mark.parametrize("threads", [1, 2, 3, 4, 16])
@pytest.mark.parametrize("width", [1, 7, 24, 64, 100, 511, 512, 513, 4096])
def test_row_blocks_leave_no_scalar_tail(width, threads):
    for n in (1, 63, 64, 65, 200, 700, 1000, 3000, 20000):
        rows, blocks = row_blocks(n, width, threads)
        assert rows >= n and rows % ROW_MULTIPLE == 0
        assert blocks[0].start == 0 and blocks[-1].stop == rows
        assert all(a.stop == b.start for a, b in zip(blocks, blocks[1:]))
        for b in blocks:
            size = (b.stop - b.start) * width
            one_thread = size <= SERIAL_ELEMENTS
            # torch's parallel_for: min(threads, ceil(size / 32768)) threads, ceil(size / that) elements each
            parts = min(threads, -(-size // SERIAL_ELEMENTS))
            share = -(-size // parts)
            equal_shares = parts == threads and share * parts == size and share % (ROW_MULTIPLE * width) == 0
            assert (b.stop - b.start) % ROW_MULTIPLE == 0 and (one_thread or equal_shares), (n, b)
        assert rows - n < ROW_MULTIPLE * threads  # padding stays small


def test_a_policy_alone_gets_the_bits_it_gets_in_a_batch():
    # the count distribution's tree and J: no FFT, no matrix product, whose order depends on the batch
    g = torch.Generator().manual_seed(3)
    for H, R in ((24, 12), (100, 33), (257, 5)):
        p = torch.rand(R, H, generator=g, dtype=torch.float64) * 0.98 + 0.01
        f = torch.rand(H + 1, generator=g, dtype=torch.float64)
        J, dJdp = value_and_gradient(p, f)
        for r in range(R):
            J1, g1 = value_and_gradient(p[r : r + 1], f)
            assert torch.equal(J1[0], J[r]) and torch.equal(g1[0], dJdp[r])


def test_the_capability_runs_look_in_every_file_with_a_reproducibility_test():
    marked = {f"tests/{p.name}" for p in (ROOT / "tests").glob("test_*.py")
              if p.name != Path(__file__).name and "mark.reproducibility" in p.read_text()}
    assert marked == set(FILES)
