"""The Diagnose page's cached bridge: a batch's findings, token tables and correction fractions, keyed on the
batch's Source (small and hashable), returned as plain data (Findings, DataFrames, figures)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import pandas as pd
import plotly.graph_objects as go
import streamlit as st
import torch

from seqis import ESTIMATORS, Finding, diagnose, run_many
from seqis.core.ratios import Ratios
from seqis.diagnosis import power as diagnose_power
from seqis.diagnosis.causes import groups, scanned_columns
from seqis.diagnosis.summaries import band_shares, correction_fractions, ratio_quantiles
from seqis.diagnosis.token_tables import rollout_gains, rollout_tokens, sample_tokens, worst_rollout, worst_tokens
from seqis.registry import runnable, skipped_note
from seqis.samplers.faults import TinyLMFaultConfig
from seqis.samplers.generators import GENERATORS

from . import diagnose_charts as charts
from .explore_data import HASH, Source, load_batch

# the sampler faults offered as demos: label -> the scenario's config (the tiny transformer's, 128 rollouts; then
# seqis.samplers.generators' recurrent LMs, which the diagnosis was not tuned on)
FAULTS = {
    "top-p 0.9 in the sampler": TinyLMFaultConfig(top_p=0.9),
    "top-k 20 in the sampler": TinyLMFaultConfig(top_k=20),
    "sampler at temperature 0.7": TinyLMFaultConfig(temperature=0.7),
    "sampler at temperature 1.25": TinyLMFaultConfig(temperature=1.25),
    "log-probs one position late": TinyLMFaultConfig(shift=1),
    "kernel bug on one token": TinyLMFaultConfig(bug_rate=0.005),
    "clean bf16 sampler": TinyLMFaultConfig(),
    "clean fp16 sampler": TinyLMFaultConfig(sampler_dtype="fp16"),
    "raw log-probs: drawn at temperature 0.8, reported raw (1k-token LM)": GENERATORS["lm_mixed1k"](temperature=0.8,
                                                                                            report="raw"),
    "top-p 0.95 on a 32k vocabulary (32k-token LM)": GENERATORS["lm_chat32k"](top_p=0.95),
    "trainer 4 steps ahead of the sampler: policy lag (4k-token LM, 256 rollouts)": GENERATORS["lm_code4k"](
        lag_steps=4, n_prompts=32),
}
HASH = {**HASH, TinyLMFaultConfig: repr, **{cls: repr for cls in GENERATORS.values()}}


def fault_source(label: str, seed: int) -> Source:
    cfg = FAULTS[label]
    return Source("synthetic", cfg.name, cfg, seed)


def fault_caption(label: str) -> str:
    """Where a demo's batch comes from, in a sentence."""
    cfg = FAULTS[label]
    if isinstance(cfg, TinyLMFaultConfig):
        return ("128 rollouts of the tiny transformer (samplers.tiny_lm) sampled through this fault and rescored by "
                "the fp32 trainer; a few seconds the first time.")
    rollouts = cfg.n_prompts * cfg.group_size
    return (f"{rollouts} rollouts of {cfg.name} (samplers.generators: a {cfg.vocab:,}-token recurrent LM the diagnosis "
            f"was not tuned on, its sampler rounding through {cfg.sampler_dtype}) sampled through this fault and "
            "rescored by the fp32 trainer; seconds to a minute the first time.")


@dataclass(frozen=True)
class Diagnosis:
    """Everything the page draws for one batch (and one `by` column)."""

    findings: tuple[Finding, ...]
    shift: int  # the re-alignment diagnose applied (0 unless it found the log-probs misaligned)
    points: pd.DataFrame  # an even sample of loss tokens (seqis.diagnosis.token_tables.sample_tokens)
    worst: pd.DataFrame  # the worst tokens
    rollout: int  # the rollout holding the worst token
    rollout_tokens: pd.DataFrame
    metadata_columns: tuple[str, ...]  # columns a `by` may group on (few distinct values)
    gains: pd.DataFrame  # per rollout: advantage and sum (rho - 1), the policy-lag test's terms
    # (column, value) of each group finding -> that group's points and gains, for its chart
    groups: dict[tuple[str, Any], tuple[pd.DataFrame, pd.DataFrame]] = field(default_factory=dict)

    def of(self, f: Finding) -> Diagnosis:
        """The tables finding f's chart reads: its group's when it is a group's, else the whole batch's."""
        got = self.groups.get((f.evidence.get("by"), f.group)) if f.group is not None else None
        return self if got is None else replace(self, points=got[0], gains=got[1])


