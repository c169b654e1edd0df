"""Plotly figures for the Lessons page: one per screen, drawn twice: before the reveal the simulation alone, after it
the closed form beside it. Builders take the DataFrames of ui/lessons_data.py and return figures; no streamlit, no
tensor math. Where a full page draws the same thing the builder is that page's (acceptance vs length, the clip
sweep, learning curves), so a lesson and its "Go deeper" page look alike.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from . import lab_charts, training_charts
from .clip_charts import mse_vs_clip
from .style import alpha, titled

PRODUCT, GEO = "#3b6fd8", "#e4572e"  # the product weight and the geometric ratio, on every screen
KEPT, DROPPED = "#2CA02C", "#D62728"
CAT_SHOWN = 4  # the catastrophe lesson draws the geometric band's view up to this length before the reveal
EXACT = "#111111"
LAG_SHOWN = 200  # the lag lesson's updates shown before the reveal
OPEN_SHOWN = 256  # the opening's rollouts are drawn this far before the reveal (the answer is at 4,096)


def _log_ticks(lo: float, hi: float) -> list[float]:
    return [10.0**k for k in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)]


def opening(data: dict, *, revealed: bool, s: float, height: int = 460) -> go.Figure:
    """One rollout's product weight w = exp(S_T) and geometric ratio exp(S_T / T) as it grows (log-log), eleven more
    rollouts' w in grey, to OPEN_SHOWN tokens (their ends at 4,096 are the answer); revealed: to the end, with the
    closed form's median of w and its +-2 sd band, and the geometric ratio's."""
    fig = go.Figure()
    th = data["theory"]
    paths = data["paths"] if revealed else data["paths"][data["paths"]["T"] <= OPEN_SHOWN]
    if revealed:
        for lo, hi, c, name in (("w_low", "w_high", PRODUCT, "w: closed form, ±2 sd of log w"),
                                ("geo_low", "geo_high", GEO, "geometric ratio: closed form, ±2 sd")):
            fig.add_trace(go.Scatter(x=list(th["T"]) + list(th["T"][::-1]), y=list(th[hi]) + list(th[lo][::-1]),
                                     fill="toself", fillcolor=alpha(c, 0.12), line=dict(width=0), name=name,
                                     hoverinfo="skip"))
        fig.add_trace(go.Scatter(x=th["T"], y=th["w_median"], mode="lines", name="median of w: e^(−T s²/2)",
                                 line=dict(color=PRODUCT, dash="dash", width=2),
                                 hovertemplate="T=%{x}<br>median w=%{y:.3g}<extra></extra>"))
    for r, d in paths.groupby("rollout"):
        if r == 0:
            continue
        fig.add_trace(go.Scatter(x=d["T"], y=d["w"], mode="lines", line=dict(color="#b8bcc6", width=1),
                                 name="other rollouts' w", legendgroup="others", showlegend=r == 1,
                                 hoverinfo="skip"))
    one = paths[paths["rollout"] == 0]
    fig.add_trace(go.Scatter(x=one["T"], y=one["w"], mode="lines", name="this rollout's w = exp(S_T)",
                             line=dict(color=PRODUCT, width=3), hovertemplate="T=%{x}<br>w=%{y:.3g}<extra></extra>"))
    fig.add_trace(go.Scatter(x=one["T"], y=one["geo"], mode="lines", name="its geometric ratio exp(S_T / T)",
                             line=dict(color=GEO, width=3), hovertemplate="T=%{x}<br>exp(S/T)=%{y:.4g}<extra></extra>"))
    fig.add_hline(y=1.0, line=dict(color="#555", dash="dot", width=1))
    lo = max(min(float(paths["w"].min()), float(th["w_low"].min()) if revealed else math.inf), 1e-30)
    hi = max(float(paths["w"].max()), float(th["w_high"].max()) if revealed else 0.0, 2.0)
    fig.update_yaxes(type="log", title="ratio (log scale)", exponentformat="power",
                     range=[math.log10(lo) - 0.3, math.log10(hi) + 0.3])
    end = int(data["paths"]["T"].max())
    if not revealed:
        fig.add_annotation(x=math.log10(end), xref="x", y=0.5, yref="y domain", text="T = 4,096: ?", showarrow=False,
                           xanchor="right", font=dict(size=20, color="#8a8f9c"))
    fig.update_xaxes(type="log", title="tokens so far T", tickvals=lab_charts._pow2_ticks(data["paths"]["T"]),
                     range=[0, math.log10(end) + 0.05])
    return titled(fig, f"One rollout growing to {end:,} tokens, s = {s:g}", height=height)


def bands(data: dict, *, revealed: bool, s: float, height: int = 460) -> go.Figure:
    """Acceptance vs length of Li's band on the product ratio (simulated points); revealed: on the geometric ratio
    too, and both closed forms' lines (Length & thresholds' chart)."""
    order = [data["labels"]["product"], data["labels"]["geo"]]
    colors = dict(zip(order, (PRODUCT, GEO), strict=True))
    sim = data["sim"] if revealed else data["sim"][data["sim"]["label"] == order[0]]  # the question's band waits
    fig = lab_charts.acceptance_vs_length(data["theory"] if revealed else None, sim, order=order,
                                          colors=colors, title=f"Li's band [0.5, 2] on w and on exp(S/T), s = {s:g} "
                                                              f"(per-token KL {s * s / 2:.3g})")
    fig.update_layout(height=height)
    return fig


def catastrophic(data: dict, *, revealed: bool, L: float, low: float, height: int = 460) -> go.Figure:
    """One token with l = -L among on-policy tokens: its own ratio e^(-L) (what a token band sees) and the rollout's
    geometric ratio e^(-L / T) (what a geometric band sees) against T; markers say whether each rule keeps the
    token's gradient once revealed (grey before), with the closed form e^(-L / T) and the length T* = L / -log a from
    which it passes."""
    df = data["df"]
    fig = go.Figure()
    fig.add_hrect(y0=low, y1=2.0, fillcolor=alpha(KEPT, 0.08), line_width=0)
    fig.add_annotation(x=0, xref="x domain", y=math.log10(2.0), yref="y", text=f"band [{low:g}, 2]", showarrow=False,
                       xanchor="left", yanchor="bottom", font=dict(color=KEPT, size=12))
    if revealed:
        T = np.unique(np.round(np.geomspace(1, float(df["T"].max()), 200)))
        fig.add_trace(go.Scatter(x=T, y=np.exp(-L / T), mode="lines", name="closed form e^(−L/T)",
                                 line=dict(color=EXACT, width=2), hovertemplate="T=%{x}<br>e^(−L/T)=%{y:.3g}"
                                                                                "<extra></extra>"))
        fig.add_vline(x=data["t_star"], line=dict(color=EXACT, dash="dash", width=1.5))
        fig.add_annotation(x=math.log10(data["t_star"]), xref="x", y=0.02, yref="paper", showarrow=False,
                           xanchor="left", text=f" T* = L / −log {low:g} = {data['t_star']:.3g}",
                           font=dict(color=EXACT, size=12))
    for rule, y_of, text in (("geometric", lambda T: np.exp(-L / T), "geometric band: rollout's e^(−L/T)"),
                             ("token", lambda T: np.full(len(T), math.exp(-L)), "token band: the token's e^(−L)")):
        d = df[df["rule"] == rule]
        name = d["estimator"].iloc[0]
        keep = d["weight"].to_numpy() > 0
        if not revealed:  # what the rule sees, not yet what it decides; the geometric band's only where it is far
            T = d["T"].to_numpy().astype(float)  # from the band (its crossing is the answer)
            T = T[T <= CAT_SHOWN] if rule == "geometric" else T
            fig.add_trace(go.Scatter(x=T, y=y_of(T), mode="markers", name=text,
                                     marker=dict(color="#8a8f9c", size=8, symbol="circle-open", line=dict(width=1.5)),
                                     hovertemplate=f"{name}, T=%{{x}}: ratio %{{y:.3g}}<extra></extra>"))
            continue
        for mask, verdict, c, sym in ((keep, "kept", KEPT, "circle"), (~keep, "dropped", DROPPED, "x")):
            if mask.any():
                T = d["T"].to_numpy()[mask].astype(float)
                fig.add_trace(go.Scatter(x=T, y=y_of(T), mode="markers", name=f"{text}: {verdict}",
                                         marker=dict(color=c, symbol=sym, size=9, line=dict(width=1.5, color=c)),
                                         hovertemplate=f"{name}, T=%{{x}}: {verdict}<extra></extra>"))
    fig.update_yaxes(type="log", title="ratio the rule sees (log scale)", exponentformat="power", dtick=1,
                     range=[math.log10(math.exp(-L)) - 0.5, math.log10(2.0) + 0.4])
    fig.update_xaxes(type="log", title="rollout length T", tickvals=lab_charts._pow2_ticks(df["T"]))
    return titled(fig, f"One token with l = −{L:g} among on-policy tokens", height=height)


def token_bias(rows: pd.DataFrame, batches: dict, *, revealed: bool, reward: str, height: int = 460) -> go.Figure:
    """Each estimator's mean gradient over the true one (bars, +-2 standard errors of that mean) and every batch's
    (dots), the first one's (token IS's) only once revealed, with the exact expectations. The axis holds every
    mean and exact value (naive PG's -6.3x under the additive reward); dots beyond it are counted."""
    fig = go.Figure()
    names = {"token_tis": "token IS", "seq_is": "sequence IS", "pg": "naive PG"}
    x = [names.get(e, e) for e in rows["estimator"]]
    shown = [revealed or i > 0 for i in range(len(rows))]  # the question's bar waits for the reveal
    y = rows["ratio"].where(shown, None)
    fig.add_trace(go.Bar(x=x, y=y, name="mean of 200 batches of 128, ±2 s.e.", marker_color=alpha("#8fa9dc", 0.7),
                         error_y=dict(type="data", array=2 * rows["ratio_se"].where(shown, 0), visible=True,
                                      thickness=2.5, width=10, color="#1d3f8a"),
                         hovertemplate="%{x}<br>mean %{y:.3f} of the truth<extra></extra>"))
    spread = [q for name, ok in zip(rows["estimator"], shown, strict=True) if ok
              for q in np.quantile(batches[name], [0.02, 0.98])]  # most batches' values, not the far tails
    values = [*rows["ratio"], *(v for v in rows["exact"] if np.isfinite(v)), 0.0, 1.0, *spread]
    lo, hi = min(values), max(values)
    pad = 0.15 * (hi - lo)
    lo, hi = lo - pad, hi + pad
    beyond = 0
    for name, label, ok in zip(rows["estimator"], x, shown, strict=True):
        if not ok:
            continue
        b = np.asarray(batches[name])
        inside = b[(b >= lo) & (b <= hi)]
        beyond += len(b) - len(inside)
        fig.add_trace(go.Box(x=[label] * len(inside), y=inside, name="each batch", legendgroup="batches",
                             showlegend=name == rows["estimator"].iloc[-1], boxpoints="all", jitter=0.6,
                             pointpos=0, fillcolor="rgba(0,0,0,0)", line=dict(width=0),
                             marker=dict(size=3, color="rgba(60,60,60,0.35)"), hoverinfo="skip"))
    if revealed:
        fig.add_trace(go.Scatter(x=x, y=rows["exact"], mode="markers+text", name="exact (closed form)",
                                 marker=dict(symbol="diamond", size=14, color=EXACT),
                                 text=[f"{v:.3g}" for v in rows["exact"]], textposition="middle right",
                                 hovertemplate="%{x}<br>exact %{y:.4f} of the truth<extra></extra>"))
    fig.add_hline(y=1.0, line=dict(color="#555", dash="dot", width=1.2), annotation_text="unbiased",
                  annotation_position="top right")
    if beyond:
        fig.add_annotation(x=0, xref="paper", y=1, yref="paper", xanchor="left", yanchor="bottom", showarrow=False,
                           text=f"{beyond} batch values beyond the axis", font=dict(size=12, color="#555"))
    if not revealed:
        fig.add_annotation(x=x[0], y=0.5 * (lo + hi), text="?", showarrow=False, font=dict(size=40, color="#8a8f9c"))
    fig.update_yaxes(title="mean gradient / true gradient", range=[lo, hi])
    fig.update_layout(barmode="overlay")
    what = "reward 1[sum ≥ 40]" if reward == "threshold" else "reward: the sum of the bits"
    return titled(fig, f"Huang's chain, {what}", height=height)


def clip(data: dict, *, revealed: bool, batch_size: int, height: int = 460) -> go.Figure:
    """The clip sweep (Bias & variance's chart): bias² and variance; revealed: their sum, the MSE, the exact
    curves, the exact best clip, Li's C* and the flat valley (clips within lessons_data.VALLEY of the lowest MSE)
    shaded."""
    fig = mse_vs_clip(data["df"], knob="seq_clip", estimator="seq_tis", theory=data["theory"], revealed=revealed,
                      quantities=None if revealed else ("bias2", "variance"),
                      title=f"seq_tis, B = {batch_size}: error against the clip C",
                      height=height)
    if revealed:
        lo, hi = data["valley"]
        fig.add_vrect(x0=lo, x1=hi, fillcolor=alpha(KEPT, 0.12), line_width=0, layer="below")
        fig.add_annotation(x=math.log10(math.sqrt(lo * hi)), xref="x", y=0.02, yref="y domain", showarrow=False,
                           yanchor="bottom", text="flat valley: MSE within 5%", font=dict(size=12, color=KEPT))
    return fig


def lag(data: dict, *, revealed: bool, lag: int, height: int = 460) -> go.Figure:
    """Exact J after each update for the sampled runs (mean and range over seeds: Training's chart), the first
    LAG_SHOWN updates until revealed; then all of them and the infinite-batch runs (each estimator's exact expected
    gradient) dotted, which go on past the sampled runs' end (lessons_data.LAG_EXPECTED_STEPS)."""
    J = data["J"] if revealed else data["J"][data["J"]["update"] <= LAG_SHOWN]
    fig = training_charts.learning_curves(J, title=f"Training with rollouts {lag} updates stale", J0=data["J0"])
    fig.update_xaxes(range=[0, int(data["expected"]["update"].max() if revealed else data["J"]["update"].max())])
    if revealed:  # the infinite-batch runs go on past the sampled ones: a delay shows as a late climb
        fig.add_vline(x=int(data["J"]["update"].max()), line=dict(color="#555", dash="dot", width=1),
                      annotation_text="sampled runs end", annotation_position="top left")
        palette = training_charts.colors(data["J"]["estimator"].unique())
        for label, d in data["expected"].groupby("estimator", sort=False):
            fig.add_trace(go.Scatter(x=d["update"], y=d["J"], mode="lines", name=f"{label}, infinite batch",
                                     line=dict(color=palette.get(label, EXACT), width=2, dash="dot"),
                                     hovertemplate=f"{label}, infinite batch: %{{y:.3f}}<extra></extra>"))
    fig.update_layout(height=height)
    return fig


VERDICT = {True: ("right", KEPT), False: ("wrong", DROPPED), None: ("not answered", "#b8bcc6")}


def scoreboard(rows: list[dict], *, height: int = 260) -> go.Figure:
    """Per screen: the prediction made there and the quiz's answer on it, right, wrong or open.
    rows: {"fact" (the screen's step), "prediction" (True / False / None), "check" (True / False / None)}."""
    fig = go.Figure()
    facts = [f"screen {r['fact']}" for r in rows]
    seen = set()
    for y, key in ((1, "prediction"), (0, "check")):
        for r, fact in zip(rows, facts, strict=True):
            text, c = VERDICT[r[key]]
            fig.add_trace(go.Scatter(x=[fact], y=[y], mode="markers", name=text, legendgroup=text,
                                     showlegend=text not in seen, marker=dict(size=26, color=c, symbol="square"),
                                     hovertemplate=f"{fact}: {text}<extra></extra>"))
            seen.add(text)
    fig.update_yaxes(tickvals=[0, 1], ticktext=["quiz", "your prediction"], range=[-0.6, 1.6], showgrid=False)
    fig.update_xaxes(showgrid=False)
    return titled(fig, "Your answers, screen by screen", height=height)


# ---- the first screens and fact (a)'s realistic half (ui/lesson_intro_data.py)
ENGINE = "#9aa5b8"
MEASURED = {"bf16": "#e4572e", "fp16": "#f2a541"}


def mismatch(engines: pd.DataFrame, levels: pd.DataFrame, measured: dict | None, *, dtype: str,
             height: int = 460) -> go.Figure:
    """Per-token KL(mu || pi) on a log axis: the literature's measured engine ranges (bars), the lessons' noise
    levels s (ticks, KL = s²/2), and once revealed the tiny transformer's measured mismatch (`measured`, None
    before the reveal: the question's answer waits)."""
    fig = go.Figure()
    rows = list(engines["engine"]) + ["the lessons' noise s"] + [f"tiny transformer, {dtype} sampler"]
    for e in engines.itertuples():
        fig.add_trace(go.Scatter(x=[e.kl_low, e.kl_high], y=[e.engine] * 2, mode="lines+markers",
                                 line=dict(color=ENGINE, width=14), marker=dict(size=14, color=ENGINE),
                                 name="measured engines (Yao et al.; Qi et al.)", legendgroup="engines",
                                 showlegend=e.Index == 0,
                                 hovertemplate=f"{e.engine}: KL %{{x:.2g}} (s = {e.s_low:.3f} to {e.s_high:.3f})"
                                               "<extra></extra>"))
    fig.add_trace(go.Scatter(x=levels["kl"], y=[rows[-2]] * len(levels), mode="markers+text", name="the lessons' s",
                             marker=dict(symbol="line-ns-open", size=22, line=dict(width=3, color=GEO)),
                             text=[f"{s:g}" for s in levels["s"]],
                             textposition=["bottom center" if i % 2 else "top center" for i in range(len(levels))],
                             hovertemplate="s = %{text}: KL %{x:.3g}<extra></extra>"))
    if measured is not None:
        fig.add_trace(go.Scatter(x=[measured["kl"]], y=[rows[-1]], mode="markers+text",
                                 marker=dict(symbol="diamond", size=18, color=MEASURED[dtype]),
                                 name=f"measured here: {dtype} against fp32",
                                 text=[f"KL {measured['kl']:.2g} (s = {measured['s']:.2g})"],
                                 textposition="middle right", hovertemplate="KL %{x:.3g}<extra></extra>"))
    else:
        fig.add_annotation(x=-3.5, xref="x", y=rows[-1], yref="y", text="? (Reveal)", showarrow=False,
                           font=dict(size=20, color="#8a8f9c"))
    fig.add_vline(x=float(theory_cutoff()), line=dict(color=DROPPED, dash="dash", width=1.5))
    fig.add_annotation(x=math.log10(theory_cutoff()), xref="x", y=1.0, yref="paper", showarrow=False,
                       xanchor="right", yanchor="bottom", text="MIS-PO's cutoff ", font=dict(color=DROPPED, size=12))
    fig.update_xaxes(type="log", title="per-token KL(μ || π) = s²/2, nats", range=[-7.5, 0.3],
                     tickvals=[10.0**k for k in range(-7, 1)], ticktext=[f"1e{k}" for k in range(-7, 0)] + ["1"])
    fig.update_yaxes(categoryorder="array", categoryarray=rows[::-1], range=[-0.6, len(rows) - 0.4])
    return titled(fig, "How far the sampler is from the trainer, per token", height=height)


def theory_cutoff() -> float:
    """MIS-PO's trajectory band's KL cutoff, -log 0.996."""
    return -math.log(0.996)


CAST_COLORS = {"dropped": DROPPED, "as is": KEPT, "scaled": PRODUCT, "odd": "#F2A541", "per token": "#8a8f9c",
               "?": "#d0d3da"}


def cast(cells: pd.DataFrame, *, revealed: bool, height: int = 460) -> go.Figure:
    """The estimators' cast as a card: one row per estimator, one column per rollout, each cell the weight it
    gives there (seqis.run's weights: one number when every token gets it, "odd | others" when the odd token is
    treated apart, a range when it varies by token); the formula and the words in the hover. Before the reveal
    GeoMean IS's cell on the low rollout is a question mark."""
    d = cells.copy()
    hide = (d["estimator"] == "GeoMean IS") & (d["row"] == 1) & (not revealed)
    d.loc[hide, ["text", "short", "kind"]] = "?"
    order = list(dict.fromkeys(d["estimator"]))
    fig = go.Figure()
    for kind, c in CAST_COLORS.items():
        k = d[d["kind"] == kind]
        if not len(k):
            continue
        fig.add_trace(go.Scatter(x=k["rollout"], y=k["estimator"], mode="markers+text", text=k["short"],
                                 customdata=np.stack([k["what"], k["text"]], axis=-1),
                                 marker=dict(symbol="square", size=12, color=c), textposition="middle right",
                                 name={"as is": "kept as is (1)", "odd": "odd token | others"}.get(kind, kind),
                                 hovertemplate="%{y}: %{customdata[0]}<br>%{x}: %{customdata[1]}<extra></extra>"))
    columns = list(dict.fromkeys(d["rollout"]))
    fig.update_xaxes(categoryorder="array", categoryarray=columns, side="top", range=[-0.1, len(columns) - 0.1],
                     showgrid=False)
    fig.update_yaxes(categoryorder="array", categoryarray=order[::-1], showgrid=True)
    fig = titled(fig, "Each correction's weight on three 200-token rollouts", height=height)
    fig.update_layout(margin_t=84)  # the column names sit on top, under the title
    return fig


def realistic(data: dict, *, revealed: bool, shown: tuple[int, ...], engines: pd.DataFrame,
              height: int = 460) -> go.Figure:
    """MIS-PO's trajectory band [0.996, 1.001] against the per-token KL (Length & thresholds' KL chart), with the
    measured engines' ranges shaded; before the reveal only the lengths `shown`, simulated, the question's
    length and every closed form waiting."""
    th = data["theory"] if revealed else data["theory"].iloc[0:0]
    sim = data["sim"] if revealed else data["sim"][data["sim"]["T"].isin(shown)]
    fig = lab_charts.kl_cutoff(th, sim, cutoff_kl=data["cutoff"], upper_kl=None, current_kl=data["kl"],
                               title="MIS-PO's band [0.996, 1.001] on exp(S/T) against the per-token KL")
    for i, e in enumerate(engines.itertuples()):
        fig.add_vrect(x0=e.kl_low, x1=min(e.kl_high, 0.2), fillcolor=alpha(ENGINE, 0.10 + 0.06 * i), line_width=0)
        fig.add_annotation(x=math.log10(math.sqrt(e.kl_low * min(e.kl_high, 0.2))), xref="x", y=0.5, yref="y",
                           text=e.engine.replace(" GPUs", ""), showarrow=False, textangle=-90,
                           font=dict(color="#5a6272", size=12))
    fig.update_layout(height=height)
    return fig
