"""Plotly figures for the Training page: learning curves with a band over seeds, the diagnostics over
updates, and the sweeps as small multiples beside Huang's published points. No streamlit, no tensors."""

from __future__ import annotations

import math

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from seqis.lab.huang2026 import ESTIMATOR_OF

from .style import column_colors, two_lines

DASHED = {"GeoMean IS"}
_MARGIN = dict(l=10, r=10, t=50, b=10)


def colors(labels) -> dict[str, str]:
    """A colour per label from the explorer's one palette: Huang's labels take the colour of the registry estimator
    each runs (Token IS token_tis's, GeoMean IS geo_is's), a registry name its own; a second label on one estimator
    (Sequence TIS 0-8 after 0-2) and a preset the palette's next free colour."""
    runs = {label: (t[0] if isinstance(t, tuple) else t) for label, t in ESTIMATOR_OF.items()}
    return column_colors(list(labels), runs)


def _rgba(hex_color: str, alpha: float) -> str:
    h = hex_color.lstrip("#")
    r, g, b = (int(h[i : i + 2], 16) for i in (0, 2, 4))
    return f"rgba({r},{g},{b},{alpha})"


def _layout(fig: go.Figure, title: str, height: int) -> go.Figure:
    """Title, height, and the legend in a row under the x-axis titles (40 px below the plot area)."""
    fig.update_layout(title=dict(text=title, x=0, xanchor="left", font=dict(size=15)), height=height,
                      margin=dict(_MARGIN, b=50), hovermode="x unified",
                      legend=dict(orientation="h", yanchor="top", y=-60 / height - 0.08, xanchor="left", x=0))
    return fig


def _band_traces(fig, df: pd.DataFrame, palette: dict, *, row=None, col=None, showlegend=True):
    where = {} if row is None else dict(row=row, col=col)
    for label, d in df.groupby("estimator", sort=False):
        c = palette[label]
        fig.add_trace(go.Scatter(x=d["update"], y=d["high"], mode="lines", line=dict(width=0), hoverinfo="skip",
                                 showlegend=False, legendgroup=label), **where)
        fig.add_trace(go.Scatter(x=d["update"], y=d["low"], mode="lines", line=dict(width=0), fill="tonexty",
                                 fillcolor=_rgba(c, 0.18), hoverinfo="skip", showlegend=False, legendgroup=label),
                      **where)
        fig.add_trace(go.Scatter(x=d["update"], y=d["mean"], mode="lines", name=label, legendgroup=label,
                                 showlegend=showlegend,
                                 line=dict(color=c, width=2.2, dash="dash" if label in DASHED else "solid"),
                                 hovertemplate=f"{label}: %{{y:.4g}}<extra></extra>"), **where)


def learning_curves(J: pd.DataFrame, *, title: str, J0: float) -> go.Figure:
    """Exact J against updates: the mean over seeds and a band from the lowest to the highest seed."""
    fig = go.Figure()
    _band_traces(fig, J, colors(J["estimator"].unique()))
    fig.add_hline(y=J0, line=dict(color="#999999", dash="dot", width=1), annotation_text="J at the start",
                  annotation_position="top left")  # above the line where every curve is still flat; below it the
                                                    # label sat on the x tick labels
    fig.update_yaxes(title="exact J = P(success)", range=[-0.02, 1.02])
    fig.update_xaxes(title="update")
    return _layout(fig, title, 440)


def diagnostics(grad_norm: pd.DataFrame, kept: pd.DataFrame, cosine: pd.DataFrame) -> go.Figure:
    """‖g‖ (log scale: a collapse is a spike), the kept fraction and cos(g, ∇J) against updates."""
    fig = make_subplots(rows=1, cols=3, horizontal_spacing=0.07,  # short titles: a third of a 900 px page each
                        subplot_titles=("‖g‖ (log; 0 left out)", "tokens kept", "cos(g, exact ∇J)"))
    fig.update_annotations(font_size=11)
    palette = colors(grad_norm["estimator"].unique())
    for col, df in enumerate((grad_norm, kept, cosine), start=1):
        _band_traces(fig, df, palette, row=1, col=col, showlegend=col == 1)
        fig.update_xaxes(title="update", row=1, col=col)
    fig.update_yaxes(type="log", row=1, col=1)
    fig.update_yaxes(range=[-0.02, 1.02], row=1, col=2)
    fig.update_yaxes(range=[-1.02, 1.02], row=1, col=3)
    fig = _layout(fig, "What drove each update", 380)
    fig.update_layout(margin_t=max(fig.layout.margin.t or 0, 84))  # the subplot titles sit under the title
    return fig


