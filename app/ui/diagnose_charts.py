"""The Diagnose page's figures: the chart that proves each finding, from small tables (seqis.diagnosis.token_tables) and
a finding's evidence. Plain plotly; no streamlit here."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .style import EXTRA, PALETTE, STATUS_COLORS, base_layout, labels_apart, two_lines

SEVERITY_COLORS = {"bad": STATUS_COLORS["dropped"], "warn": STATUS_COLORS["clipped"], "ok": "#2e7d32"}
UNIT_ROUNDOFF = {"bf16": 2.0**-8, "fp16": 2.0**-11}


def _layout(fig: go.Figure, title: str, x: str, y: str, *, height: int = 340, legend: bool = True) -> go.Figure:
    """Axes, size and a title on two lines ("Finding: what the chart shows" -> the finding, then the rest in
    smaller type), so it fits a chart half of a 900 px window (plotly never wraps a title)."""
    head, second = two_lines(title)
    fig.update_layout(**base_layout(height=height, title=head["text"], legend=legend), hovermode="closest")
    if second:
        fig.update_layout(title=head, margin_t=76)
    fig.update_xaxes(title_text=x, zeroline=False)
    fig.update_yaxes(title_text=y, zeroline=False)
    return fig


def _tokens(fig: go.Figure, points: pd.DataFrame, x: np.ndarray, y: np.ndarray, name: str, color: str) -> None:
    hover = [f"rollout {r}, position {p}" for r, p in zip(points["rollout"], points["position"])]
    fig.add_trace(go.Scatter(x=x, y=y, mode="markers", name=name, text=hover,
                             marker=dict(size=4, color=color, opacity=0.5),
                             hovertemplate="%{text}<br>x %{x:.4g}<br>y %{y:.4g}<extra></extra>"))


def temperature_figure(points: pd.DataFrame, evidence: dict) -> go.Figure:
    """Log-ratio against the trainer's log-prob, with the fitted slope 1 - 1/tau drawn through the branching
    tokens (pi < 1/2) it was fitted on."""
    fig = go.Figure()
    x, y = points["trainer_logprob"].to_numpy(), points["log_ratio"].to_numpy()
    _tokens(fig, points, x, y, "loss tokens (a sample)", PALETTE[0])
    slope, tau = evidence["slope"], evidence["temperature"]
    branching = x < math.log(0.5)
    if branching.any():
        xs = np.array([float(x[branching].min()), math.log(0.5)])
        through = float(np.mean(y[branching])) - slope * float(np.mean(x[branching]))
        tau_said = f"tau = {tau:.3g}" if math.isfinite(tau) else "at or above 1: no finite tau"
        fig.add_trace(go.Scatter(x=xs, y=slope * xs + through, mode="lines",
                                 name=f"slope 1 - 1/tau = {slope:+.3f} ({tau_said})",
                                 line=dict(color=EXTRA[4], width=3)))
    title = (f"Temperature: l is linear in log pi; the sampler at {tau:.3g}x the trainer's" if math.isfinite(tau)
             else "Temperature: l rises with log pi at a slope no finite temperature gives (not estimable)")
    return _layout(fig, title, "trainer log-prob log pi", "log-ratio l = log pi - log mu")


def truncation_figure(points: pd.DataFrame, evidence: dict) -> go.Figure:
    """The one-sided histogram of per-token log-ratios, the mean offset marked."""
    l = points["log_ratio"].to_numpy()
    fig = go.Figure(go.Histogram(x=l, nbinsx=80, name="loss tokens", marker_color=PALETTE[0]))
    off = evidence["log_offset"]
    fig.add_vline(x=0.0, line=dict(color=EXTRA[0], width=1))
    fig.add_vline(x=off, line=dict(color=EXTRA[4], width=2, dash="dash"),
                  annotation_text=f"mean offset {off:+.4f}", annotation_position="top left")
    return _layout(fig, "Sampler truncation: every log-ratio sits at or below 0 (log of the kept mass)",
                   "log-ratio l", "tokens", legend=False)


def misalignment_figure(evidence: dict) -> go.Figure:
    """Agreement of the trainer's and the sampler's log-probs at each shift: in place against shifted."""
    agreement = evidence["agreement"]
    shifts = sorted(agreement)
    colors = [SEVERITY_COLORS["bad"] if k == evidence["shift"] else PALETTE[5] for k in shifts]
    fig = go.Figure(go.Bar(x=[str(k) for k in shifts], y=[max(agreement[k], 1e-9) for k in shifts],
                           marker_color=colors, text=[f"{agreement[k]:.2g}" for k in shifts], textposition="outside"))
    fig.update_yaxes(type="log")
    return _layout(fig, f"Misalignment: the log-probs agree best shifted by {evidence['shift']}",
                   "shift k (inference position t + k against trainer position t)",
                   "median |log pi - log mu|", legend=False)


def precision_figure(points: pd.DataFrame, evidence: dict) -> go.Figure:
    """|l| against the trainer's probability: rounding noise falls as the token gets likely; the formats'
    unit roundoffs and the fitted noise floor drawn for scale, each labelled beside its line (right of the plot,
    set apart where lines are close)."""
    p = np.exp(points["trainer_logprob"].to_numpy())
    y = np.abs(points["log_ratio"].to_numpy()) + 1e-12
    fig = go.Figure()
    _tokens(fig, points, 1 - p + 1e-12, y, "loss tokens (a sample)", PALETTE[0])
    floor = max(evidence["noise_floor"], 1e-12)
    lines = [(f"{name} unit roundoff", u, EXTRA[2 + i], "dot") for i, (name, u) in enumerate(UNIT_ROUNDOFF.items())]
    lines.append((f"noise floor ({evidence['dtype']})", floor, EXTRA[4], "dash"))
    ys = np.log10(np.concatenate([y, [v for _, v, _, _ in lines]]))
    y_range = [float(ys.min()) - 0.2, float(ys.max()) + 0.2]  # log10 units: the lines and the points in view
    labels = []
    for text, v, c, d in lines:
        fig.add_hline(y=v, line=dict(color=c, dash=d, width=2 if d == "dash" else 1.5))
        labels.append(dict(text=text, xref="paper", x=1.0, xanchor="left", xshift=4, y=float(np.log10(v)), yref="y",
                           yanchor="middle", showarrow=False, font=dict(size=10, color=c)))
    height = 340
    labels_apart(labels, y_range, height - 76 - 30)  # the plot's height: the figure less its title and axis
    fig.update_xaxes(type="log")
    fig.update_yaxes(type="log", range=y_range)
    fig = _layout(fig, "Precision noise: |l| against 1 - pi (rounding moves unlikely tokens most)",
                  "1 - trainer probability", "|log-ratio|", height=height)
    fig.update_layout(annotations=labels, margin_r=130)
    return fig


def catastrophic_figure(points: pd.DataFrame, worst: pd.DataFrame) -> go.Figure:
    """The sample of tokens and the worst ones, log-ratio against the trainer's log-prob."""
    fig = go.Figure()
    _tokens(fig, points, points["trainer_logprob"].to_numpy(), points["log_ratio"].to_numpy(),
            "loss tokens (a sample)", PALETTE[0])
    _tokens(fig, worst, worst["trainer_logprob"].to_numpy(), worst["log_ratio"].to_numpy(), "worst tokens",
            SEVERITY_COLORS["bad"])
    for y in (math.log(20), -math.log(20)):
        fig.add_hline(y=y, line=dict(color=EXTRA[0], dash="dot"))
    return _layout(fig, "Catastrophic tokens: |l| beyond ln 20, mostly on tokens the trainer finds unlikely",
                   "trainer log-prob log pi", "log-ratio l")


