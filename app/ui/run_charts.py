"""The Run page's figures, from a scan table (seqis.runs.scan): timelines of a mismatch metric and of each
correction's dropped fraction, per group, incidents marked. Plain plotly; no streamlit here."""

from __future__ import annotations

import math
from functools import reduce

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from seqis.diagnosis.trend import WINDOW, Z_ALARM, metric_z

from .style import EXTRA, PALETTE, STATUS_COLORS, base_layout

WHOLE_STEP = "whole step"  # the legend name of the rows with no group
SEVERITY_COLORS = {"bad": STATUS_COLORS["dropped"], "warn": STATUS_COLORS["clipped"], "outlier": EXTRA[1]}
WHOLE_STEP_COLOR = EXTRA[0]
LOG_METRICS = {"kl_k1", "kl_k3", "chi2_token", "chi2_seq", "abs_log_ratio_p50", "abs_log_ratio_p99",
               "abs_log_ratio_max"}


def _pairs(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (step, group), in step order, the group named (the whole step as WHOLE_STEP)."""
    pairs = df.drop_duplicates(["step", "group"]).sort_values("step", kind="stable")
    return pairs.assign(name=pairs["group"].fillna(WHOLE_STEP).astype(str))


GRID_MAX = 10  # a stride grid is drawn only when it has at most this many times the steps read


def step_grid(df: pd.DataFrame) -> list[int]:
    """The steps a timeline spans: those read, and the ones between them on the run's stride that are missing
    (steps 0, 1, 2, 4: step 3 is missing; 0, 10, 20: none is). A missing step is a gap in every line."""
    steps = sorted(int(x) for x in df["step"].unique())
    if len(steps) < 3:
        return steps
    stride = reduce(math.gcd, (b - a for a, b in zip(steps, steps[1:])))
    n = (steps[-1] - steps[0]) // max(stride, 1) + 1
    return list(range(steps[0], steps[-1] + 1, stride)) if stride > 0 and n <= GRID_MAX * len(steps) else steps


def on_grid(rows: pd.DataFrame, grid: list[int], columns: list[str]) -> pd.DataFrame:
    """One group's rows reindexed on the step grid: NaN at a step it lacks (plotly breaks the line there)."""
    part = rows.drop_duplicates("step").set_index("step")[columns]
    return part.reindex(grid).rename_axis("step").reset_index()


def _group_colors(df: pd.DataFrame) -> dict[str, str]:
    """One colour per group, the same in every chart of a scan."""
    names = sorted(n for n in _pairs(df)["name"].unique() if n != WHOLE_STEP)
    return {WHOLE_STEP: WHOLE_STEP_COLOR, **{n: PALETTE[i % len(PALETTE)] for i, n in enumerate(names)}}


def _layout(fig: go.Figure, height: int, title: str) -> go.Figure:
    fig.update_layout(**base_layout(height=height, title=title), hovermode="closest", clickmode="event+select")
    fig.update_xaxes(title_text="step", zeroline=False)
    fig.update_yaxes(zeroline=False)
    return fig


def mismatch_timeline(df: pd.DataFrame, metric: str, incidents: pd.DataFrame | None = None, *,
                      new: pd.Series | None = None, height: int = 380) -> go.Figure:
    """`metric` (a diagnostics column) over steps, a line per group, the whole step dashed; incidents as
    large markers coloured by severity, the steps of those `new` marks (a bool per incident row: landed while
    the page followed the run) ruled and labelled "new". Each point carries its step as customdata (for
    click-to-open)."""
    pairs = _pairs(df)
    colors = _group_colors(df)
    grid = step_grid(df)
    fig = go.Figure()
    for name, rows in pairs.groupby("name", sort=True):
        whole = name == WHOLE_STEP
        rows = on_grid(rows, grid, [metric])
        fig.add_trace(go.Scatter(
            x=rows["step"], y=rows[metric], name=name, mode="lines+markers", customdata=rows["step"],
            line=dict(width=1.5, dash="dash" if whole else "solid", color=colors[name]),
            marker=dict(size=6), hovertemplate=f"step %{{x}}<br>{name}<br>{metric} %{{y:.4g}}<extra></extra>"))
    if incidents is not None and not incidents.empty:
        severity = [r.split(":")[0] if r.split(":")[0] in SEVERITY_COLORS else "outlier" for r in incidents["reason"]]
        fig.add_trace(go.Scatter(
            x=incidents["step"], y=incidents[metric], name="incident", mode="markers", customdata=incidents["step"],
            marker=dict(size=16, symbol="circle-open", line=dict(width=3),
                        color=[SEVERITY_COLORS[s] for s in severity]),
            text=[f"{g if isinstance(g, str) else WHOLE_STEP}: {r}" for g, r in zip(incidents["group"],
                                                                                     incidents["reason"])],
            hovertemplate="step %{x}<br>%{text}<extra></extra>"))
        fresh = incidents[new.reindex(incidents.index, fill_value=False)] if new is not None else incidents.iloc[:0]
        for step in sorted(set(fresh["step"])):  # a dotted rule at each new incident's step, "new" above the plot
            fig.add_vline(x=step, line=dict(color=SEVERITY_COLORS["bad"], width=1, dash="dot"),
                          annotation=dict(text="new", font=dict(color=SEVERITY_COLORS["bad"], size=12)),
                          annotation_position="top", annotation_yanchor="bottom")
    _layout(fig, height, f"{metric} per step")
    fig.update_yaxes(title_text=metric, type="log" if metric in LOG_METRICS and (pairs[metric] > 0).all() else None)
    return fig


def dropped_timelines(df: pd.DataFrame, estimators: list[str], *, height_each: int = 170) -> go.Figure:
    """For each estimator, the fraction of loss tokens it drops at each step, a line per group."""
    estimators = [e for e in estimators if e in set(df["estimator"])]
    panels = max(len(estimators), 1)
    height = 80 + height_each * panels
    # the gap between panels: 6% of a few panels' height, at most 45 px (a fixed fraction of a hundred panels'
    # height is more than plotly allows: found by the random browser session, every correction picked)
    fig = make_subplots(rows=panels, cols=1, shared_xaxes=True, vertical_spacing=min(0.06, 45 / height),
                        subplot_titles=estimators or ["no estimator in this scan"])
    fig.update_annotations(font_size=13)  # the panel titles a size under the chart's title
    colors, grid = _group_colors(df), step_grid(df)
    for i, est in enumerate(estimators, start=1):
        rows = df[df["estimator"] == est].sort_values("step", kind="stable")
        rows = rows.assign(name=rows["group"].fillna(WHOLE_STEP).astype(str))
        for name, part in rows.groupby("name", sort=True):
            whole = name == WHOLE_STEP
            part = on_grid(part, grid, ["dropped"])
            fig.add_trace(go.Scatter(
                x=part["step"], y=part["dropped"], name=name, legendgroup=name, showlegend=i == 1,
                mode="lines+markers", customdata=part["step"], marker=dict(size=5),
                line=dict(width=1.5, dash="dash" if whole else "solid", color=colors[name]),
                hovertemplate=f"{est}<br>step %{{x}}<br>{name}: %{{y:.1%}} dropped<extra></extra>"), row=i, col=1)
        fig.update_yaxes(range=[-0.03, 1.03], tickformat=".0%", row=i, col=1)
    _layout(fig, height, "fraction of loss tokens dropped, per correction")
    # one shared x axis: its title under the last panel only (under each, it ran into the next panel's title),
    # the legend under it at a fixed distance (a fraction of a tall chart left a gap of 200 px)
    fig.update_xaxes(title_text=None)
    fig.update_xaxes(title_text="step", row=panels, col=1)
    plot_px = height - fig.layout.margin.t - fig.layout.margin.b
    fig.update_layout(legend_y=-64 / plot_px)
    return fig



def early_warning(df: pd.DataFrame, metric: str, *, height: int = 320) -> tuple[go.Figure, pd.DataFrame]:
    """Each group's `metric` against its own trailing WINDOW steps (seqis.diagnosis.trend): z per step, a line per
    group, the alarm line at Z_ALARM, alarms marked; and the alarms as rows (step, group, metric, z). A missing step
    is a gap, and the steps before it still count as history."""
    pairs = _pairs(df)
    colors, grid = _group_colors(df), step_grid(df)
    fig, found = go.Figure(), []
    for name, rows in pairs.groupby("name", sort=True):
        rows = on_grid(rows, grid, [metric])
        z = metric_z(metric, rows[metric].to_numpy())
        fig.add_trace(go.Scatter(
            x=rows["step"], y=z, name=name, mode="lines+markers", customdata=rows["step"],
            line=dict(width=1.5, dash="dash" if name == WHOLE_STEP else "solid", color=colors[name]),
            marker=dict(size=5), hovertemplate=f"step %{{x}}<br>{name}<br>z %{{y:.2f}}<extra></extra>"))
        hit = np.nan_to_num(z, nan=-np.inf) > Z_ALARM
        found += [(int(t), name, float(v), float(zz)) for t, v, zz in zip(rows["step"][hit], rows[metric][hit], z[hit])]
    alarms = pd.DataFrame(found, columns=["step", "group", metric, "z"]).sort_values(["step", "group"])
    if not alarms.empty:
        ring = dict(size=14, symbol="circle-open", line=dict(width=3), color=SEVERITY_COLORS["bad"])
        fig.add_trace(go.Scatter(x=alarms["step"], y=alarms["z"], name="alarm", mode="markers", marker=ring,
                                 customdata=alarms["step"],
                                 hovertemplate="step %{x}: alarm, z %{y:.2f}<extra></extra>"))
    fig.add_hline(y=Z_ALARM, line=dict(color=SEVERITY_COLORS["bad"], width=1, dash="dot"))
    _layout(fig, height, f"{metric}: each step against its last {WINDOW} steps (z)")
    fig.update_yaxes(title_text="z")
    return fig, alarms.reset_index(drop=True)
