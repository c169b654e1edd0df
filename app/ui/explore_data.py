"""Explore's bridge (and Compare's): the one place these pages get what they draw and what they hand out.

A page names the batch (a Source) and the corrections it shows, as (name, config) pairs in page order; `explore`
resolves each pair into its composition once (a cache keyed on the pair) and returns an `ExploreView`. Every
figure, table, CSV and config snippet the page shows or hands out comes from that view, so a download is built
from the very state the page shows: the view's own pairs, never a second read of widget state (a download's data
is made when it is clicked, after the run, where the session's widget state cannot be read).

    batch_view, estimator_view          the batch, and one correction on it (numpy and floats)
    rollout_map_figure, token_heatmap_figure, coefficient_figure, weights_figure   figures (never mutate one)
    advice_view, tables, disagreement   the advice, the metric tables, where corrections disagree
    tables_csv, rollouts_table_csv, export   the downloads (ExploreView.csv_later: made when clicked)

Only `load_batch` and `_ratios` hold tensors (the batch itself and its log-ratios, once per batch). An upload's
bytes travel beside its Source as `_payload`, which the caches leave out of the key (the sha256 digest inside the
Source stands for them). Every section is in Streamlit's st.cache_resource (no copy on a hit; figures and views are
read-only), keyed on a Source (by its key string) and the corrections (a Shown by its name and config).
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd
import streamlit as st
import torch

from seqis import ESTIMATORS, PRESETS, diagnostics, run_many
from seqis.core.compose import Composition
from seqis.core.ratios import Ratios
from seqis.core.types import Batch, Config, Knobs
from seqis.diagnosis import fit
from seqis.diagnosis.advice import Advice, batch_facts, candidates_of, conclude, readings_over
from seqis.diagnosis.summaries import (
    dropped_map,
    effective_batch,
    effectively_kept,
    rollout_advantages,
    theory_rollouts,
    token_map,
    weight_histogram,
)
from seqis.export import EXPORTERS, Snippet, export, prime_rl_toml
from seqis.registry import About, about, entry, resolve

from . import explore_charts as charts
from .device import device
from .numbers import number

Estimators = tuple[tuple[str, Config], ...]  # (name, config) pairs, in page order
# Cache sizes: every scenario's and example's first view and Learn's presets (ui/warm.py warms them) stay in;
# a 256 x 4096 batch with its ratios is ~30 MB, an estimator's view ~3 MB.
BATCHES, VIEWS, FIGURES = 16, 128, 48
BESIDE = ("prime-rl", "verl")  # the trainers every correction's export offers, beside a preset's own
LANGUAGE = {"toml": "toml", "yaml": "yaml", "py": "python", "sh": "bash"}  # a snippet's file extension -> its code
# what the page calls the effective-batch rows: a rollout is accepted or rejected, a token kept or dropped
EFFECTIVE = {"rollouts": "rollouts (valid)", "tokens_kept": "tokens kept", "tokens_kept_frac": "tokens kept, share",
             "tokens_rejected": "tokens rejected by the rules",
             "tokens_negligible": "tokens kept by the rules, weight negligible (no gradient)",
             "rollouts_kept": "rollouts accepted", "rollouts_kept_frac": "rollouts accepted, share",
             "rollouts_negligible": "rollouts accepted by the rules, weight negligible (no gradient)", "ess": "ESS",
             "ess_frac": "ESS / rollouts", "clipped_frac": "rollouts clipped, share"}
NONNEGATIVE = ("chi2_token", "chi2_seq")  # estimates of a chi-square: below 0 is sampling noise, shown as 0


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
    def is_file(self) -> bool:
        """An upload or an example, not a scenario: Explore opens its advice at first (a scenario's compares the
        whole registry only when asked: seconds a first chart should not wait for)."""
        return self.kind != "synthetic"

    @property
    def label(self) -> str:
        if self.kind == "synthetic":
            return f"synthetic {self.name} (seed {self.seed})"
        return f"{self.kind} {self.name}"


@dataclass(frozen=True)
class Shown:
    """One correction as a page shows it: its name (a registry estimator or a preset key), its config, and what
    both resolve to (its composition; its summary, source and own framework), resolved once."""

    name: str
    config: Config
    composition: Composition = field(repr=False, compare=False)
    about: About = field(repr=False, compare=False)
    key: str = field(init=False, repr=False, compare=False, default="")  # what the caches hash

    def __post_init__(self):
        object.__setattr__(self, "key", f"{self.name}|{self.config!r}")


HASH = {Source: lambda s: s.key, Shown: lambda s: s.key, **{spec.config: repr for spec in ESTIMATORS.values()},
        **{p.estimator.config: repr for p in PRESETS.values()}}


@lru_cache(maxsize=1024)
def shown(name: str, cfg: Config) -> Shown:
    """The pair resolved: its composition and its words (once per pair: later calls are a dict lookup)."""
    return Shown(name, cfg, resolve(name, cfg), about(name))


def start(name: str) -> Shown:
    """A correction at its start values (a registry estimator's defaults, a preset's framework defaults)."""
    return shown(name, entry(name)[1])


class Named(io.BytesIO):
    """Bytes with a file name, as the loader expects of an upload."""

    def __init__(self, data: bytes, name: str):
        super().__init__(data)
        self.name = name


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def assets() -> dict[str, Path]:
    """Example batches shipped in assets/: name -> path."""
    from seqis.io import list_assets

    return {Path(p).name: Path(p) for p in list_assets()}


def source_of_file(data: bytes, name: str, kind: str = "upload", columns: dict[str, str] | None = None) -> Source:
    """A file's Source; loads it once, so a bad file raises the loader's error (BatchFormatError) here."""
    src = Source(kind, name, digest=digest(data), columns=tuple(sorted((columns or {}).items())))
    load_batch(src, _payload=data)
    return src


def _section(max_entries: int):
    """A bridge section: Streamlit's cache_resource on a Source and Shown corrections (no copy on a hit; no spinner:
    a section computes in well under a second, and a spinner costs a thread per miss)."""
    return st.cache_resource(max_entries=max_entries, show_spinner=False, hash_funcs=HASH)


@st.cache_resource(max_entries=BATCHES, show_spinner="Building the batch...", hash_funcs=HASH)
def load_batch(src: Source, _payload: bytes | None = None) -> Batch:
    """The batch a Source names, on device(), with trainer_logprobs detached."""
    if src.kind == "synthetic":
        from seqis.samplers.scenarios import make_batch

        return make_batch(src.config, seed=src.seed, device=device())
    if _payload is None:
        raise ValueError(f"{src.label}: the file's bytes are gone; upload it again")
    from seqis.io import load_batch as read_file

    return read_file(Named(_payload, src.name), columns=dict(src.columns) or None).to(device())


@_section(BATCHES)
def _ratios(src: Source, _payload: bytes | None = None) -> Ratios:
    """Log-ratios and their per-rollout sums, computed once per batch and shared by every estimator."""
    return Ratios.of(load_batch(src, _payload))


@_section(BATCHES)
def _loss_positions(src: Source, _payload: bytes | None = None) -> torch.Tensor:
    """(N,) where the batch's loss tokens sit in its flattened (B, T), row-major: x.reshape(-1)[these] is x[mask],
    without searching the mask again for each estimator's view (a boolean index over 1M positions, ~2 ms)."""
    return _ratios(src, _payload).mask.reshape(-1).nonzero().squeeze(1)


