"""Cached bridges between the pages and the library: small hashable arguments in, results out.

st.cache_data cannot hash tensors (and samples large arrays): every cached function here is keyed
on names, frozen configs, seeds or a file's digest, and bounds its cache. A batch is named by a
`Source` (a frozen, hashable description); an upload's bytes travel beside it as `_payload`, which
Streamlit leaves out of the cache key (the digest inside the Source stands for them).
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import streamlit as st
import torch

from seqis import ESTIMATORS, diagnostics, run_many
from seqis.estimators import Ratios
from seqis.summaries import (
    TokenMap,
    dropped_map,
    effective_batch,
    rollout_advantages,
    rollout_row,
    theory_rollouts,
    token_map,
    weight_histogram,
)
from seqis.types import Batch, Config, Knobs

# ---------------------------------------------------------------------------------------------------------
# the device


@st.cache_resource
def device() -> torch.device:
    """CUDA when present, else CPU: every batch and Monte Carlo run of the explorer lives here."""
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def device_label() -> str:
    d = device()
    if d.type == "cuda":
        return f"CUDA ({torch.cuda.get_device_name(d)})"
    return f"CPU ({torch.get_num_threads()} threads)"


# ---------------------------------------------------------------------------------------------------------
# batches

# Cache keys hash a Source by its key string and a config by its repr (class name and every knob):
# a few microseconds, where Streamlit's generic object hashing takes a millisecond per call.


@dataclass(frozen=True)
class Source:
    """Where a batch comes from: a synthetic scenario (its config and seed), an upload or an asset
    (named by the sha256 digest of the file's bytes)."""

    kind: str  # "synthetic" | "upload" | "asset"
    name: str  # scenario name, or the file's name
    config: Knobs | None = None  # the scenario's config (synthetic)
    seed: int = 0
    digest: str = ""  # sha256 of the file's bytes (upload, asset)
    key: str = field(init=False, repr=False, compare=False, default="")  # what the caches hash

    def __post_init__(self):
        object.__setattr__(self, "key", f"{self.kind}|{self.name}|{self.seed}|{self.digest}|{self.config!r}")

    @property
    def label(self) -> str:
        if self.kind == "synthetic":
            return f"synthetic {self.name} (seed {self.seed})"
        return f"{self.kind} {self.name}"


HASH = {Source: lambda s: s.key, **{spec.config: repr for spec in ESTIMATORS.values()}}


class _Named(io.BytesIO):
    """Bytes with a file name, as the loader expects of an upload."""

    def __init__(self, data: bytes, name: str):
        super().__init__(data)
        self.name = name


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _io():
    from seqis import io as seqis_io  # the loaders, imported when first needed

    return seqis_io


def upload_formats() -> list[str]:
    """File suffixes the loader reads (without the dot), for st.file_uploader's `type`."""
    try:
        return sorted({f.lstrip(".") for f in _io().FORMATS})
    except (ImportError, AttributeError):
        return ["parquet", "jsonl", "json", "npz", "safetensors", "pt"]


def assets() -> dict[str, Path]:
    """Example batches shipped in assets/: name -> path."""
    try:
        found = _io().list_assets()
    except (ImportError, AttributeError):
        return {}
    paths = [Path(p) for p in found]
    return {p.name: p for p in paths}


def source_of_file(data: bytes, name: str, kind: str = "upload") -> Source:
    """A file's Source; loads it once, so a bad file raises the loader's error (BatchFormatError) here."""
    src = Source(kind, name, digest=digest(data))
    load_batch(src, _payload=data)
    return src


@st.cache_resource(max_entries=4, show_spinner="Building the batch...", hash_funcs=HASH)
def load_batch(src: Source, _payload: bytes | None = None) -> Batch:
    """The batch a Source names, on device(), with trainer_logprobs detached."""
    if src.kind == "synthetic":
        from seqis.synthetic import make_batch

        return make_batch(src.config, seed=src.seed, device=device())
    if _payload is None:
        raise ValueError(f"{src.label}: the file's bytes are gone; load it again")
    batch = _io().load_batch(_Named(_payload, src.name))
    return batch.to(device())


@st.cache_resource(max_entries=4, hash_funcs=HASH)
def ratios(src: Source, _payload: bytes | None = None) -> Ratios:
    """Log-ratios and their per-rollout sums, computed once per batch and shared by every estimator."""
    return Ratios.of(load_batch(src, _payload))


@st.cache_resource(max_entries=8, hash_funcs=HASH)
def batch_diagnostics(src: Source, _payload: bytes | None = None) -> dict[str, float]:
    return diagnostics(load_batch(src, _payload), ratios(src, _payload))


@dataclass(frozen=True)
class TokenMapView:
    values: np.ndarray  # (R, C) pooled log-ratio, NaN where a block has no loss token
    index: np.ndarray  # (R,) the rollout in each row (longest first)
    block: int
    shape: tuple[int, int]  # the batch's (B, T)

    @property
    def rows(self) -> int:
        return self.values.shape[0]


@st.cache_resource(max_entries=4, hash_funcs=HASH)
def _token_map(src: Source, _payload: bytes | None = None) -> TokenMap:
    return token_map(ratios(src, _payload))


@st.cache_resource(max_entries=4, hash_funcs=HASH)
def token_map_view(src: Source, _payload: bytes | None = None) -> TokenMapView:
    tm = _token_map(src, _payload)
    return TokenMapView(tm.values.float().cpu().numpy(), tm.index.cpu().numpy(), tm.block,
                        load_batch(src, _payload).shape)


@dataclass(frozen=True)
class RolloutInfo:
    """Per-rollout columns for hovers and the rollout picker."""

    metadata: dict[str, list]
    lengths: np.ndarray  # (B,) loss tokens
    advantages: np.ndarray  # (B,) the rollout's advantage (mean over its loss tokens for per-token advantages)


@st.cache_resource(max_entries=4, hash_funcs=HASH)
def rollout_info(src: Source, _payload: bytes | None = None) -> RolloutInfo:
    b = load_batch(src, _payload)
    r = ratios(src, _payload)
    return RolloutInfo(dict(b.metadata), r.length.cpu().numpy(), rollout_advantages(b.advantages, r).cpu().numpy())


def rollout_log_ratio(src: Source, j: int, _payload: bytes | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(positions, l_t) over rollout j's loss tokens."""
    r = ratios(src, _payload)
    pos, l = rollout_row(r.log_ratio, r.mask, j)
    return pos.cpu().numpy(), l.float().cpu().numpy()


# ---------------------------------------------------------------------------------------------------------
# figures


@st.cache_resource(max_entries=64, hash_funcs=HASH)
def figure(key: tuple, _build: Callable[[], Any]) -> Any:
    """A chart built once per key (small hashables: the kind, the Source, an estimator's name and config):
    after one slider moves, only the charts that depend on it are rebuilt. Never mutate the result."""
    return _build()


# ---------------------------------------------------------------------------------------------------------
# one estimator on one batch


@dataclass(frozen=True)
class EstimatorView:
    """Everything the Explore page draws for one estimator on one batch, in numpy and floats."""

    name: str
    config: Config
    metrics: dict[str, float]
    rollouts: dict[str, np.ndarray]  # length, seq_log_ratio, geo_log_ratio, weight, accepted, clipped, kept_fraction
    effective: dict[str, float]  # tokens / rollouts kept, ESS (seqis.summaries.effective_batch)
    hist: dict  # counts (HIST_BINS + 2,), dropped, underflow (seqis.summaries.weight_histogram)
    dropped: np.ndarray  # (R, C) fraction of each token-map block's loss tokens that is dropped
    weights: torch.Tensor = field(repr=False)  # (B, T) gradient coefficients, on device
    loss_mask: torch.Tensor = field(repr=False)  # (B, T) the batch's loss mask

    def coefficients(self, j: int) -> np.ndarray:
        """Rollout j's per-token gradient coefficient on its loss tokens (in position order)."""
        return rollout_row(self.weights, self.loss_mask, j)[1].float().cpu().numpy()


@st.cache_resource(max_entries=16, hash_funcs=HASH)
def estimator_view(src: Source, name: str, cfg: Config, _payload: bytes | None = None) -> EstimatorView:
    r = ratios(src, _payload)
    with torch.no_grad():
        out = run_many([(name, cfg)], load_batch(src, _payload), ratios=r)[name]
        hist = weight_histogram(out)
        dropped = dropped_map(out.masks["kept"], r.mask, _token_map(src, _payload))
    rollouts = {k: v.float().cpu().numpy() if v.is_floating_point() else v.cpu().numpy()
                for k, v in out.rollouts.items()}
    return EstimatorView(
        name=name,
        config=cfg,
        metrics=out.scalars(),
        rollouts=rollouts,
        effective=effective_batch(out),
        hist={"counts": hist["counts"].numpy(), "dropped": hist["dropped"], "underflow": hist["underflow"]},
        dropped=dropped.cpu().numpy(),
        weights=out.weights,
        loss_mask=r.mask,
    )


def noise_scale(src: Source) -> float | None:
    """The per-token noise scale s of a valid-IS Gaussian scenario (the closed forms hold), else None."""
    if src.kind == "synthetic" and src.name == "gaussian" and src.config is not None:
        return float(src.config.s)
    return None


def theory(src: Source, view: EstimatorView) -> dict[str, float]:
    """Closed-form acceptance / clipping for this estimator on this batch's lengths (Gaussian scenario)."""
    s = noise_scale(src)
    if s is None or s <= 0:
        return {}
    return theory_rollouts(view.name, view.config, s, view.rollouts["length"])
