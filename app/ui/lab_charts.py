"""Plotly figures for the Length & thresholds and Bias & variance pages.

Builders take pandas DataFrames (from seqis.theory.acceptance, seqis.theory.formulas, seqis.lab via ui/lab_data.py)
and return plotly figures; they never import streamlit and do no tensor math. Convention everywhere:
closed forms are lines, simulations are points with +-2 standard-error bars.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .style import alpha, dash, series_color, titled

MOMENT_COLORS = ("#1F77B4", "#9467BD", "#BCBD22")  # seq_tis mean, seq_tis variance, seq_mis_product mass
SE_BARS = 2.0  # error bars are +-2 standard errors


def _pow2_ticks(values: Sequence[float], step: int = 2) -> list[int]:
    """Powers of two (every `step`-th) inside the values' range: 1, 4, 16, 64, ... for step 2."""
    lo, hi = min(values), max(values)
    return [2**k for k in range(0, 17, step) if lo <= 2**k <= hi]


SYMBOLS = ("circle", "square", "diamond", "triangle-up", "cross", "triangle-down")


def lines_and_points(
    theory: pd.DataFrame | None,
    sim: pd.DataFrame | None,
    *,
    x: str,
    y: str,
    series: str,
    se: str | None = None,
    title: str = "",
    x_title: str = "",
    y_title: str = "",
    log_x: bool = True,
    log_y: bool = False,
    colors: dict[str, str] | None = None,
    order: Sequence[str] | None = None,
    height: int = 420,
) -> go.Figure:
    """Closed form (lines) against simulation (points, +-2 s.e.), one colour per value of `series`.

    `theory` and `sim` are long DataFrames with columns x, y, series (and `se` in sim). A series with
    only points (no closed form) is drawn as points; one legend entry per series.
    """
    names = list(order) if order is not None else []
    for df in (theory, sim):
        if df is not None:
            names += [n for n in df[series].unique() if n not in names]
    fig = go.Figure()
    for i, name in enumerate(names):
        c = (colors or {}).get(name) or series_color(str(name), i)
        shown = False
        if theory is not None and (t := theory[theory[series] == name]).shape[0]:
            fig.add_trace(go.Scatter(  # a dash and a symbol per series: two that coincide (pg and geo_mask where
                x=t[x], y=t[y], mode="lines", name=str(name), legendgroup=str(name),  # neither binds) both show
                line=dict(color=c, width=2, dash=dash(i)),
                hovertemplate=f"{name}<br>{x}=%{{x:.4g}}<br>closed form {y}=%{{y:.4g}}<extra></extra>",
            ))
            shown = True
        if sim is not None and (p := sim[sim[series] == name]).shape[0]:
            err = dict(type="data", array=SE_BARS * p[se], visible=True, thickness=1.2, width=3) if se else None
            fig.add_trace(go.Scatter(
                x=p[x], y=p[y], mode="markers", name=str(name), legendgroup=str(name), showlegend=not shown,
                marker=dict(color=c, size=8, symbol=SYMBOLS[i % len(SYMBOLS)], line=dict(color="white", width=1)),
                error_y=err,
                hovertemplate=f"{name}<br>{x}=%{{x:.4g}}<br>simulated {y}=%{{y:.4g}}<extra></extra>",
            ))
    if log_x:
        xs = pd.concat([d[x] for d in (theory, sim) if d is not None])
        ticks = _pow2_ticks(xs) if x == "T" and len(xs) else None
        fig.update_xaxes(type="log", tickvals=ticks if ticks else None)
    if log_y:
        fig.update_yaxes(type="log", exponentformat="power", dtick=1)
    fig.update_xaxes(title=x_title or x)
    fig.update_yaxes(title=y_title or y)
    return titled(fig, title, height=height)


def acceptance_vs_length(theory: pd.DataFrame, sim: pd.DataFrame, *, title: str, colors=None,
                         order=None) -> go.Figure:
    """Fraction of rollouts accepted vs T (log x), one series per band; columns label, T, accepted(_se)."""
    fig = lines_and_points(theory, sim, x="T", y="accepted", series="label", se="accepted_se", title=title,
                           x_title="rollout length T (loss tokens)", y_title="fraction of rollouts accepted",
                           colors=colors, order=order)
    fig.update_yaxes(range=[-0.03, 1.05], tickformat=".0%")
    return fig