@_section(BATCHES)
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
    diagnostics: dict[str, float]  # seqis.diagnosis.statistics, as shown: a chi-square estimate below 0 shown as 0
    notes: tuple[str, ...]  # what the shown diagnostics leave out (a chi-square that came out below 0)
    offsets: np.ndarray  # (B + 1,) rollout j's loss tokens are flat[offsets[j]:offsets[j + 1]]
    positions: np.ndarray  # (N,) the position of each loss token, rollout by rollout
    log_ratio: np.ndarray  # (N,) l_t of each loss token
    token_values: np.ndarray  # (R, C) the token map: pooled log-ratio, NaN where a block has no loss token
    token_index: np.ndarray  # (R,) the rollout in each row of the token map (longest first)
    token_block: int  # positions per token-map column
    noise_s: float | None  # a valid-IS Gaussian scenario's s (its closed forms hold), else None
    facts: dict[str, float]  # what the advice reads: per-token KL, lengths, |l| tails, ESS (seqis.diagnosis.advice)

    def rollout(self, j: int) -> tuple[np.ndarray, np.ndarray]:
        """(positions, l_t) over rollout j's loss tokens."""
        a, b = self.offsets[j], self.offsets[j + 1]
        return self.positions[a:b], self.log_ratio[a:b]


def noise_scale(src: Source) -> float | None:
    """The per-token noise scale s of a valid-IS Gaussian scenario (the closed forms hold), else None."""
    if src.kind == "synthetic" and src.name == "gaussian" and src.config is not None:
        return float(src.config.s)
    return None