def entropy_gap_figure(points: pd.DataFrame, evidence: dict) -> go.Figure:
    """-log pi(y) - H at each token: centred on 0 when the tokens come from the distribution reported (and the
    trainer's), below 0 when they are sharper; the mean (the entropy gap) marked."""
    if "entropy" not in points:
        return histogram_figure(points)
    gap = -points["trainer_logprob"].to_numpy() - points["entropy"].to_numpy()
    fig = go.Figure(go.Histogram(x=gap, nbinsx=80, name="loss tokens", marker_color=PALETTE[0]))
    fig.add_vline(x=0.0, line=dict(color=EXTRA[0], width=1))
    fig.add_vline(x=evidence["entropy_gap"], line=dict(color=EXTRA[4], width=2, dash="dash"),
                  annotation_text=f"entropy gap {evidence['entropy_gap']:+.3f}", annotation_position="top left")
    return _layout(fig, "Raw log-probs: the tokens are sharper than the distribution reported",
                   "-log pi(y) - H (nats)", "tokens", legend=False)


def lag_figure(gains: pd.DataFrame, evidence: dict) -> go.Figure:
    """Per rollout, sum_t (rho_t - 1) against its advantage: a trainer ahead of the sampler gives the rollouts
    that did well higher ratios (the slope is the test's gain per unit of advantage variance)."""
    fig = go.Figure()
    x, y = gains["advantage"].to_numpy(), gains["sum_rho_minus_1"].to_numpy()
    hover = [f"rollout {r}" for r in gains["rollout"]]
    fig.add_trace(go.Scatter(x=x, y=y, mode="markers", name="rollouts", text=hover,
                             marker=dict(size=6, color=PALETTE[0], opacity=0.6),
                             hovertemplate="%{text}<br>advantage %{x:.3g}<br>sum (rho - 1) %{y:.3g}<extra></extra>"))
    if len(x) > 1 and float(np.var(x)) > 0:
        slope = float(np.mean((x - x.mean()) * (y - y.mean())) / np.var(x))
        xs = np.array([float(x.min()), float(x.max())])
        fig.add_trace(go.Scatter(x=xs, y=float(y.mean()) + slope * (xs - x.mean()), mode="lines",
                                 name=f"least squares, gain {evidence['gain']:+.3g} per rollout",
                                 line=dict(color=EXTRA[4], width=3)))
    return _layout(fig, "Policy lag: the rollouts that did well have the higher trainer / sampler ratio",
                   "advantage", "sum over the rollout of (rho - 1)")