def kl_cutoff(theory: pd.DataFrame, sim: pd.DataFrame, *, cutoff_kl: float, upper_kl: float | None,
              current_kl: float, title: str) -> go.Figure:
    """MIS-PO's trajectory band as a per-token KL cutoff: acceptance vs KL = s^2/2 (log x), one series per T.

    Columns: T (as the series), kl, accepted(_se). A vertical line at the cutoff -log(geo_mask_low), and a
    dotted one at the page's current s^2/2.
    """
    lengths = sorted(set(theory["T"]) | set(sim["T"]))
    shades = _blues(len(lengths))
    colors = {f"T = {T}": shades[i] for i, T in enumerate(lengths)}
    th = theory.assign(series=theory["T"].map(lambda T: f"T = {T}"))
    si = sim.assign(series=sim["T"].map(lambda T: f"T = {T}"))
    fig = lines_and_points(th, si, x="kl", y="accepted", series="series", se="accepted_se", title=title,
                           x_title="per-token KL(mu || pi) = s²/2 (nats)", y_title="fraction of rollouts accepted",
                           colors=colors, order=list(colors))
    fig.update_yaxes(range=[-0.03, 1.05], tickformat=".0%")
    decades = [10.0**k for k in range(-6, 2) if theory["kl"].min() <= 10.0**k <= theory["kl"].max()]
    fig.update_xaxes(tickvals=decades, ticktext=[f"{d:g}" for d in decades])
    fig.add_vline(x=cutoff_kl, line=dict(color="#D62728", width=2, dash="dash"))
    fig.add_annotation(x=math.log10(cutoff_kl), y=1.04, xref="x", yref="y", text=f"cutoff {cutoff_kl:.4f}",
                       showarrow=False, xanchor="left", font=dict(color="#D62728"))
    fig.add_vline(x=current_kl, line=dict(color="#555", width=1, dash="dot"))
    fig.add_annotation(x=math.log10(current_kl), y=-0.02, xref="x", yref="y", text=f"s²/2 = {current_kl:.2g}",
                       showarrow=False, xanchor="right", yanchor="bottom", font=dict(color="#555"))
    return fig


def _blues(n: int) -> list[str]:
    """n blues from light to dark (short to long rollouts)."""
    lo, hi = (158, 202, 225), (8, 48, 107)
    if n == 1:
        return [f"rgb{hi}"]
    return [
        "rgb({},{},{})".format(*(round(a + (b - a) * i / (n - 1)) for a, b in zip(lo, hi, strict=True)))
        for i in range(n)
    ]


_VERDICT_STYLE = {
    "dropped": dict(color="#D62728", symbol="x"),
    "muted (< 0.01)": dict(color="#9E9E9E", symbol="circle-open"),
    "kept": dict(color="#2CA02C", symbol="circle"),
    "amplified (> 10)": dict(color="#FF7F0E", symbol="diamond"),
}


def verdict(weight: float) -> str:
    """How a catastrophic token's gradient coefficient reads: dropped, muted, kept or amplified."""
    if weight == 0:
        return "dropped"
    if weight < 0.01:
        return "muted (< 0.01)"
    if weight > 10:
        return "amplified (> 10)"
    return "kept"


