"""The MSE of a sequence weight's clip, drawn so that its best value reads off the chart: Bias & variance's clip
sweep and the clip lesson share it.

A linear MSE axis (a valley reads as a valley; on a log axis a 20 % rise is a hairline), a log clip axis (0.25 to
100 fit), simulated points with +-2 s.e., and what theory adds: the exact bias², variance and MSE where they are
known (lines), the clip that minimises the exact MSE, and Li's C* = sqrt(2 (1 + chi2)) with the chi2 it uses named.
No streamlit, no tensor math.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from .lab_charts import _merge_close
from .style import series_color, titled

SE_BARS = 2.0
QUANTITIES = (("bias2", "bias²", "#D62728"), ("variance", "variance", "#1F77B4"), ("mse", "MSE", "#111111"))
STAR_COLOR = "#6B4C9A"


def best_simulated(df: pd.DataFrame) -> tuple[float, float] | None:
    """(clip, MSE) of the finite clip with the lowest simulated MSE."""
    finite = df[np.isfinite(df["value"].to_numpy(float))]
    if not len(finite):
        return None
    row = finite.loc[finite["mse"].idxmin()]
    return float(row["value"]), float(row["mse"])


def mse_vs_clip(df: pd.DataFrame, *, knob: str, estimator: str, theory: dict | None = None,
                reference: pd.DataFrame | None = None, revealed: bool = True, title: str | None = None,
                height: int = 440, quantities: tuple[str, ...] | None = None) -> go.Figure:
    """bias², variance and MSE of one estimator's gradient against its clip.

    df: simulated rows value, bias2(_se), variance(_se), mse(_se); a row at value = inf (no clip) is a dotted MSE
    line. theory (lab_data.clip_theory): {"chi2", "star", "exact" (rows value, bias2, variance, mse) or None,
    "best"}; drawn when `revealed`. reference: other estimators' MSE (columns estimator, mse), dotted lines.
    quantities: which of bias2, variance, mse to draw (default all three)."""
    fig = go.Figure()
    d = df.sort_values("value")
    finite = d[np.isfinite(d["value"].to_numpy(float))]
    exact = theory.get("exact") if (theory and revealed) else None
    for col, name, c in QUANTITIES:
        if quantities is not None and col not in quantities:
            continue
        if exact is not None:
            fig.add_trace(go.Scatter(x=exact["value"], y=exact[col], mode="lines", name=f"{name} (exact)",
                                     legendgroup=col, line=dict(color=c, width=2),
                                     hovertemplate=f"{knob}=%{{x:.3g}}<br>exact {name}=%{{y:.4g}}<extra></extra>"))
        fig.add_trace(go.Scatter(
            x=finite["value"], y=finite[col], mode="markers", name=f"{name} (simulated)", legendgroup=col,
            marker=dict(color=c, size=7, line=dict(color="white", width=1)),
            error_y=dict(type="data", array=SE_BARS * finite[f"{col}_se"], visible=True, thickness=1.1, width=2),
            hovertemplate=f"{knob}=%{{x:.3g}}<br>simulated {name}=%{{y:.4g}}<extra></extra>",
        ))
    best = best_simulated(d) if revealed else None  # the lesson asks for it before it shows it
    if best is not None:
        fig.add_trace(go.Scatter(x=[best[0]], y=[best[1]], mode="markers", name=f"lowest simulated MSE: {best[0]:g}",
                                 marker=dict(symbol="star", size=16, color="#F2A541", line=dict(color="#111", width=1)),
                                 hovertemplate=f"lowest simulated MSE at {knob} = %{{x:g}}<extra></extra>"))
    if exact is not None and theory.get("best") is not None:
        i = int(np.argmin(exact["mse"].to_numpy()))
        fig.add_trace(go.Scatter(x=[theory["best"]], y=[float(exact["mse"].iloc[i])], mode="markers",
                                 name=f"exact best {knob}: {theory['best']:.3g}",
                                 marker=dict(symbol="diamond", size=12, color="#111"),
                                 hovertemplate=f"exact best {knob} = %{{x:.3g}}<extra></extra>"))
    if theory and revealed and theory.get("star") is not None:
        star = theory["star"]
        fig.add_vline(x=star, line=dict(color=STAR_COLOR, dash="dash", width=1.5))
        fig.add_annotation(x=math.log10(star), xref="x", y=0.98, yref="y domain", showarrow=False, xanchor="right",
                           yanchor="top", align="right", font=dict(color=STAR_COLOR, size=12),
                           bgcolor="rgba(255,255,255,0.85)",
                           text=f"Li's C* = √(2(1+χ²)) = {star:.3g} <br>χ² = E_μ[w²] − 1 = {theory['chi2']:.3g} "
                                "<br>(the whole rollout's) ")
    lines = [(f"{knob} = ∞: MSE", float(row.mse), "#111111") for row in d[~np.isfinite(d["value"])].itertuples()
             if quantities is None or "mse" in quantities]
    if reference is not None:
        lines += [(f"{row.estimator} MSE", float(row.mse), series_color(row.estimator, i))
                  for i, row in enumerate(reference.itertuples()) if row.estimator != estimator]
    for text, y, c in _merge_close(lines, decades=0.04):  # lines within 10% share one label
        fig.add_hline(y=y, line=dict(color=c, dash="dot", width=1.2))
        fig.add_annotation(x=1, xref="x domain", y=y, yref="y", text=text, showarrow=False, xanchor="right",
                           yanchor="bottom", font=dict(size=11, color=c))
    ticks = [v for v in (0.25, 0.5, 1, 2, 4, 10, 20, 50, 100) if finite["value"].min() <= v <= finite["value"].max()]
    fig.update_xaxes(type="log", title=f"{estimator} · {knob} (clip C)", tickvals=ticks,
                     ticktext=[f"{v:g}" for v in ticks])
    fig.update_yaxes(title="squared error of the gradient", rangemode="tozero")
    # titled puts the legend at the figure's foot with room kept for its rows (under the plot at y = -0.2 it was cut)
    return titled(fig, title or f"{estimator}: bias², variance and MSE vs {knob}", height=height)