def shown_diagnostics(d: dict[str, float]) -> tuple[dict[str, float], tuple[str, ...]]:
    """The diagnostics as the page shows them: a chi-square estimate (mean of rho^2 - 1, or w^2 - 1) can come out
    below 0 when the true value is near 0 (sampling noise, and cancellation in the mean); it is shown as 0, and a
    note says so with the value."""
    out, notes = dict(d), []
    for k in NONNEGATIVE:
        if k in out and out[k] < 0:
            notes.append(f"{k} came out at {number(out[k])}, below 0: the estimate is noisy at this size "
                         f"(its true value is at least 0); shown as 0")
            out[k] = 0.0
    return out, tuple(notes)


@_section(BATCHES)
def batch_view(src: Source, _payload: bytes | None = None) -> BatchView:
    b = load_batch(src, _payload)
    r = _ratios(src, _payload)
    tm = _token_map(src, _payload)
    lengths = r.length.cpu().numpy()
    with torch.no_grad():
        rows, cols = torch.nonzero(r.mask, as_tuple=True)  # row-major: rollout by rollout
        flat_l = r.log_ratio[rows, cols]
    d = diagnostics(b, r)
    shown_d, notes = shown_diagnostics(d)
    return BatchView(
        shape=tuple(b.shape), lengths=lengths,
        advantages=rollout_advantages(b.advantages, r).cpu().numpy(),
        metadata=dict(b.metadata), diagnostics=shown_d, notes=notes,
        offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
        positions=cols.cpu().numpy().astype(np.int32), log_ratio=flat_l.float().cpu().numpy(),
        token_values=tm.values.float().cpu().numpy(), token_index=tm.index.cpu().numpy(), token_block=tm.block,
        noise_s=noise_scale(src), facts=batch_facts(b, r, d),
    )


# ---------------------------------------------------------------------------------------------------------
# one correction on one batch


@dataclass(frozen=True)
class EstimatorView:
    """Everything a page draws for one correction on one batch, in numpy and floats."""

    name: str
    config: Config
    metrics: dict[str, float]
    rollouts: dict[str, np.ndarray]  # length, seq_log_ratio, geo_log_ratio, weight, accepted, clipped, kept_fraction
    effective: dict[str, float]  # tokens kept, rollouts accepted, ESS (seqis.diagnosis.summaries.effective_batch)
    theory: dict[str, float]  # closed-form rollouts accepted / clipped at this batch's lengths (Gaussian scenario)
    hist: dict  # counts (HIST_BINS + 2,), dropped, underflow (seqis.diagnosis.summaries.weight_histogram)
    dropped: np.ndarray  # (R, C) fraction of each token-map block's loss tokens that is dropped
    coefficients: np.ndarray  # (N,) each loss token's gradient coefficient, flat as in BatchView
    kept: np.ndarray  # (N,) bool: each loss token keeps its gradient, flat as in BatchView