def catastrophic_strip(df: pd.DataFrame, thresholds: dict[str, list[tuple[str, float]]], *, L: float) -> go.Figure:
    """Does one catastrophic token's gradient get through? x = rollout length (log), y = estimator, one
    panel per direction ("down": l = -L, "up": l = +L); markers say dropped / muted / kept / amplified.

    df: columns label, direction, T, weight (the coefficient on the catastrophic token), accepted.
    thresholds: direction -> [(short text, T*)], closed-form lengths drawn as dashed vertical lines and
    labelled in a free strip under each panel's rows.
    """
    labels = list(dict.fromkeys(df["label"]))
    n = len(labels)
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.14,
                        subplot_titles=(f"l = −{L:g} on one token (π ≪ μ)", f"l = +{L:g} on one token (π ≫ μ)"))
    for a in fig.layout.annotations:  # subplot titles: left-aligned, like every other chart title
        a.update(x=0, xanchor="left", font=dict(size=13))
    seen = set()
    for row, direction in enumerate(("down", "up"), start=1):
        d = df[df["direction"] == direction].assign(verdict=lambda x: x["weight"].map(verdict))
        for v, style in _VERDICT_STYLE.items():
            p = d[d["verdict"] == v]
            if not len(p):
                continue
            fig.add_trace(go.Scatter(
                x=p["T"], y=p["label"].map(labels.index), mode="markers", name=v, legendgroup=v,
                showlegend=v not in seen,
                marker=dict(size=8, color=style["color"], symbol=style["symbol"],
                            line=dict(width=1.5, color=style["color"])),
                customdata=list(zip(p["label"], p["weight"], p["accepted"], strict=True)),
                hovertemplate="%{customdata[0]}, T=%{x}<br>weight on the token: %{customdata[1]:.4g}"
                              "<br>rollout accepted: %{customdata[2]}<extra></extra>",
            ), row=row, col=1)
            seen.add(v)
        for text, T_star in thresholds.get(direction, []):
            if 0 < T_star <= max(df["T"]):
                fig.add_vline(x=T_star, line=dict(color="#555", dash="dash", width=1), row=row, col=1)
                frac = math.log10(T_star) / max(math.log10(max(df["T"])), 1e-9)  # keep the label inside the plot
                anchor = "left" if frac < 0.15 else "right" if frac > 0.75 else "center"
                fig.add_annotation(x=math.log10(T_star), y=-1.05, text=text, showarrow=False, xanchor=anchor,
                                   yanchor="middle", font=dict(size=11, color="#555"), bgcolor="rgba(255,255,255,0.8)",
                                   row=row, col=1)
    ticks = _pow2_ticks(df["T"])
    fig.update_xaxes(type="log", tickvals=ticks, range=[-0.15, math.log10(max(df["T"])) + 0.1])
    fig.update_xaxes(title="rollout length T", row=2, col=1)
    # rows top to bottom in the given order (a reversed range), a free strip on top for the labels
    fig.update_yaxes(tickvals=list(range(n)), ticktext=labels, range=[n - 0.4, -1.6], showgrid=False)
    fig = titled(fig, "", height=170 + 2 * 30 * (n + 1))
    fig.update_layout(margin=dict(l=10, r=10, t=30, b=10),
                      legend=dict(orientation="h", yanchor="top", y=-0.12, xanchor="left", x=0))
    return fig


def drift_curve(theory: pd.DataFrame, sim: pd.DataFrame, *, C: float, crossing: float, r: float) -> go.Figure:
    """w = r^T under deterministic drift (log y): closed form line, estimators' product ratio as points,
    the clip C as a horizontal line and its crossing length as a vertical one."""
    fig = lines_and_points(theory.assign(series="w = r^T"), sim.assign(series="w = r^T"), x="T", y="w",
                           series="series", title=f"Deterministic drift: every token has ratio r = {r:g}",
                           x_title="rollout length T", y_title="sequence weight w = exp(S)", log_y=True,
                           colors={"w = r^T": "#111111"}, height=360)
    fig.add_hline(y=C, line=dict(color="#D62728", dash="dash", width=1.5))
    fig.add_annotation(x=0, xref="x domain", y=math.log10(C), yref="y", text=f"C = {C:g}", showarrow=False,
                       xanchor="left", yanchor="bottom", font=dict(color="#D62728"))
    if math.isfinite(crossing):
        fig.add_vline(x=crossing, line=dict(color="#D62728", dash="dot", width=1))
        fig.add_annotation(x=math.log10(crossing), xref="x", y=1, yref="y domain",
                           text=f"crosses C at T = {crossing:.0f}", showarrow=False, xanchor="right", yanchor="top",
                           font=dict(color="#D62728"))
    decades = [10**k for k in range(0, 6) if 10**k <= theory["T"].max()]
    fig.update_xaxes(tickvals=decades, ticktext=[f"{d:,}" for d in decades])
    fig.update_layout(showlegend=False)
    return fig


# -----------------------------------------------------------------------------------------------------
# Bias & variance


_QUANTITIES = (("bias2", "bias²", "#D62728"), ("variance", "variance", "#1F77B4"), ("mse", "MSE", "#111111"))


