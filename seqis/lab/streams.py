"""Counter-based uniforms: one random stream per seed, drawn for many seeds in one vectorised call.

A training run (estimator, lag, seed) must see the same random numbers whichever other runs share its
tensors (so a seed reproduces J exactly alone or in a sweep, whatever the memory chunking), and runs of
one seed share them across estimators and lags (common random numbers: their differences are sharper).
A `torch.Generator` per seed would need a Python loop over seeds; instead each uniform is a hash of
(seed, step, stream, element index):

    key   = mix(mix(mix(seed) ^ step) ^ stream)          per seed, tiny
    u     = mix(mix(index) ^ key) / 2^32                  per element: an xor and one mix

`mix` is Wellons' lowbias32 integer finalizer (a bijection on 32-bit words with full avalanche), computed
in int64 with the products masked to 32 bits, so CPU and CUDA give the same bits.
"""

from __future__ import annotations

import math
import zlib
from functools import lru_cache

import torch

_MASK = 0xFFFFFFFF


def mix(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 on int64 tensors holding 32-bit words (a new tensor)."""
    x = x ^ (x >> 16)
    x.mul_(0x7FEB352D).bitwise_and_(_MASK)
    x.bitwise_xor_(x >> 15)
    x.mul_(0x846CA68B).bitwise_and_(_MASK)
    return x.bitwise_xor_(x >> 16)


@lru_cache(maxsize=32)
def _index_hash(n: int, device: str) -> torch.Tensor:
    return mix(torch.arange(n, dtype=torch.int64, device=device))  # (n,)


def _stream_id(stream: str) -> int:
    return zlib.crc32(stream.encode())


class Streams:
    """Uniforms in [0, 1) for a fixed list of seeds: `uniform(step, stream, shape)` -> (n_seeds, *shape)."""

    def __init__(self, seeds, device):
        self.device = torch.device(device)
        seeds = torch.as_tensor(list(seeds), dtype=torch.int64)
        self._seed_keys = mix(seeds & _MASK ^ mix(seeds >> 32 & _MASK)).to(self.device)  # (S,)

    def uniform(self, step: int, stream: str, shape: tuple[int, ...], dtype: torch.dtype = torch.float32):
        keys = mix(mix(self._seed_keys ^ (step & _MASK)) ^ _stream_id(stream))  # (S,)
        n = math.prod(shape)
        bits = mix(_index_hash(n, str(self.device))[None, :] ^ keys[:, None])  # (S, n) 32-bit words
        if dtype == torch.float64:
            u = bits.to(torch.float64).mul_(2.0**-32)
        else:  # 24 bits: the float32 mantissa, so u < 1 exactly
            u = (bits >> 8).to(dtype).mul_(2.0**-24)
        return u.view(-1, *shape)