SWEEP_AXES = {"horizon": ("horizon H", True, "H"), "lag": ("lag K (updates stale)", False, "K"),
              "batch": ("batch size B", True, "B")}  # axis title, log axis, the symbol in the panel's title


def spaced_labels(ticks: list[float], *, log: bool, gap: float = 0.25) -> list[str]:
    """Tick labels with those closer than `gap` of the axis to the last labelled one left blank: a panel a third
    of a 900 px page holds about four (ten batch sizes stood on end and ran into the legend)."""
    where = [math.log10(t) if log else float(t) for t in ticks]
    span = (max(where) - min(where)) or 1.0
    out, last = [], None
    for t, w in zip(ticks, where):
        shown = last is None or w - last >= gap * span
        out.append(f"{t:g}" if shown else "")
        last = w if shown else last
    return out


def sweeps(panels: dict[str, dict]) -> go.Figure:
    """Small multiples: our final J (mean ± 2 s.e. over seeds) per sweep on the top row, Huang's published
    J at step 7,000 below, one column per sweep (only Huang's row while ours are not run)."""
    whats = [w for w in SWEEP_AXES if w in panels]
    have_ours = any(not panels[w]["ours"].empty for w in whats)
    pub_row = 2 if have_ours else 1
    # panel titles short enough for a third of a 900 px page (the axis titles below say what is swept)
    titles = ([f"ours: J vs {SWEEP_AXES[w][2]}" for w in whats] if have_ours else []) + [
        f"Huang 2026: J vs {SWEEP_AXES[w][2]}" for w in whats]
    fig = make_subplots(rows=pub_row, cols=len(whats), subplot_titles=titles, vertical_spacing=0.16,
                        horizontal_spacing=0.06)
    fig.update_annotations(font_size=12)
    labels = [e for w in whats for part in ("ours", "published") for e in panels[w][part]["estimator"].unique()]
    palette, seen = colors(dict.fromkeys(labels)), set()
    for col, what in enumerate(whats, start=1):
        ours, pub = panels[what]["ours"], panels[what]["published"]
        for label, d in ours.groupby("estimator", sort=False):
            dash = "dash" if label in DASHED else "solid"
            fig.add_trace(go.Scatter(x=d["x"], y=d["mean"], mode="lines+markers", name=label, legendgroup=label,
                                     showlegend=label not in seen, line=dict(color=palette[label], dash=dash),
                                     error_y=dict(type="data", array=2 * d["sem"], visible=True),
                                     hovertemplate=f"{label}: %{{y:.3f}} at %{{x}}<extra></extra>"), row=1, col=col)
            seen.add(label)
        for label, d in pub.groupby("estimator", sort=False):
            line = dict(color=palette[label], dash="dash" if label in DASHED else "solid")
            fig.add_trace(go.Scatter(x=d["x"], y=d["J"], mode="lines+markers", name=label, legendgroup=label,
                                     showlegend=label not in seen, line=line,
                                     hovertemplate=f"{label} (published): %{{y:.4f}} at %{{x}}<extra></extra>"),
                          row=pub_row, col=col)
            seen.add(label)
        rows = ((1, ours["x"]), (2, pub["x"])) if have_ours else ((1, pub["x"]),)
        for row, xs in rows:  # ticks at the swept values themselves
            ticks = sorted(set(xs.tolist()))
            fig.update_xaxes(title=SWEEP_AXES[what][0], type="log" if SWEEP_AXES[what][1] else "linear",
                             tickvals=ticks, ticktext=spaced_labels(ticks, log=SWEEP_AXES[what][1]), tickangle=0,
                             row=row, col=col)
            fig.update_yaxes(range=[-0.02, 1.02], row=row, col=col)
    title = ("Huang's sweeps: final J, ours at CPU scale (top) and published (bottom)" if have_ours
             else "Huang's sweeps as published: final J after 7,000 updates (H = 1024, lag 500 unless swept)")
    fig = _layout(fig, title, 660 if have_ours else 380)
    head, _ = two_lines(title)  # on two lines: one is cut at 900 px
    fig.update_layout(title=dict(head, font=dict(size=15)), hovermode="closest", margin=dict(_MARGIN, t=104, b=50))
    return fig