def bias_variance_sweep(df: pd.DataFrame, *, knob: str, estimator: str, log_x: bool,
                        reference: pd.DataFrame | None = None) -> go.Figure:
    """bias², variance and MSE (log y, +-2 s.e.) of one estimator's gradient vs one of its knobs.

    df: columns value, bias2(_se), variance(_se), mse(_se), noise_floor (variance / n_batches: the bias²
    an unbiased estimator shows from noise alone, drawn light grey). A row at value = inf (a clip switched
    off) is drawn as a horizontal MSE line. reference: other estimators' MSE at the page's current
    setting (columns estimator, mse), drawn as dotted lines.
    """
    fig = go.Figure()
    d = df.sort_values("value")
    finite = d[np.isfinite(d["value"].to_numpy(float))]
    for col, name, c in _QUANTITIES:
        fig.add_trace(go.Scatter(
            x=finite["value"], y=finite[col], mode="lines+markers", name=name, line=dict(color=c, width=2),
            marker=dict(size=7),
            error_y=dict(type="data", array=SE_BARS * finite[f"{col}_se"], visible=True, thickness=1.2),
            hovertemplate=f"{knob}=%{{x:.4g}}<br>{name}=%{{y:.3g}}<extra></extra>",
        ))
    if "noise_floor" in finite:
        fig.add_trace(go.Scatter(
            x=finite["value"], y=finite["noise_floor"], mode="lines", name="bias² noise floor",
            line=dict(color="#bbbbbb", width=1.5, dash="dash"),
            hovertemplate="variance / batches = %{y:.3g}<extra></extra>",
        ))
    off = d[~np.isfinite(d["value"].to_numpy(float))]
    lines = [(f"{knob} = ∞: MSE", row.mse, "#111111") for row in off.itertuples()]
    if reference is not None:
        lines += [(f"{row.estimator} MSE", row.mse, series_color(row.estimator, i))
                  for i, row in enumerate(reference.itertuples()) if row.estimator != estimator]
    for text, y, c in _merge_close(lines):
        fig.add_hline(y=y, line=dict(color=c, dash="dot", width=1.5))
        fig.add_annotation(x=1, xref="x domain", y=math.log10(y), yref="y", text=text, showarrow=False,
                           xanchor="right", yanchor="bottom", font=dict(size=11, color=c))
    fig.update_yaxes(type="log", exponentformat="power", dtick=1, title="squared error of the gradient")
    fig.update_xaxes(type="log" if log_x else "linear", title=f"{estimator} · {knob}",
                     tickvals=list(finite["value"]), ticktext=[f"{v:.3g}" for v in finite["value"]])
    return titled(fig, f"{estimator}: bias², variance and MSE vs {knob}")


def _merge_close(lines: list[tuple[str, float, str]], decades: float = 0.12) -> list[tuple[str, float, str]]:
    """Horizontal reference lines whose values lie within `decades` of each other (log scale) share one
    line and one label, so labels never print over each other."""
    merged: list[list] = []
    for text, y, c in sorted((x for x in lines if x[1] > 0), key=lambda x: x[1]):
        if merged and math.log10(y) - math.log10(merged[-1][1]) < decades:
            merged[-1][0] += f", {text}"
        else:
            merged.append([text, y, c])
    return [tuple(m) for m in merged]


def sweep_by_estimator(df: pd.DataFrame, *, x_title: str, log_x: bool = True) -> go.Figure:
    """bias², variance and MSE (three panels, log y, +-2 s.e.) vs a property of the toy (horizon, lag),
    one line per estimator; columns estimator, value, bias2(_se), variance(_se), mse(_se)."""
    fig = make_subplots(rows=1, cols=3, subplot_titles=[q[1] for q in _QUANTITIES], horizontal_spacing=0.07)
    for i, (name, d) in enumerate(df.groupby("estimator", sort=False)):
        d = d.sort_values("value")
        c = series_color(name, i)
        for j, (col, qname, _) in enumerate(_QUANTITIES, start=1):
            fig.add_trace(go.Scatter(
                x=d["value"], y=d[col], mode="lines+markers", name=name, legendgroup=name, showlegend=j == 1,
                line=dict(color=c, width=2), marker=dict(size=6),
                error_y=dict(type="data", array=SE_BARS * d[f"{col}_se"], visible=True, thickness=1.1),
                hovertemplate=f"{name}<br>{x_title}=%{{x}}<br>{qname}=%{{y:.3g}}<extra></extra>",
            ), row=1, col=j)
    fig.update_yaxes(type="log", exponentformat="power", dtick=1)
    positive = df["value"] > 0
    fig.update_xaxes(type="log" if log_x and bool(positive.all()) else "linear", title=x_title)
    if log_x and bool(positive.all()):
        fig.update_xaxes(tickvals=sorted(df["value"].unique()))
    for a in fig.layout.annotations:
        a.update(font=dict(size=13))
    return titled(fig, f"bias², variance and MSE vs {x_title}", height=400)