def histogram_figure(points: pd.DataFrame) -> go.Figure:
    """The per-token log-ratios of a healthy batch."""
    fig = go.Figure(go.Histogram(x=points["log_ratio"].to_numpy(), nbinsx=80, marker_color=PALETTE[2]))
    fig.add_vline(x=0.0, line=dict(color=EXTRA[0], width=1))
    return _layout(fig, "Per-token log-ratios: centred on 0, narrow", "log-ratio l", "tokens", legend=False)


def rollout_figure(tokens: pd.DataFrame) -> go.Figure:
    """One rollout token by token: both log-probs at each position (top), and the log-ratio l on its own axis
    (bottom): |l| is often below 0.4 where the log-probs reach -5, and on one axis its bars were invisible."""
    fig = go.Figure()
    pos = tokens["position"].to_numpy()
    fig.add_trace(go.Scatter(x=pos, y=tokens["trainer_logprob"], mode="lines+markers", name="trainer log pi",
                             line=dict(color=PALETTE[0]), marker=dict(size=4)))
    fig.add_trace(go.Scatter(x=pos, y=tokens["inference_logprob"], mode="lines+markers",
                             name="sampler log mu", line=dict(color=PALETTE[1], dash="dot"), marker=dict(size=4)))
    fig.add_trace(go.Bar(x=pos, y=tokens["log_ratio"], name="log-ratio l = log pi - log mu", marker_color=EXTRA[1],
                         yaxis="y2", xaxis="x2"))
    fig = _layout(fig, "The worst rollout, token by token: the log-probs, and their log-ratio below", "position",
                  "log-prob", height=440)
    fig.update_layout(yaxis=dict(domain=[0.45, 1.0], title_text="log-prob"),
                      xaxis=dict(anchor="y", matches="x2", showticklabels=False, title_text=None),
                      yaxis2=dict(domain=[0.0, 0.33], anchor="x2", title_text="log-ratio l", zeroline=True,
                                  zerolinecolor="#bbb"),
                      xaxis2=dict(anchor="y2", title_text="position"), bargap=0.1)
    return fig


def power_figure(view: dict, measured: float | None, batch_tokens: int) -> go.Figure:
    """What a finding's detector can see: detection rate against the fault's size on generators it was not tuned
    on (seqis.diagnosis.power), at the simulated batch size nearest this batch's, the batch's own estimate
    marked. x on a log scale for sizes that span decades (offsets, gaps, shares, KL), linear for temperature."""
    fig = go.Figure()
    temperature = view["evidence"] == "temperature"
    for i, (name, points) in enumerate(view["points"].items()):
        points = sorted(points, key=lambda p: p["x"])
        hover = [f"{name} {p['value']}: found in {p['rate']:.0%} of {p['n']} batches" for p in points]
        fig.add_trace(go.Scatter(x=[p["x"] for p in points], y=[p["rate"] for p in points], mode="lines+markers",
                                 name=name, text=hover, line=dict(color=PALETTE[i], width=2), marker=dict(size=7),
                                 hovertemplate="%{text}<br>x %{x:.3g}<extra></extra>"))
    if measured is not None and math.isfinite(measured) and (temperature or measured > 0):
        # a trace, not add_vline: plotly places a vline's annotation off a log axis (x read as log10 x)
        fig.add_trace(go.Scatter(x=[measured, measured], y=[0, 1], mode="lines", name=f"this batch: {measured:.3g}",
                                 line=dict(color=EXTRA[4], width=2, dash="dash"), hoverinfo="skip"))
    fig.add_hline(y=0.9, line=dict(color=EXTRA[0], dash="dot", width=1))
    if not temperature:
        fig.update_xaxes(type="log")
    fig.update_yaxes(range=[-0.05, 1.05], tickformat=".0%")
    return _layout(fig, f"What this detector can see: at ~{view['tokens']:,} tokens"
                   f"{size_note(view['tokens'], batch_tokens)}", PANELS.get(view["kind"], ("", view["label"]))[1],
                   "batches where it is found",
                   height=340)


