"""Explore's cached bridge: a batch named by a small hashable `Source` in, plain data and figures out.

One cached function per page section, each keyed on small hashables (the Source, an estimator's name and frozen
config, a rollout index) and returning numpy, floats, DataFrames or a figure built from them:

    batch_view(src)                     per-batch pieces, computed once per batch: lengths, advantages,
                                        metadata, diagnostics, the token map, loss-token positions and l_t
    estimator_view(src, name, cfg)      one estimator on the batch: metrics, per-rollout values, the effective
                                        batch, weight histogram, dropped map, per-token coefficients (flat)
    rollout_map_figure, token_heatmap_figure, coefficient_figure, weights_figure (histograms and the
    effective batch, one figure), tables

Only `load_batch` and `_ratios` hold tensors (the batch itself and its log-ratios, once per batch). An upload's
bytes travel beside its Source as `_payload`, which the caches leave out of the key (the sha256 digest inside the
Source stands for them). The batch is in st.cache_resource (Diagnose shares it; a Source hashes by its key string,
a config by its repr); every other section is in a `memo.cached` LRU keyed on its (hashable) arguments: a dict
lookup, where Streamlit's generic hashing costs about a millisecond per call.
"""

from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import streamlit as st
import torch

from seqis import ESTIMATORS, PRESETS, diagnostics, run_many
from seqis.advice import Advice, batch_facts, read, suggest
from seqis.fast import Ratios
from seqis.io import BatchFormatError
from seqis.registry import resolve
from seqis.summaries import (
    dropped_map,
    effective_batch,
    rollout_advantages,
    theory_rollouts,
    token_map,
    weight_histogram,
)
from seqis.types import Batch, Config, Knobs

from . import explore_charts as charts
from .device import device
from .memo import cached

Estimators = tuple[tuple[str, Config], ...]  # (name, config) pairs, in page order
# Cache sizes: every scenario's and example's first view and Learn's presets (ui/warm.py warms them) stay in;
# a 256 x 4096 batch with its ratios is ~30 MB, an estimator's view ~3 MB.
BATCHES, VIEWS, FIGURES = 16, 128, 48


@dataclass(frozen=True)
class Source:
    """Where a batch comes from: a synthetic scenario (its config and seed), an upload or an asset (named by
    the sha256 digest of the file's bytes, and the column mapping it was read with)."""

    kind: str  # "synthetic" | "upload" | "asset"
    name: str  # scenario name, or the file's name
    config: Knobs | None = None  # the scenario's config (synthetic)
    seed: int = 0
    digest: str = ""  # sha256 of the file's bytes (upload, asset)
    columns: tuple[tuple[str, str], ...] = ()  # role -> column name in the file, for other names
    key: str = field(init=False, repr=False, compare=False, default="")  # what the caches hash

    def __post_init__(self):
        object.__setattr__(self, "key", f"{self.kind}|{self.name}|{self.seed}|{self.digest}|{self.columns}|"
                                        f"{self.config!r}")

    @property
    def label(self) -> str:
        if self.kind == "synthetic":
            return f"synthetic {self.name} (seed {self.seed})"
        return f"{self.kind} {self.name}"


HASH = {Source: lambda s: s.key, **{spec.config: repr for spec in ESTIMATORS.values()},
        **{p.estimator.config: repr for p in PRESETS.values()}}


class _Named(io.BytesIO):
    """Bytes with a file name, as the loader expects of an upload."""

    def __init__(self, data: bytes, name: str):
        super().__init__(data)
        self.name = name


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def upload_formats() -> list[str]:
    """File suffixes the loader reads (without the dot), for st.file_uploader's `type`."""
    from seqis.io.columns import FORMATS

    return sorted({f.lstrip(".") for f in FORMATS})


def assets() -> dict[str, Path]:
    """Example batches shipped in assets/: name -> path."""
    from seqis.io import list_assets

    return {Path(p).name: Path(p) for p in list_assets()}


def source_of_file(data: bytes, name: str, kind: str = "upload", columns: dict[str, str] | None = None) -> Source:
    """A file's Source; loads it once, so a bad file raises the loader's error (BatchFormatError) here."""
    src = Source(kind, name, digest=digest(data), columns=tuple(sorted((columns or {}).items())))
    load_batch(src, _payload=data)
    return src


@st.cache_data(max_entries=8, show_spinner=False)
def file_columns(file_digest: str, name: str, _data: bytes) -> list[str]:
    """The column (or array) names in a file (named by its digest), for the column-mapping control; [] when it
    cannot be read."""
    from seqis.io import column_names

    try:
        return column_names(_Named(_data, name))
    except BatchFormatError:
        return []