@_section(VIEWS)
def estimator_view(src: Source, c: Shown, _payload: bytes | None = None) -> EstimatorView:
    r = _ratios(src, _payload)
    with torch.no_grad():
        out = run_many([c.composition], load_batch(src, _payload), ratios=r)[c.composition]
        kept = effectively_kept(out)  # (B, T) "dropped" means no gradient: a negligible weight counts as dropped
        dropped = dropped_map(kept, r.mask, _token_map(src, _payload))
        at = _loss_positions(src, _payload)  # (N,) row-major, as BatchView's positions
        coefficients = out.weights.reshape(-1).index_select(0, at)  # (N,) = out.weights[r.mask]
        kept_flat = kept.reshape(-1).index_select(0, at)  # (N,) = kept[r.mask]
        hist = weight_histogram(out, coefficients[kept_flat])  # out.weights[kept]: kept tokens are loss tokens
        rollouts = {**out.rollouts, "accepted": out.rollouts["accepted"] & kept.any(-1)}  # no gradient: dropped
    rollouts = {k: v.float().cpu().numpy() if v.is_floating_point() else v.cpu().numpy()
                for k, v in rollouts.items()}
    s = noise_scale(src)
    return EstimatorView(
        name=c.name, config=c.config, metrics=out.scalars(), rollouts=rollouts, effective=effective_batch(out, kept),
        theory=theory_rollouts(c.composition, None, s, rollouts["length"]) if s else {},
        hist={"counts": hist["counts"].numpy(), "dropped": hist["dropped"], "underflow": hist["underflow"]},
        dropped=dropped.cpu().numpy(), coefficients=coefficients.float().cpu().numpy(),
        kept=kept_flat.cpu().numpy(),
    )


# ---------------------------------------------------------------------------------------------------------
# figures, cached by their inputs (never mutate one: it is shared)


@_section(VIEWS)
def rollout_map_figure(src: Source, c: Shown, color_by: str | None = None, _payload: bytes | None = None
                       ) -> charts.Figure:
    bv, v = batch_view(src, _payload), estimator_view(src, c, _payload)
    return charts.rollout_map(c.name, v.rollouts, charts.bands_of(c.composition), metadata=bv.metadata,
                              noise_s=bv.noise_s, color_by=color_by, height=340)


@_section(FIGURES)
def token_heatmap_figure(src: Source, c: Shown, rollout: int, _payload: bytes | None = None) -> charts.Figure:
    bv, v = batch_view(src, _payload), estimator_view(src, c, _payload)
    return charts.token_heatmap(bv.token_values, bv.token_block, bv.token_index, dropped=v.dropped,
                                dropped_label=c.name, picked=rollout, height=520,
                                extent=charts.extents(bv.offsets, bv.positions)[bv.token_index],
                                title=f"log-ratio l_t; grey: dropped by {c.name}; light grey: masked; ×: |l| > log 10")


@_section(FIGURES)
def coefficient_figure(src: Source, cs: tuple[Shown, ...], rollout: int, _payload: bytes | None = None):
    bv = batch_view(src, _payload)
    pos, l = bv.rollout(rollout)
    a, b = bv.offsets[rollout], bv.offsets[rollout + 1]
    coefs = {c.name: estimator_view(src, c, _payload).coefficients[a:b] for c in cs}
    return charts.coefficient_plot(pos, l, coefs, height=420,
                                   title=f"rollout {rollout}: T = {int(bv.lengths[rollout])}, "
                                         f"A = {number(bv.advantages[rollout], 3)}")


@_section(FIGURES)
def weights_figure(src: Source, cs: tuple[Shown, ...], _payload: bytes | None = None):
    """The applied token weights' histograms above what survives of the batch, as one figure."""
    views = {c.name: estimator_view(src, c, _payload) for c in cs}
    hist = charts.weight_histograms({n: v.hist for n, v in views.items()}, height=340,
                                    title="applied token weights (kept tokens)")
    noise = batch_view(src, _payload).noise_s
    survives = charts.effective_bars({n: v.effective for n, v in views.items()},
                                     {n: v.theory for n, v in views.items()}, height=340,
                                     title="what survives: tokens kept, rollouts accepted, ESS / rollouts"
                                           + (" (◆ theory)" if noise else ""))
    return charts.stacked(hist, survives, bottom_px=charts.survival_px(len(cs)))