def size_note(simulated: int, tokens: int) -> str:
    """"; yours has N, ..." for a batch of `tokens` against curves simulated at `simulated` tokens: the smallest
    effect a test finds shrinks about as 1/sqrt(tokens)."""
    ratio = tokens / max(simulated, 1)
    if ratio > 2:
        return f"; yours has {tokens:,}, so it sees effects ~{math.sqrt(ratio):.1f}x smaller"
    if ratio < 0.5:
        return f"; yours has {tokens:,}, so it needs effects ~{1 / math.sqrt(ratio):.1f}x larger"
    return f"; yours has {tokens:,}"


# each detector's panel in the grid: its title and the x axis (the fault's size, as the power table measures it)
PANELS = {"sampler_truncation": ("Truncation (top-p, top-k)", "|log kept mass| (nats / token)"),
          "temperature_mismatch": ("Temperature", "temperature ratio"),
          "raw_logprobs": ("Raw log-probs", "|entropy gap| (nats / token)"),
          "catastrophic_tokens": ("Catastrophic tokens", "share of tokens forced"),
          "policy_lag": ("Policy lag", "per-token KL")}


def power_grid_figure(sizes: list[tuple[str, dict[str, dict]]], title: str, *, faults: list[str]) -> go.Figure:
    """Every detector's detection rate against its fault's size, one panel each, at one or more batch sizes
    (sizes: (label, kind -> seqis.diagnosis.power.view) per size; a solid line for the first, dotted after);
    faults: every fault's name, in the power table's order (one colour each, across panels and sizes)."""
    kinds = [k for k in PANELS if any(v.get(k) for _, v in sizes)]
    cols = 2  # two panels a row: legible in half of a 900 px window too
    rows = math.ceil(len(kinds) / cols)
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=[PANELS[k][0] for k in kinds], horizontal_spacing=0.12,
                        vertical_spacing=0.14)
    for j, (label, views) in enumerate(sizes):
        for i, kind in enumerate(kinds):
            v = views.get(kind)
            if v is None:
                continue
            r, c = i // cols + 1, i % cols + 1
            for name, points in v["points"].items():
                points = sorted(points, key=lambda p: p["x"])
                colour = PALETTE[faults.index(name) % len(PALETTE)]
                hover = [f"{name} {p['value']}: found in {p['rate']:.0%} of {p['n']} batches of "
                         f"~{p.get('tokens', 0):,} tokens" for p in points]
                fig.add_trace(go.Scatter(x=[p["x"] for p in points], y=[p["rate"] for p in points],
                                         mode="lines+markers", name=f"{name}, {label}" if label else name,
                                         text=hover,
                                         legendgroup=label, line=dict(color=colour, width=2,
                                                                      dash="solid" if j == 0 else "dot"),
                                         marker=dict(size=6), hovertemplate="%{text}<br>x %{x:.3g}<extra></extra>"),
                              row=r, col=c)
    fig = _layout(fig, title, "", "", height=250 * rows + 90)
    for i, kind in enumerate(kinds):  # after _layout, which titles every axis alike
        r, c = i // cols + 1, i % cols + 1
        fig.add_hline(y=0.9, line=dict(color=EXTRA[1], dash="dot", width=1), row=r, col=c)
        fig.update_xaxes(title_text=PANELS[kind][1], type="linear" if kind == "temperature_mismatch" else "log",
                         row=r, col=c)
        fig.update_yaxes(range=[-0.05, 1.05], tickformat=".0%", title_text="found" if c == 1 else None, row=r, col=c)
    if len(kinds) % cols:  # the legend in the grid's empty cell
        fig.update_layout(legend=dict(orientation="v", x=1 - 0.9 * (cols - len(kinds) % cols) / cols, xanchor="left",
                                      y=0.0, yanchor="bottom", font=dict(size=11)))
    else:
        fig.update_layout(legend=dict(orientation="h", y=-0.12, x=0, font=dict(size=11)))
    return fig