@st.cache_resource(max_entries=BATCHES, show_spinner="Building the batch...", hash_funcs=HASH)
def load_batch(src: Source, _payload: bytes | None = None) -> Batch:
    """The batch a Source names, on device(), with trainer_logprobs detached."""
    if src.kind == "synthetic":
        from seqis.synthetic import make_batch

        return make_batch(src.config, seed=src.seed, device=device())
    if _payload is None:
        raise ValueError(f"{src.label}: the file's bytes are gone; upload it again")
    from seqis.io import load_batch as read

    return read(_Named(_payload, src.name), columns=dict(src.columns) or None).to(device())


@cached(BATCHES)
def _ratios(src: Source, _payload: bytes | None = None) -> Ratios:
    """Log-ratios and their per-rollout sums, computed once per batch and shared by every estimator."""
    return Ratios.of(load_batch(src, _payload))


@cached(BATCHES)
def _token_map(src: Source, _payload: bytes | None = None):
    return token_map(_ratios(src, _payload))


# ---------------------------------------------------------------------------------------------------------
# the batch


@dataclass(frozen=True)
class BatchView:
    """Everything Explore draws about the batch itself, in numpy and floats (computed once per batch)."""

    shape: tuple[int, int]  # (B, T)
    lengths: np.ndarray  # (B,) loss tokens per rollout
    advantages: np.ndarray  # (B,) one advantage per rollout (the mean over its loss tokens if per token)
    metadata: dict[str, list]  # per-rollout columns (group_id, reward, ...)
    diagnostics: dict[str, float]  # seqis.diagnostics
    offsets: np.ndarray  # (B + 1,) rollout j's loss tokens are flat[offsets[j]:offsets[j + 1]]
    positions: np.ndarray  # (N,) the position of each loss token, rollout by rollout
    log_ratio: np.ndarray  # (N,) l_t of each loss token
    token_values: np.ndarray  # (R, C) the token map: pooled log-ratio, NaN where a block has no loss token
    token_index: np.ndarray  # (R,) the rollout in each row of the token map (longest first)
    token_block: int  # positions per token-map column
    noise_s: float | None  # a valid-IS Gaussian scenario's s (its closed forms hold), else None
    facts: dict[str, float]  # what the advice reads: per-token KL, lengths, |l| tails, ESS (seqis.advice)

    def rollout(self, j: int) -> tuple[np.ndarray, np.ndarray]:
        """(positions, l_t) over rollout j's loss tokens."""
        a, b = self.offsets[j], self.offsets[j + 1]
        return self.positions[a:b], self.log_ratio[a:b]


def noise_scale(src: Source) -> float | None:
    """The per-token noise scale s of a valid-IS Gaussian scenario (the closed forms hold), else None."""
    if src.kind == "synthetic" and src.name == "gaussian" and src.config is not None:
        return float(src.config.s)
    return None


@cached(BATCHES)
def batch_view(src: Source, _payload: bytes | None = None) -> BatchView:
    b = load_batch(src, _payload)
    r = _ratios(src, _payload)
    tm = _token_map(src, _payload)
    lengths = r.length.cpu().numpy()
    with torch.no_grad():
        rows, cols = torch.nonzero(r.mask, as_tuple=True)  # row-major: rollout by rollout
        flat_l = r.log_ratio[rows, cols]
    return BatchView(
        shape=tuple(b.shape), lengths=lengths,
        advantages=rollout_advantages(b.advantages, r).cpu().numpy(),
        metadata=dict(b.metadata), diagnostics=diagnostics(b, r),
        offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
        positions=cols.cpu().numpy().astype(np.int32), log_ratio=flat_l.float().cpu().numpy(),
        token_values=tm.values.float().cpu().numpy(), token_index=tm.index.cpu().numpy(), token_block=tm.block,
        noise_s=noise_scale(src), facts=batch_facts(b, r),
    )


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
    theory: dict[str, float]  # closed-form rollouts kept / clipped at this batch's lengths (Gaussian scenario)
    hist: dict  # counts (HIST_BINS + 2,), dropped, underflow (seqis.summaries.weight_histogram)
    dropped: np.ndarray  # (R, C) fraction of each token-map block's loss tokens that is dropped
    coefficients: np.ndarray  # (N,) each loss token's gradient coefficient, flat as in BatchView


@cached(VIEWS)
def estimator_view(src: Source, name: str, cfg: Config, _payload: bytes | None = None) -> EstimatorView:
    r = _ratios(src, _payload)
    with torch.no_grad():
        out = run_many([(name, cfg)], load_batch(src, _payload), ratios=r)[name]
        hist = weight_histogram(out)
        dropped = dropped_map(out.masks["kept"], r.mask, _token_map(src, _payload))
        coefficients = out.weights[r.mask]  # (N,) row-major, as BatchView's positions
    rollouts = {k: v.float().cpu().numpy() if v.is_floating_point() else v.cpu().numpy()
                for k, v in out.rollouts.items()}
    s = noise_scale(src)
    return EstimatorView(
        name=name, config=cfg, metrics=out.scalars(), rollouts=rollouts, effective=effective_batch(out),
        theory=theory_rollouts(name, cfg, s, rollouts["length"]) if s else {},
        hist={"counts": hist["counts"].numpy(), "dropped": hist["dropped"], "underflow": hist["underflow"]},
        dropped=dropped.cpu().numpy(), coefficients=coefficients.float().cpu().numpy(),
    )