@st.cache_resource(max_entries=BATCHES, hash_funcs=HASH, show_spinner="Comparing every estimator and preset...")
def _compared(src: Source, _payload: bytes | None = None):
    """The advice's default comparison, once per batch (seconds: it says so): (candidates, outliers, readings)."""
    b, r = load_batch(src, _payload), _ratios(src, _payload)
    candidates, o = candidates_of(None, (), b)[0], fit.outlying_rollouts(r)
    return candidates, o, readings_over(b, candidates, r, batch_view(src, _payload).facts, o)


@_section(FIGURES)
def advice_view(src: Source, cs: tuple[Shown, ...], _payload: bytes | None = None) -> Advice:
    """"What this means for your batch": the registry, the relevant presets and the shown corrections read against
    the batch, where to start, and what was compared; the readings listed are the shown ones and the suggestion's."""
    candidates, o, base = _compared(src, _payload)
    b, facts = load_batch(src, _payload), batch_view(src, _payload).facts
    pairs, _ = candidates_of(None, tuple((c.name, c.config) for c in cs), b)
    extra = pairs[len(candidates):]  # the shown corrections the default comparison lacks (other knobs)
    readings = base + (readings_over(b, extra, _ratios(src, _payload), facts, o) if extra else [])
    a = conclude(facts, o, pairs, False, readings)
    return a.listing([(c.name, dict(c.config.as_dict())) for c in cs])


@dataclass(frozen=True)
class Tables:
    """The numbers a page shows in its tables, unformatted (the page prints them with ui.numbers.number; the
    CSV carries them whole)."""

    metrics: pd.DataFrame  # metric x correction (prime-rl's names)
    effective: pd.DataFrame  # effective-batch row (the page's words, EFFECTIVE) x correction
    diagnostics: pd.Series  # estimator-free batch diagnostics, as shown
    notes: tuple[str, ...]  # what the shown diagnostics leave out


@_section(FIGURES)
def tables(src: Source, cs: tuple[Shown, ...], _payload: bytes | None = None) -> Tables:
    views = {c.name: estimator_view(src, c, _payload) for c in cs}
    effective = pd.DataFrame({n: v.effective for n, v in views.items()})
    bv = batch_view(src, _payload)
    return Tables(pd.DataFrame({n: v.metrics for n, v in views.items()}), effective.rename(index=EFFECTIVE),
                  pd.Series(bv.diagnostics, name="value"), bv.notes)


@dataclass(frozen=True)
class Disagreement:
    """Where the shown corrections disagree on this batch: for each ordered pair (row, column), the loss tokens the
    row keeps and the column drops, the rollouts the row accepts and the column rejects, and the tokens both keep
    whose weights differ by more than 1%; and which corrections keep each token, as patterns with their counts."""

    tokens: pd.DataFrame  # (k, k) tokens kept by the row, dropped by the column
    rollouts: pd.DataFrame  # (k, k) rollouts accepted by the row, rejected by the column
    weights: pd.DataFrame  # (k, k) tokens both keep, weights more than 1% apart (symmetric)
    patterns: pd.DataFrame  # one row per pattern: kept by, dropped by, tokens, share of the loss tokens
    n_tokens: int
    n_rollouts: int


