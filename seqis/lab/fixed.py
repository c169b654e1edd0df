"""Arithmetic whose result for one run does not depend on the other runs that share its tensors.

A training seed must give the same J to the bit alone, in a sweep and in any memory chunking
(seqis.lab.train), on any CPU. Three things in torch's CPU kernels make a row's result depend on the rest of
its tensor, each by an ulp or so, which SGD then carries from step to step:

- BLAS and MKL's FFT choose their blocking by the whole batch (a matrix-vector product, a batched rfft with
  two threads): seqis.lab uses neither on a run's path; its sums are `.sum(-1)` over one row.
- A vectorised element-wise kernel (sigmoid, exp, log) leaves the last `numel mod 2 W` elements of a tensor
  (W the vector width: 16 floats with AVX-512) to a scalar loop whose result can differ from the vector
  code's by an ulp; so does each thread's share of a tensor over 32,768 elements. Which elements those are
  depends on how many rows the tensor has. `pointwise` runs such a function through the scalar loop for every
  element (a strided copy: torch vectorises only unit strides), so each element's result is a function of
  that element alone.
- An estimator (seqis.run, not ours to change) is a chain of such kernels. `row_blocks` pads its rows and
  cuts them into calls such that no call leaves a scalar tail, neither at its end nor at a thread's share:
  every element takes the vector path, whatever its neighbours are.

Reductions over one row (`.sum(-1)`, softmax over a row, a sum over a run's rollouts) are computed in an
order fixed by the row's length alone, whatever the other rows; that holds for torch's kernels as they are.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

SERIAL_ELEMENTS = 32768  # at::internal::GRAIN_SIZE: torch splits an element-wise op between threads above it
ROW_MULTIPLE = 64  # 2 W for the widest vectors (AVX-512, 16-bit floats): a multiple of it leaves no tail


def pointwise(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """fn(x) for an element-wise fn, every element through torch's scalar loop: each result depends on its
    element alone, not on where the tensor ends or how threads share it. About 2x the vectorised time."""
    spread = x.new_empty((*x.shape, 2))[..., 0]  # (...) inner stride 2: torch's scalar loop
    spread.copy_(x)
    return fn(spread)


def row_blocks(n: int, width: int, threads: int | None = None) -> tuple[int, list[slice]]:
    """How to hand n rows of `width` elements to a chain of element-wise kernels so that every element takes
    the vector path: (rows, blocks), rows >= n the rows to pad to and blocks slices of them, one call each.

    No element is left to a scalar tail when a call's tensor is a multiple of ROW_MULTIPLE rows and either one
    thread runs it (at most SERIAL_ELEMENTS elements, or one thread in this process) or all nt threads get
    equal shares of whole multiples of ROW_MULTIPLE rows (over (nt - 1) SERIAL_ELEMENTS elements, rows a
    multiple of nt ROW_MULTIPLE). Between the two the batch goes in blocks of at most SERIAL_ELEMENTS. Holds
    for any width and up to SERIAL_ELEMENTS rows (past that a per-row tensor is itself split between threads).
    threads: torch's intra-op thread count (default: this process's).
    """
    nt = threads or torch.get_num_threads()
    rows = -(-n // ROW_MULTIPLE) * ROW_MULTIPLE
    if rows * width <= SERIAL_ELEMENTS:
        return rows, [slice(0, rows)]
    shared = -(-n // (ROW_MULTIPLE * nt)) * ROW_MULTIPLE * nt
    if shared * width > (nt - 1) * SERIAL_ELEMENTS:  # torch uses all nt threads, each on whole row multiples
        return shared, [slice(0, shared)]
    step = SERIAL_ELEMENTS // width // ROW_MULTIPLE * ROW_MULTIPLE  # >= ROW_MULTIPLE here: width < 512
    return rows, [slice(start, min(start + step, rows)) for start in range(0, rows, step)]