# ---------------------------------------------------------------------------------------------------------
# figures, cached by their inputs (never mutate one: it is shared)


@cached(VIEWS)
def rollout_map_figure(src: Source, name: str, cfg: Config, color_by: str | None = None,
                       _payload: bytes | None = None) -> go.Figure:
    bv, v = batch_view(src, _payload), estimator_view(src, name, cfg, _payload)
    return charts.rollout_map(name, v.rollouts, charts.bands_of(resolve(name, cfg)), metadata=bv.metadata,
                              noise_s=bv.noise_s, color_by=color_by, height=340)


@cached(FIGURES)
def token_heatmap_figure(src: Source, name: str, cfg: Config, rollout: int, _payload: bytes | None = None):
    bv, v = batch_view(src, _payload), estimator_view(src, name, cfg, _payload)
    return charts.token_heatmap(bv.token_values, bv.token_block, bv.token_index, dropped=v.dropped,
                                dropped_label=name, picked=rollout, height=520,
                                title=f"log-ratio l_t; grey: tokens whose gradient {name} drops")


@cached(FIGURES)
def coefficient_figure(src: Source, ests: Estimators, rollout: int, _payload: bytes | None = None):
    bv = batch_view(src, _payload)
    pos, l = bv.rollout(rollout)
    a, b = bv.offsets[rollout], bv.offsets[rollout + 1]
    coefs = {n: estimator_view(src, n, c, _payload).coefficients[a:b] for n, c in ests}
    return charts.coefficient_plot(pos, l, coefs, height=420,
                                   title=f"rollout {rollout}: T = {int(bv.lengths[rollout])}, "
                                         f"A = {bv.advantages[rollout]:.3g}")


@cached(FIGURES)
def weights_figure(src: Source, ests: Estimators, _payload: bytes | None = None):
    """The applied token weights' histograms above what survives of the batch, as one figure."""
    views = {n: estimator_view(src, n, c, _payload) for n, c in ests}
    hist = charts.weight_histograms({n: v.hist for n, v in views.items()}, height=340,
                                    title="applied token weights (kept tokens)")
    noise = batch_view(src, _payload).noise_s
    survives = charts.effective_bars({n: v.effective for n, v in views.items()},
                                     {n: v.theory for n, v in views.items()}, height=340,
                                     title="kept: tokens, rollouts, ESS / rollouts" + (" (◆ theory)" if noise else ""))
    return charts.stacked(hist, survives)


@cached(FIGURES)
def advice_view(src: Source, ests: Estimators, _payload: bytes | None = None) -> Advice:
    """"What this means for your batch": each shown estimator read against the batch, and where to start."""
    facts = batch_view(src, _payload).facts
    readings = [read(n, resolve(n, c), estimator_view(src, n, c, _payload).effective, facts)
                for n, c in ests]
    return suggest(facts, readings, {n: dict(c.as_dict()) for n, c in ests})


@dataclass(frozen=True)
class Tables:
    metrics: pd.DataFrame  # metric x estimator
    effective: pd.DataFrame  # effective-batch quantity x estimator
    diagnostics: pd.Series  # estimator-free batch diagnostics


@cached(FIGURES)
def tables(src: Source, ests: Estimators, _payload: bytes | None = None) -> Tables:
    views = {n: estimator_view(src, n, c, _payload) for n, c in ests}
    return Tables(pd.DataFrame({n: v.metrics for n, v in views.items()}),
                  pd.DataFrame({n: v.effective for n, v in views.items()}),
                  pd.Series(batch_view(src, _payload).diagnostics, name="value"))


def metrics_csv(src: Source, ests: Estimators, _payload: bytes | None = None) -> str:
    """Every table as one long CSV: table, estimator, name, value."""
    t = tables(src, ests, _payload)
    long = pd.concat([
        t.metrics.stack().rename_axis(["name", "estimator"]).reset_index(name="value").assign(table="metric"),
        t.effective.stack().rename_axis(["name", "estimator"]).reset_index(name="value").assign(table="effective"),
        t.diagnostics.rename_axis("name").reset_index().assign(table="diagnostic", estimator=""),
    ])[["table", "estimator", "name", "value"]]
    return long.to_csv(index=False)


def rollouts_csv(src: Source, ests: Estimators, _payload: bytes | None = None) -> str:
    """One row per rollout: its length, and each estimator's weight, accepted and clipped."""
    bv = batch_view(src, _payload)
    cols = {f"{n}.{k}": estimator_view(src, n, c, _payload).rollouts[k] for n, c in ests
            for k in ("weight", "accepted", "clipped")}
    return pd.DataFrame({"rollout": range(bv.shape[0]), "length": bv.lengths, **cols}).to_csv(index=False)
