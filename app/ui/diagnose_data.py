"""The Diagnose page's cached bridge: a batch's findings, token tables and correction fractions, keyed on the
batch's Source (small and hashable), returned as plain data (Findings, DataFrames, figures)."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import plotly.graph_objects as go
import streamlit as st
import torch

from seqis import ESTIMATORS, Finding, diagnose, run_many
from seqis.fast import Ratios
from seqis.sampler_faults import TinyLMFaultConfig
from seqis.summaries import band_shares, correction_fractions, ratio_quantiles
from seqis.token_tables import rollout_tokens, sample_tokens, worst_rollout, worst_tokens

from . import diagnose_charts as charts
from .explore_data import HASH, Source, load_batch

# the tiny transformer's sampler faults offered as demos: label -> the config's overrides
FAULTS = {
    "top-p 0.9 in the sampler": dict(top_p=0.9),
    "top-k 20 in the sampler": dict(top_k=20),
    "sampler at temperature 0.7": dict(temperature=0.7),
    "sampler at temperature 1.25": dict(temperature=1.25),
    "log-probs one position late": dict(shift=1),
    "kernel bug on one token": dict(bug_rate=0.005),
    "clean bf16 sampler": dict(),
    "clean fp16 sampler": dict(sampler_dtype="fp16"),
}
HASH = {**HASH, TinyLMFaultConfig: repr}


def fault_source(label: str, seed: int) -> Source:
    return Source("synthetic", "tiny_lm", TinyLMFaultConfig(**FAULTS[label]), seed)


@dataclass(frozen=True)
class Diagnosis:
    """Everything the page draws for one batch (and one `by` column)."""

    findings: tuple[Finding, ...]
    shift: int  # the re-alignment diagnose applied (0 unless it found the log-probs misaligned)
    points: pd.DataFrame  # an even sample of loss tokens (seqis.token_tables.sample_tokens)
    worst: pd.DataFrame  # the worst tokens
    rollout: int  # the rollout holding the worst token
    rollout_tokens: pd.DataFrame
    metadata_columns: tuple[str, ...]  # columns a `by` may group on (few distinct values)


@st.cache_resource(max_entries=8, show_spinner="Diagnosing...", hash_funcs=HASH)
def diagnosis(src: Source, by: str | None, _payload: bytes | None = None) -> Diagnosis:
    batch = load_batch(src, _payload)
    findings = diagnose(batch, by=by)
    shift = next((f.evidence["shift"] for f in findings if f.kind == "token_misalignment" and f.group is None), 0)
    j = worst_rollout(batch, shift)
    groupable = tuple(k for k, v in batch.metadata.items() if 1 < len(set(map(str, v))) <= 32)
    return Diagnosis(tuple(findings), shift, sample_tokens(batch, shift), worst_tokens(batch, shift), j,
                     rollout_tokens(batch, j, shift), groupable)


# the chart that proves each kind of finding, from the page's token tables and the finding's evidence
FIGURES = {
    "temperature_mismatch": lambda d, f: charts.temperature_figure(d.points, f.evidence),
    "sampler_truncation": lambda d, f: charts.truncation_figure(d.points, f.evidence),
    "token_misalignment": lambda d, f: charts.misalignment_figure(f.evidence),
    "precision_noise": lambda d, f: charts.precision_figure(d.points, f.evidence),
    "catastrophic_tokens": lambda d, f: charts.catastrophic_figure(d.points, d.worst),
    "healthy": lambda d, f: charts.histogram_figure(d.points),
}


def figure(d: Diagnosis, f: Finding) -> go.Figure | None:
    """The chart that proves a finding (None for a kind without one)."""
    build = FIGURES.get(f.kind)
    return build(d, f) if build is not None else None


def _corrections() -> list[str]:
    try:
        from seqis import PRESETS
    except ImportError:
        return list(ESTIMATORS)
    return list(ESTIMATORS) + list(PRESETS)


@dataclass(frozen=True)
class RatioTables:
    quantiles: pd.DataFrame  # quantiles of l and rho before any correction
    bands: pd.DataFrame  # share of tokens outside common token bands
    corrections: pd.DataFrame  # per estimator / preset: truncated and masked, token and rollout level


@st.cache_resource(max_entries=4, show_spinner="Running every correction...", hash_funcs=HASH)
def ratio_tables(src: Source, _payload: bytes | None = None) -> RatioTables:
    batch = load_batch(src, _payload)
    r = Ratios.of(batch)
    with torch.no_grad():
        outputs = run_many(_corrections(), batch)
    return RatioTables(ratio_quantiles(r), band_shares(r), correction_fractions(outputs, r))