@_section(FIGURES)
def disagreement(src: Source, cs: tuple[Shown, ...], _payload: bytes | None = None) -> Disagreement:
    views = [estimator_view(src, c, _payload) for c in cs]
    names = [c.name for c in cs]
    kept = np.stack([v.kept for v in views])  # (k, N) bool
    accepted = np.stack([v.rollouts["accepted"].astype(bool) & (v.rollouts["length"] > 0) for v in views])  # (k, B)
    w = np.stack([v.coefficients for v in views]).astype(np.float64)  # (k, N)
    # (k, k): row i keeps, column j drops (a product of 0/1 matrices over the tokens)
    k_f, a_f = kept.astype(np.float64), accepted.astype(np.float64)  # exact counts to 2^53
    tokens = np.rint(k_f @ (1 - k_f).T).astype(np.int64)
    rollouts = np.rint(a_f @ (1 - a_f).T).astype(np.int64)
    apart = np.zeros((len(names), len(names)), dtype=np.int64)
    for i in range(len(names)):  # pairs of corrections (at most 28), each vectorised over the tokens
        for j in range(i + 1, len(names)):
            scale = np.maximum(np.abs(w[i]), np.abs(w[j]))  # (N,)
            apart[i, j] = apart[j, i] = int((kept[i] & kept[j] & (np.abs(w[i] - w[j]) > 0.01 * scale)).sum())
    n = kept.shape[1]
    # which corrections keep each token: a pattern per token, counted (a k-bit code per token)
    code = (kept.astype(np.int64) << np.arange(len(names))[:, None]).sum(0)  # (N,)
    values, counts = np.unique(code, return_counts=True)
    rows = []
    for value, count in sorted(zip(values.tolist(), counts.tolist()), key=lambda x: -x[1]):
        keep = [nm for i, nm in enumerate(names) if value >> i & 1]
        drop = [nm for i, nm in enumerate(names) if not value >> i & 1]
        rows.append({"kept by": ", ".join(keep) or "none", "dropped by": ", ".join(drop) or "none",
                     "tokens": count, "share of loss tokens": count / max(n, 1)})
    frame = lambda a: pd.DataFrame(a, index=names, columns=names)  # noqa: E731
    return Disagreement(frame(tokens), frame(rollouts), frame(apart), pd.DataFrame(rows), n,
                        int(accepted.shape[1]))


# ---------------------------------------------------------------------------------------------------------
# what a page hands out: CSVs and trainer config, from the same corrections the page shows


KEY_OF = {label: key for key, label in EFFECTIVE.items()}  # an effective-batch row's words -> the library's name


def tables_csv(t: Tables) -> str:
    """Every table as one long CSV: table, estimator, name (the library's), label (the page's words), value (whole:
    the page prints it to four significant digits)."""
    effective = t.effective.stack().rename_axis(["label", "estimator"]).reset_index(name="value")
    long = pd.concat([
        t.metrics.stack().rename_axis(["name", "estimator"]).reset_index(name="value").assign(table="metric"),
        effective.assign(table="effective", name=effective["label"].map(KEY_OF)),
        t.diagnostics.rename_axis("name").reset_index().assign(table="diagnostic", estimator=""),
    ])
    long["label"] = long["label"].fillna(long["name"])
    return long[["table", "estimator", "name", "label", "value"]].to_csv(index=False)


def rollouts_table_csv(bv: BatchView, views: dict[str, EstimatorView]) -> str:
    """One row per rollout: its length, and each correction's weight, accepted and clipped."""
    cols = {f"{name}.{k}": v.rollouts[k] for name, v in views.items() for k in ("weight", "accepted", "clipped")}
    return pd.DataFrame({"rollout": range(bv.shape[0]), "length": bv.lengths, **cols}).to_csv(index=False)


@_section(VIEWS)
def export_snippet(c: Shown, framework: str) -> Snippet:
    """The trainer's settings for the correction (prime-rl: its current loss, else its older table)."""
    if framework == "prime-rl":
        return prime_rl_toml(c.name, c.config, composition=c.composition)
    return export(c.name, framework, c.config, composition=c.composition)


def language(s: Snippet) -> str:
    """The code language st.code highlights a snippet in, from its file name."""
    return LANGUAGE.get(s.filename.rsplit(".", 1)[-1], "text")


def frameworks(c: Shown) -> list[str]:
    """The trainers a correction's export offers: a preset's own framework first, then prime-rl and verl; a
    correction of no framework (the custom one) gets every trainer, each snippet saying what it cannot express
    (the list stays put while its knobs move)."""
    own = c.about.export_framework
    if own is not None and own not in EXPORTERS:
        return [f for f in EXPORTERS if f != "prime-rl-legacy"]  # prime-rl's own export falls back to it
    return [*([own] if own is not None else []), *(f for f in BESIDE if f != own)]