@st.cache_resource(max_entries=8, show_spinner="Diagnosing...", hash_funcs=HASH)
def diagnosis(src: Source, by: str | None, _payload: bytes | None = None) -> Diagnosis:
    batch = load_batch(src, _payload)
    findings = diagnose(batch, by=by)
    shift = next((f.evidence["shift"] for f in findings if f.kind == "token_misalignment" and f.group is None), 0)
    j = worst_rollout(batch, shift)
    groupable = tuple(scanned_columns(batch))  # what diagnose's scan tries: 2 to 32 values
    tables = {}
    for f in findings:  # a group's finding the scan put first is drawn from its group's tokens
        if f.group is not None and "comparisons" in f.evidence and (f.evidence["by"], f.group) not in tables:
            part = batch.select(groups(batch.metadata[f.evidence["by"]])[f.group])
            tables[f.evidence["by"], f.group] = sample_tokens(part, shift), rollout_gains(part, shift)
    return Diagnosis(tuple(findings), shift, sample_tokens(batch, shift), worst_tokens(batch, shift), j,
                     rollout_tokens(batch, j, shift), groupable, rollout_gains(batch, shift), tables)


# the chart that proves each kind of finding, from the page's token tables and the finding's evidence
FIGURES = {
    "temperature_mismatch": lambda d, f: charts.temperature_figure(d.points, f.evidence),
    "sampler_truncation": lambda d, f: charts.truncation_figure(d.points, f.evidence),
    "token_misalignment": lambda d, f: charts.misalignment_figure(f.evidence),
    "precision_noise": lambda d, f: charts.precision_figure(d.points, f.evidence),
    "catastrophic_tokens": lambda d, f: charts.catastrophic_figure(d.points, d.worst),
    "raw_logprobs": lambda d, f: charts.entropy_gap_figure(d.points, f.evidence),
    "policy_lag": lambda d, f: charts.lag_figure(d.gains, f.evidence),
    "healthy": lambda d, f: charts.histogram_figure(d.points),
}


def figure(d: Diagnosis, f: Finding) -> go.Figure | None:
    """The chart that proves a finding (None for a kind without one)."""
    build = FIGURES.get(f.kind)
    return build(d.of(f), f) if build is not None else None


@st.cache_resource(max_entries=1, show_spinner=False)
def power_table() -> dict | None:
    """The committed power table (assets/bench/diagnose_power.json, written by `python -m seqis.bench --only
    diagnose-power`), read once; None when it is missing."""
    return diagnose_power.load()


def power_view(f: Finding) -> tuple[dict, float | None, int] | None:
    """What the detector behind finding f can see at its batch's size: the view of the power table, the
    finding's own estimate on that axis and its batch's loss tokens. None for a kind without a detector or
    without the table."""
    table = power_table()
    tokens = int(f.evidence.get("n_tokens", 0))
    v = diagnose_power.view(table, f.kind, tokens) if table is not None and tokens else None
    if v is None:
        return None
    key, read = diagnose_power.EVIDENCE[f.kind]
    value = f.evidence.get(key)
    return v, (read(value) if isinstance(value, (int, float)) else None), tokens


def power_figure(f: Finding) -> go.Figure | None:
    got = power_view(f)
    return charts.power_figure(*got) if got is not None else None


def power_grid(tokens: int) -> go.Figure | None:
    """Every detector's curve at the simulated size nearest a batch of `tokens` loss tokens (None without the
    table)."""
    table = power_table()
    if table is None or not tokens:
        return None
    seen = diagnose_power.views(table, tokens)
    at = _median_tokens(seen)
    return charts.power_grid_figure([("", seen)], f"What each test could have seen: at ~{at:,} tokens"
                                    f"{charts.size_note(at, tokens)}", faults=list(table["faults"]))


def _median_tokens(views: dict[str, dict]) -> int:
    toks = sorted(v["tokens"] for v in views.values() if v is not None)
    return toks[len(toks) // 2] if toks else 0


def power_summary(tokens: int) -> pd.DataFrame | None:
    """Per fault: the mildest magnitude its detector found in 90% of simulated batches near this size."""
    table = power_table()
    if table is None or not tokens:
        return None
    rows = [{"fault": name, "finding": s["kind"], "smallest found in 90%": "none simulated" if s["value"] is None
             else f"{s['knob']} = {s['value']} ({s['label']} {s['x']:.3g})", "at tokens": s["tokens"]}
            for name, s in diagnose_power.smallest_seen(table, tokens).items()]
    return pd.DataFrame(rows)


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
    skipped: str = ""  # the corrections this batch cannot run (no sampler's head), by name; "" when none


@st.cache_resource(max_entries=4, show_spinner="Running every correction...", hash_funcs=HASH)
def ratio_tables(src: Source, _payload: bytes | None = None) -> RatioTables:
    batch = load_batch(src, _payload)
    r = Ratios.of(batch)
    names, skipped = runnable(_corrections(), batch)  # a file without the sampler's head skips score centering
    with torch.no_grad():
        outputs = run_many(names, batch)
    return RatioTables(ratio_quantiles(r), band_shares(r), correction_fractions(outputs, r), skipped_note(skipped))