def batch_size_frontier(points: pd.DataFrame, lines: pd.DataFrame | None = None, *,
                        zero_mse: float | None = None) -> go.Figure:
    """MSE vs batch size (log-log), one colour per estimator: simulated points (+-2 s.e.) and the line
    MSE(B) = bias² + Var(1) / B through them, extended past the simulated sizes. Variance falls like
    1/B, bias² does not: an unbiased estimator's line keeps falling and crosses the biased ones'."""
    fig = lines_and_points(lines, points, x="batch_size", y="mse", series="estimator", se="mse_se",
                           title="Batch-size frontier: MSE vs rollouts per batch", x_title="rollouts per batch B",
                           y_title="MSE of the gradient", log_y=True)
    xs = pd.concat([d["batch_size"] for d in (points, lines) if d is not None])
    fig.update_xaxes(tickvals=_pow2_ticks(xs, step=2))
    _zero_line(fig, zero_mse)
    return fig


def gradient_vectors(true: Sequence[float], estimates: dict[str, tuple[Sequence[float], Sequence[float]]],
                     *, exact: dict[str, Sequence[float]] | None = None, labels: Sequence[str] | None = None,
                     title: str = "True vs mean estimated gradient, per parameter",
                     x_title: str = "parameter") -> go.Figure:
    """The exact gradient dJ/dθ (black), each estimator's mean estimate over the Monte Carlo batches
    with a +-2 s.e. band, and (dashed) its exact expectation where one is known: the gap between the
    dashed line and the black one is the estimator's bias. estimates: name -> (mean, stderr)."""
    fig = go.Figure()
    pos = list(range(len(true)))
    text = list(labels) if labels is not None else [str(i) for i in pos]
    for i, (name, (mean, se)) in enumerate(estimates.items()):
        c = series_color(name, i)
        upper = [m + SE_BARS * s for m, s in zip(mean, se, strict=True)]
        lower = [m - SE_BARS * s for m, s in zip(mean, se, strict=True)]
        fig.add_trace(go.Scatter(x=pos + pos[::-1], y=upper + lower[::-1], fill="toself", fillcolor=alpha(c, 0.15),
                                 line=dict(width=0), hoverinfo="skip", legendgroup=name, showlegend=False))
        fig.add_trace(go.Scatter(x=pos, y=list(mean), mode="lines+markers", name=name, legendgroup=name,
                                 line=dict(color=c, width=1.6), marker=dict(size=4), customdata=text,
                                 hovertemplate=f"{name}<br>%{{customdata}}<br>mean estimate %{{y:.4g}}<extra></extra>"))
        if exact and name in exact:
            fig.add_trace(go.Scatter(x=pos, y=list(exact[name]), mode="lines", name=f"{name} (exact mean)",
                                     legendgroup=name, showlegend=False, line=dict(color=c, width=1.4, dash="dash"),
                                     customdata=text,
                                     hovertemplate=f"{name}<br>%{{customdata}}<br>exact expectation %{{y:.4g}}"
                                                   "<extra></extra>"))
    fig.add_trace(go.Scatter(x=pos, y=list(true), mode="lines", name="true gradient",
                             line=dict(color="#111", width=2.5), customdata=text,
                             hovertemplate="%{customdata}<br>true %{y:.4g}<extra></extra>"))
    fig.update_xaxes(title=x_title)
    fig.update_yaxes(title="dJ / dθ")
    return titled(fig, title)


def error_bars_summary(df: pd.DataFrame, *, zero_mse: float | None = None) -> go.Figure:
    """bias², variance and MSE per estimator at the current setting (grouped bars, log y, +-2 s.e.).
    zero_mse: ‖∇J‖², the MSE of always answering 0 (an estimator that drops everything), as a dotted line."""
    fig = go.Figure()
    for col, name, c in _QUANTITIES:
        fig.add_trace(go.Bar(
            x=df["estimator"], y=df[col], name=name, marker_color=c,
            error_y=dict(type="data", array=SE_BARS * df[f"{col}_se"], visible=True) if f"{col}_se" in df else None,
            hovertemplate=f"%{{x}}<br>{name} %{{y:.3g}}<extra></extra>",
        ))
    fig.update_layout(barmode="group")
    fig.update_yaxes(type="log", exponentformat="power", dtick=1, title="squared error of the gradient")
    _zero_line(fig, zero_mse)
    return titled(fig, "Where each estimator's error comes from")


def _zero_line(fig: go.Figure, zero_mse: float | None) -> None:
    """‖∇J‖², the MSE of an estimate that is always 0, as a dotted line named in the legend (a text label
    would sit on the bars)."""
    if zero_mse is not None and zero_mse > 0:
        style = dict(color="#888888", dash="dot", width=1.5)
        fig.add_hline(y=zero_mse, line=style)
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", line=style, name="MSE of answering 0: ‖∇J‖²",
                                 hoverinfo="skip"))