# ---------------------------------------------------------------------------------------------------------
# the view a page takes everything from


@dataclass(frozen=True)
class ExploreView:
    """A batch under the corrections a page shows: every section of the page, every download, from one place."""

    src: Source
    corrections: tuple[Shown, ...]
    payload: bytes | None = field(default=None, repr=False, compare=False)

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.corrections]

    def get(self, name: str) -> Shown:
        return next(c for c in self.corrections if c.name == name)

    def batch(self) -> BatchView:
        return batch_view(self.src, _payload=self.payload)

    def estimator(self, name: str) -> EstimatorView:
        return estimator_view(self.src, self.get(name), _payload=self.payload)

    def rollout_map(self, name: str, color_by: str | None = None) -> charts.Figure:
        return rollout_map_figure(self.src, self.get(name), color_by, _payload=self.payload)

    def heatmap(self, drops: str, rollout: int) -> charts.Figure:
        return token_heatmap_figure(self.src, self.get(drops), rollout, _payload=self.payload)

    def coefficients(self, rollout: int) -> charts.Figure:
        return coefficient_figure(self.src, self.corrections, rollout, _payload=self.payload)

    def weights(self) -> charts.Figure:
        return weights_figure(self.src, self.corrections, _payload=self.payload)

    def advice(self) -> Advice:
        return advice_view(self.src, self.corrections, _payload=self.payload)

    def tables(self) -> Tables:
        return tables(self.src, self.corrections, _payload=self.payload)

    def disagreement(self) -> Disagreement:
        return disagreement(self.src, self.corrections, _payload=self.payload)

    def metrics_csv(self) -> str:
        return tables_csv(self.tables())

    def rollouts_csv(self) -> str:
        return rollouts_table_csv(self.batch(), {n: self.estimator(n) for n in self.names})

    def csv_later(self) -> tuple[Callable[[], str], Callable[[], str]]:
        """(Metrics CSV, Rollouts CSV) as functions a download button calls when clicked: over the tables and
        views this run computed (no session state, no cache, after the run), so the page's moves do not write
        CSVs nobody downloads."""
        t, bv, views = self.tables(), self.batch(), {n: self.estimator(n) for n in self.names}
        return (lambda: tables_csv(t)), (lambda: rollouts_table_csv(bv, views))

    def frameworks(self, name: str) -> list[str]:
        return frameworks(self.get(name))

    def export(self, name: str, framework: str) -> Snippet:
        return export_snippet(self.get(name), framework)

    def export_pick(self, name: str | None, framework: str | None) -> tuple[str, str]:
        """The (correction, trainer) an export shows: the one asked for when it is shown and offered, else the
        first correction and its own trainer first."""
        name = name if name in self.names else self.names[0]
        offered = self.frameworks(name)
        return name, framework if framework in offered else offered[0]

    def figures(self, color_by: str | None, drops: str, rollout: int) -> dict[str, charts.Figure]:
        """Every figure the page draws, by a file name (the PNG export)."""
        out = {f"rollout_map_{c.name.replace('/', '_')}": self.rollout_map(c.name, color_by)
               for c in self.corrections}
        return {**out, "token_heatmap": self.heatmap(drops, rollout), "coefficients": self.coefficients(rollout),
                "weights": self.weights()}

    def first_screen(self) -> None:
        """Compute what the page draws on a first view (the longest rollout picked, the first correction's drops
        shaded, rollouts coloured by status): the warm-up calls it."""
        rollout = int(self.batch().lengths.argmax())
        for c in self.corrections:
            self.rollout_map(c.name)
        self.heatmap(self.names[0], rollout)
        self.coefficients(rollout)
        self.weights()
        if self.src.is_file:  # Explore shows a file's advice at first; a scenario's when its expander is opened
            self.advice()
        self.tables()
        self.export(*self.export_pick(None, None))


def explore(src: Source, picks: Estimators, payload: bytes | None = None) -> ExploreView:
    """The view of a batch under (name, config) pairs: each pair resolved once."""
    return ExploreView(src, tuple(shown(n, c) for n, c in picks), payload)
