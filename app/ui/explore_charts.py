"""Chart builders: numpy arrays and floats in, plotly figures out. No streamlit here, no torch math.

Every estimator keeps one colour everywhere (its row in the registry picks it), so the rollout maps,
the per-token coefficients, the histograms and the effective-batch bars read together.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
from _plotly_utils.utils import to_typed_array_spec

from seqis.core.compose import Composition
from seqis.diagnosis.summaries import HIST_BINS, HIST_LOG10_RANGE

from .style import PALETTE, STATUS_COLORS, STATUS_SYMBOLS, alpha, base_layout, dash, labels_apart, log_ticks
from .style import estimator_color as color


def _hline(y: float, color_: str, dash: str = "dash", width: float = 1.6) -> dict:
    return dict(type="line", xref="paper", x0=0, x1=1, yref="y", y0=y, y1=y, line=dict(color=color_, width=width,
                                                                                        dash=dash))


# ---------------------------------------------------------------------------------------------------------
# the rollout map


def _negated(v: float | None) -> float | None:
    return None if v is None else -v


def bands_of(comp: Composition) -> list[tuple[str, str, float]]:
    """What a correction draws on the (length, geometric log-ratio) plane, read from its composition:
    ("hline", label, y) for a band or clip on the geometric ratio (a k1 mean band: S/T = -k1), ("curve", label,
    log C) for one on the product ratio (w = C is the curve S/T = log C / T), ("note", text, nan) for a
    per-token rule or one the map cannot show (sign-conditioned, k2 / k3, a token's max or min)."""
    out: list[tuple[str, str, float]] = []
    w = comp.weight

    def edges(kind: str, what: str, lo: float | None, hi: float | None, log: bool) -> None:
        for side, v in (("low", lo), ("high", hi)):
            if v is not None and (0 < v < math.inf if log else math.isfinite(v)):
                out.append((kind, f"{what} {side} = {v:g}", math.log(v) if log else v))

    if w.level in ("geometric", "sequence"):
        kind, what = ("hline", "exp(S/T)") if w.level == "geometric" else ("curve", "w = exp(S)")
        edges(kind, f"{what} clip", None, w.upper, True)
        if w.band is not None:
            edges(kind, f"{what} band", *w.band, True)
    elif w.level != "none" and (w.truncated or w.band is not None):
        out.append(("note", f"the {w.level} weight:<br>truncated or banded per token", math.nan))
    for c in comp.criteria:
        where = {"mean": "hline", "sum": "curve"}.get(c.agg)
        if c.advantage is None and where is not None and c.statistic in ("ratio", "k1"):
            if c.statistic == "ratio":
                edges(where, f"{c.agg} ratio", c.low, c.high, True)
            else:  # k1 = -l: a band [a, b] on its mean (sum) is S/T (S) in [-b, -a]
                edges(where, f"{c.agg} k1 (on -S)", _negated(c.high), _negated(c.low), False)
        else:
            band = f"[{c.low if c.low is not None else '-inf'}, {c.high if c.high is not None else 'inf'}]"
            cond = f" when A is {c.advantage}" if c.advantage else ""
            out.append(("note", f"{c.statistic} {c.agg} {band}{cond}:<br>per token, or not on this map",
                        math.nan))
    return out


MAP_LEFT = 80  # px: the widest y labels and title of the maps seen (73 px on the drift scenario)
NOTE_BELOW_AXIS, NOTE_LINE = 40, 14  # px: a rollout map's note sits under its x axis's ticks and title, 14 px a line


_AS_GIVEN = ("geojson", "layer", "layers", "range")  # plotly's is_skipped_key: never typed arrays


def _plain(node, key: str = ""):
    """A copy of a spec's dicts and lists as plotly's to_plotly_json writes them: None-valued properties left out,
    a numeric numpy array as a typed-array spec (base64), except under the keys plotly keeps as they are."""
    if isinstance(node, dict):
        return {k: _plain(v, k) for k, v in node.items() if v is not None}
    if isinstance(node, (list, tuple)):
        return [_plain(v) for v in node]
    if isinstance(node, np.ndarray) and node.dtype.kind in "biuf" and key not in _AS_GIVEN:
        return to_typed_array_spec(node)
    return node


class Figure:
    """A figure as plain data: trace and layout dicts, numpy arrays inside, as the builders below make it.
    ui/runtime/chart.py sends `to_plotly_json()`; plotly's figure objects would copy and convert it twice (~2 ms
    a figure; a knob move makes four). `data` and `layout` are plotly's, made when first read (the PNG export,
    tests), unvalidated: the tests validate every figure a page draws. Never mutate one: the caches share it."""

    def __init__(self, traces: list[dict], layout: dict):
        self.traces, self.spec_layout = traces, layout

    def to_plotly_json(self) -> dict:
        """{"data", "layout"} as plotly's own to_plotly_json gives them: numeric arrays as typed-array specs."""
        return _plain({"data": self.traces, "layout": self.spec_layout})

    @functools.cached_property
    def plotly(self) -> go.Figure:
        return go.Figure(dict(data=self.traces, layout=self.spec_layout), _validate=False)

    @property
    def data(self):
        return self.plotly.data

    @property
    def layout(self):
        return self.plotly.layout


def figure(traces: list[dict], layout: dict) -> Figure:
    return Figure(traces, layout)


def metadata_colors(name: str, values, n: int) -> dict | None:
    """Point colours for a metadata column: a continuous scale for numbers, the palette for categories
    (at most 12, with `key`: [(value, colour)]; beyond that, by category index on a continuous scale). None when
    the column does not fit."""
    if values is None or len(values) != n:
        return None
    arr = np.asarray(values, dtype=object)
    text = np.asarray([str(v)[:40] for v in arr], dtype=object)
    try:
        num = arr.astype(float)
        if np.isfinite(num).all() and len(np.unique(num)) > 12:
            lo, hi = float(num.min()), float(num.max())
            return dict(color=num, text=text, colorscale="Viridis", cmin=lo, cmax=hi if hi > lo else lo + 1)
    except (TypeError, ValueError):
        pass
    cats, idx = np.unique(text, return_inverse=True)
    if len(cats) <= len(PALETTE):  # with a key: which colour is which value
        return dict(color=np.asarray(PALETTE, dtype=object)[idx], text=text, key=list(zip(cats, PALETTE)))
    return dict(color=idx.astype(float), text=text, colorscale="Turbo", cmin=0.0, cmax=float(len(cats) - 1))


STATUS_WORDS = {"kept": "accepted", "clipped": "clipped", "dropped": "rejected"}  # a rollout's status, in words


def _status(rollouts: Mapping[str, np.ndarray]) -> np.ndarray:
    accepted = rollouts["accepted"].astype(bool)
    clipped = rollouts["clipped"].astype(bool)
    return np.where(~accepted, "dropped", np.where(clipped, "clipped", "kept"))


def rollout_map(
    name: str,
    rollouts: Mapping[str, np.ndarray],
    bands: Sequence[tuple[str, str, float]] = (),
    *,
    metadata: Mapping[str, Sequence] | None = None,
    noise_s: float | None = None,
    color_by: str | None = None,
    height: int = 360,
    title: str | None = None,
) -> Figure:
    """Length (log axis) vs geometric log-ratio S/T, one point per non-empty rollout, marked kept /
    clipped / dropped (symbols; also colours unless `color_by` names a metadata column to colour by);
    the estimator's bands drawn; with noise_s, the Gaussian theory's funnel -s^2/2 +- 2 s / sqrt(T) in grey."""
    T = np.asarray(rollouts["length"], dtype=float)
    y = np.asarray(rollouts["geo_log_ratio"], dtype=float)
    valid = T > 0
    status = _status(rollouts)
    meta = {k: v for k, v in (metadata or {}).items() if k != "length"}
    meta_keys = list(meta)[:4]
    columns = [np.arange(T.size), rollouts["seq_log_ratio"], rollouts["weight"], rollouts["kept_fraction"]]
    try:  # numbers only: a float array, which plotly copies and sends as one binary block (an object array is
        custom = np.column_stack(columns + [np.asarray(meta[k], dtype=float) for k in meta_keys])  # 2,000 objects)
    except (TypeError, ValueError):
        custom = np.column_stack(columns + [np.asarray([str(v)[:40] for v in meta[k]], dtype=object)
                                            for k in meta_keys]).astype(object)
    hover = ("rollout %{customdata[0]}<br>T = %{x:.0f}<br>S/T = %{y:.4g}<br>S = %{customdata[1]:.4g}"
             "<br>weight = %{customdata[2]:.4g}<br>kept tokens = %{customdata[3]:.1%}")
    hover += "".join(f"<br>{k} = %{{customdata[{4 + i}]}}" for i, k in enumerate(meta_keys))

    traces = []
    lo, hi = (float(np.min(T[valid])), float(np.max(T[valid]))) if valid.any() else (1.0, 10.0)
    t_grid = np.geomspace(max(lo, 1.0), max(hi, lo + 1.0), 60)
    if noise_s is not None and noise_s > 0:
        mean = -noise_s**2 / 2
        for sign in (-1, 1):
            traces.append(dict(type="scatter",
                x=t_grid, y=mean + sign * 2 * noise_s / np.sqrt(t_grid), mode="lines",
                line=dict(color="rgba(90,90,90,0.6)", width=1.2, dash="dot"), hoverinfo="skip",
                name="theory: -s²/2 ± 2s/√T", showlegend=False))  # the legend, when shown, is the colour key
    by = metadata_colors(color_by, (metadata or {}).get(color_by), T.size) if color_by else None
    if by is not None:
        hover += f"<br>{color_by} = %{{text}}"

    # y range from the data, widened to show band edges that are near it; edges far off are named in a
    # note instead of squashing the points into a line
    ys = y[valid]
    y0, y1 = (float(np.min(ys)), float(np.max(ys))) if ys.size else (-1.0, 1.0)
    span = max(y1 - y0, 1e-3)
    for kind, _, v in bands:
        if kind == "hline" and y0 - 2 * span <= v <= y1 + 2 * span:
            y0, y1 = min(y0, v), max(y1, v)
    span = max(y1 - y0, 1e-3)
    y_range = [y0 - 0.08 * span, y1 + 0.08 * span]
    shapes, labels, above, below = [], [], [], []
    for kind, label, v in bands:
        if kind == "hline":
            if y_range[0] <= v <= y_range[1]:
                shapes.append(_hline(v, color(name)))
                labels.append(dict(text=label.split(" = ")[-1], xref="paper", x=1.0, y=v, yref="y", xanchor="left",
                                   yanchor="middle", showarrow=False, font=dict(size=9, color=color(name))))
            else:
                (above if v > y_range[1] else below).append(label.split(" = ")[-1])
        elif kind == "curve":  # product clip: S/T = log C / T
            traces.append(dict(type="scatter", x=t_grid, y=v / t_grid, mode="lines", name=label, hoverinfo="skip",
                               showlegend=False,
                               line=dict(color=color(name), width=1.6, dash="dash")))
    lines = [label for kind, label, _ in bands if kind == "note"]
    if above and below:
        lines.append(f"band [{below[0]}, {above[0]}] lies off the chart:<br>every point is inside it")
    elif above or below:
        lines.append(f"band edge {(above or below)[0]} lies {'above' if above else 'below'} the chart")
    off = "<br>".join(lines)

    # under the plot, top to bottom: the x axis's title, the notes (room for two lines on every map, so the maps of
    # a row keep plot areas of one height), then the colour key of a metadata column (a legend, or a colour bar)
    notes_px = NOTE_LINE * max(2, off.count("<br>") + 1 if off else 0)
    key_top = NOTE_BELOW_AXIS + notes_px + 12  # px below the plot where the colour key starts (a gap over the notes)
    key_px = 0 if by is None else KEY_BAR if "colorscale" in by else KEY_ROW * _key_rows(len(by.get("key", ())))
    top = 64  # the name, and the counts under it
    # l: room for the y axis's labels and title on any batch (plotly's automatic margins take what they need; with
    # a margin that already holds them, a redraw with other numbers (a scenario switch) is one pass, not two)
    margin = dict(l=MAP_LEFT, r=40, t=top, b=key_top + key_px if key_px else NOTE_BELOW_AXIS + notes_px)
    height = height + key_px  # the colour key adds to the figure, not taken from its plot
    plot_px = max(height - margin["t"] - margin["b"], 1)
    labels_apart(labels, y_range, plot_px)  # mis_po's 1.001 and 0.996 sit 2 px apart on some maps

    for st_name, word in STATUS_WORDS.items():
        sel = valid & (status == st_name)
        marker = dict(color=STATUS_COLORS[st_name], symbol=STATUS_SYMBOLS[st_name], size=6,
                      opacity=0.8 if st_name != "dropped" else 0.9, line=dict(width=0))
        if by is not None:
            marker.update(color=by["color"][sel], size=7)
            if "colorscale" in by:  # under the notes: beside the plot it took a third of a map's width at 1600 px
                marker.update(colorscale=by["colorscale"], cmin=by["cmin"], cmax=by["cmax"],
                              showscale=st_name == "kept",
                              colorbar=dict(title=dict(text=color_by, side="top", font=dict(size=10)),
                                            thickness=8, len=0.9, orientation="h", x=0.0, xanchor="left",
                                            yanchor="top", yref="container", y=key_px / height,
                                            tickfont=dict(size=9)))
        traces.append(dict(type="scatter",   # SVG: a few hundred points draw faster than a WebGL context starts
            x=T[sel], y=y[sel], mode="markers", name=word, marker=marker, showlegend=False,
            text=by["text"][sel] if by is not None else None,
            customdata=custom[sel], hovertemplate=hover + f"<extra>{word}</extra>"))
    for value, c in (by or {}).get("key", ()):  # the categories' key, as a legend under the notes
        traces.append(dict(type="scatter", x=[None], y=[None], mode="markers", name=f"{color_by} = {value}",
                           marker=dict(color=c, size=7), hoverinfo="skip"))

    notes = list(labels)
    if off:  # under the axis title, not over the points
        notes.append(dict(text=off, xref="paper", yref="paper", x=0.0, y=0.0, xanchor="left", yanchor="top",
                          yshift=-NOTE_BELOW_AXIS, align="left", showarrow=False, font=dict(size=10, color="#555")))
    counts = {k: int((valid & (status == k)).sum()) for k in STATUS_WORDS}
    head = dict(text=f"<b>{title or name}</b>", x=0.0, xanchor="left", yref="container", y=1.0, yanchor="top",
                pad=dict(t=10), font=dict(size=14), subtitle=dict(text=" · ".join(
                    f"<span style='color:{STATUS_COLORS[k]}'>{n} {STATUS_WORDS[k]}</span>"
                    for k, n in counts.items()), font=dict(size=12, color="#666")))
    layout = base_layout(
        height=height, shapes=shapes, annotations=notes, legend="key" in (by or {}), margin=margin,
        xaxis=dict(type="log", title=dict(text="rollout length T (loss tokens)"), **log_ticks(lo, hi)),
        yaxis=dict(range=y_range, title=dict(text="S / T  (geometric log-ratio)"), zeroline=True,
                   zerolinecolor="#ddd", exponentformat="e", tickformat="~g"),
    )
    layout["title"] = head
    if by is not None and "key" in by:
        # placed from the figure's bottom (yref container): key_px above it is key_top under the plot, whatever
        # room the axes took (a paper-relative place moved with the plot's automatic margins)
        layout["legend"] = dict(orientation="h", x=0.0, xanchor="left", yref="container", y=key_px / height,
                                yanchor="top",
                                font=dict(size=10), itemwidth=30, tracegroupgap=0)
    return figure(traces, layout)


KEY_ROW, KEY_BAR = 18, 40  # px: a row of the categories' legend; the colour bar with its title


def _key_rows(n: int, per_row: int = 3) -> int:
    """Rows a legend of n categories takes under a map (about three entries fit a row of a map 300 px wide)."""
    return max(1, -(-n // per_row))


# ---------------------------------------------------------------------------------------------------------
# the token heatmap


CATASTROPHIC_L = math.log(10.0)  # a token whose ratio is off by 10x either way is marked (seqis.diagnosis.advice)
MASKED_GREY = "#d0d0d0"  # positions inside a rollout that carry no loss (a prompt, a tool's output)


def extents(offsets: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """(B,) each rollout's last loss position + 1 (0 without one), from the flat loss tokens (rollout j's are
    positions[offsets[j]:offsets[j + 1]]): where its masked positions end."""
    starts, ends = offsets[:-1], offsets[1:]
    last = positions[np.maximum(ends - 1, 0)] if len(positions) else np.zeros(len(ends), dtype=np.int64)
    return np.where(ends > starts, last.astype(np.int64) + 1, 0)


def masked_cells(values: np.ndarray, block: int, extent: np.ndarray) -> np.ndarray:
    """(R, C) bool: the blocks inside their rollout (before `extent`, its last loss position + 1) that hold no loss
    token: masked positions, greyed out, never coloured by their log-ratio."""
    starts = np.arange(values.shape[1]) * block  # (C,)
    return np.isnan(values) & (starts[None, :] < np.asarray(extent)[:, None])


def token_heatmap(
    values: np.ndarray,
    block: int,
    index: np.ndarray,
    *,
    dropped: np.ndarray | None = None,
    dropped_label: str = "",
    picked: int | None = None,
    extent: np.ndarray | None = None,
    height: int = 420,
    title: str | None = None,
) -> Figure:
    """Rollouts (rows, in the order of `index`: longest first) x positions (columns pooled over `block`
    positions: the signed log-ratio of largest magnitude in each block, over loss tokens only); the tokens whose
    gradient is dropped shaded grey by the fraction dropped; masked positions inside a rollout (`extent`: each row's
    last loss position + 1) light grey; the picked rollout marked. The colour range comes from the loss tokens
    (their 99th percentile of |l|): a catastrophic token (|l| > log 10) beyond it is marked with a cross, its value
    in the hover, not clipped away into the range's end colour."""
    R, C = values.shape
    x = (np.arange(C) * block + (block - 1) / 2.0) if block > 1 else np.arange(C, dtype=float)
    y = np.arange(R)
    finite = np.abs(values[np.isfinite(values)])
    zmax = max(float(np.quantile(finite, 0.99)) if finite.size else 1.0, 1e-4)
    ids = [str(int(i)) for i in index]
    traces = []
    if extent is not None:
        masked = masked_cells(values, block, extent)
        if masked.any():
            traces.append(dict(type="heatmap", z=np.where(masked, 1.0, np.nan), x=x, y=y, zmin=0.0, zmax=1.0,
                               showscale=False, colorscale=[[0.0, MASKED_GREY], [1.0, MASKED_GREY]],
                               hovertemplate="row %{y}<br>positions ~%{x:.0f}<br>masked: no loss<extra></extra>",
                               name="masked"))
    traces.append(dict(type="heatmap",
        z=np.round(values, 4), x=x, y=y, zmin=-zmax, zmax=zmax, zmid=0.0, colorscale="RdBu_r",
        # the colour bar's title above it: beside it, it ran into the "0" tick label
        colorbar=dict(title=dict(text="l_t", side="top"), thickness=12, len=0.9),
        hovertemplate="row %{y}<br>positions ~%{x:.0f}<br>l = %{z:.4g}<extra></extra>", name="log-ratio"))
    if dropped is not None:
        d = np.where(dropped > 0, np.round(dropped, 3), np.nan)
        if np.isfinite(d).any():
            traces.append(dict(type="heatmap",
                z=d, x=x, y=y, zmin=0.0, zmax=1.0, showscale=False,
                colorscale=[[0.0, "rgba(50,50,50,0.25)"], [1.0, "rgba(50,50,50,0.6)"]],
                hovertemplate="row %{y}<br>positions ~%{x:.0f}<br>dropped %{z:.0%}"
                              f"<extra>{dropped_label}</extra>",
                name=f"dropped ({dropped_label})"))
    rows_c, cols_c = np.nonzero(np.nan_to_num(np.abs(values)) > max(CATASTROPHIC_L, zmax))
    if len(rows_c):
        traces.append(dict(type="scatter", x=x[cols_c], y=rows_c, mode="markers", name="catastrophic",
                           marker=dict(symbol="x-thin-open", size=9, color="#111111",
                                       line=dict(width=2, color="#111111")),
                           customdata=np.round(values[rows_c, cols_c], 3),
                           hovertemplate="row %{y}<br>positions ~%{x:.0f}<br>l = %{customdata} (beyond the colour "
                                         "range)<extra>catastrophic</extra>"))
    shapes, notes = [], []
    rows = np.flatnonzero(np.asarray(index) == picked) if picked is not None else []
    if len(rows):
        r = int(rows[0])
        shapes.append(dict(type="rect", xref="paper", x0=0, x1=1, yref="y", y0=r - 0.5, y1=r + 0.5,
                           line=dict(color="#f2a541", width=1.5)))
    step = max(1, R // 8)
    layout = base_layout(height=height, title=title, legend=False, shapes=shapes, annotations=notes,
                     yaxis=dict(autorange="reversed", title=dict(text="rollouts, longest first"),
                                tickvals=list(range(0, R, step)), ticktext=ids[::step]),
                     # the ticks are positions (a column's centre); the pooling is said beside them
                     xaxis=dict(title=dict(text=f"position t (one column per {block} positions)" if block > 1
                                           else "position t")))
    layout["margin"] = dict(l=80, r=96, t=48 if title else 10, b=56)  # what its labels and colour bar take
    return figure(traces, layout)


# ---------------------------------------------------------------------------------------------------------
# per-token gradient coefficients of one rollout


def step_points(y: np.ndarray) -> np.ndarray:
    """Indices of the points a step line (shape "hv") needs to draw y exactly: the first point of each run of
    equal values, and the last point."""
    n = len(y)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    starts = np.flatnonzero(np.concatenate([[True], y[1:] != y[:-1]]))
    return starts if starts[-1] == n - 1 else np.append(starts, n - 1)


def coefficient_plot(
    positions: np.ndarray,
    log_ratio: np.ndarray,
    coefficients: Mapping[str, np.ndarray],
    *,
    height: int = 380,
    title: str | None = None,
) -> Figure:
    """Each estimator's gradient coefficient on every loss token of one rollout (top; dashes differ so
    coinciding lines stay visible, the legend gives the mean), and the tokens' log-ratios l_t (bottom)."""
    traces = []  # SVG paths: one path per line draws fast; no WebGL context to start
    positions = np.asarray(positions)
    for i, (name, coef) in enumerate(coefficients.items()):
        coef = np.asarray(coef)
        mean = float(np.mean(coef)) if len(coef) else 0.0
        keep = step_points(coef)  # a sequence-level weight is one run: 2 points instead of thousands
        traces.append(dict(type="scatter", x=positions[keep], y=coef[keep], mode="lines",
                           name=f"{name} (mean {mean:.3g})",
                           line=dict(color=color(name), width=2.2 if i == 0 else 1.8, dash=dash(i), shape="hv"),
                           hovertemplate=f"{name}<br>t = %{{x}}<br>coefficient = %{{y:.4g}}<extra></extra>"))
    many = len(positions) > 1500  # thousands of markers are thousands of SVG nodes: a thin line instead
    traces.append(dict(type="scatter", x=positions, y=log_ratio, mode="lines" if many else "markers", name="l_t",
                       yaxis="y2", showlegend=False, line=dict(color="rgba(90,90,90,0.55)", width=0.7),
                       marker=dict(color="rgba(90,90,90,0.55)", size=3),
                       hovertemplate="t = %{x}<br>l_t = %{y:.4g}<extra></extra>"))
    layout = base_layout(height=height, title=title,
                     xaxis=dict(title=dict(text="position t"), anchor="y2"),
                     yaxis=dict(title=dict(text="coefficient"), domain=[0.38, 1.0], rangemode="tozero"),
                     yaxis2=dict(title=dict(text="l_t"), domain=[0.0, 0.3], zeroline=True, zerolinecolor="#bbb"))
    layout["legend"] = dict(orientation="h", yanchor="top", y=-0.25, x=0.0, font=dict(size=11))
    layout["margin"] = {**layout["margin"], "l": 90, "r": 16, "b": 126}  # what its labels and legend take (one pass)
    return figure(traces, layout)


# ---------------------------------------------------------------------------------------------------------
# weights and the effective batch


def weight_histograms(hists: Mapping[str, Mapping], *, height: int = 340, title: str | None = None) -> Figure:
    """Counts of log10 of the applied token weights (kept tokens), one step line per estimator on shared
    bins; the two end bins collect weights below 1e-3 and above 1e3. Dropped tokens are in the legend."""
    lo, hi = HIST_LOG10_RANGE
    width = (hi - lo) / HIST_BINS
    centers = np.concatenate([[lo - width], lo + width * (np.arange(HIST_BINS) + 0.5), [hi + width]])
    traces, top = [], 1.0
    floor = 0.5  # zero counts sit below the axis, so a one-bin spike still draws as a spike
    for i, (name, h) in enumerate(hists.items()):
        counts = np.asarray(h["counts"], dtype=float)
        top = max(top, float(counts.max()) if counts.size else 1.0)
        traces.append(dict(type="scatter",
            x=centers, y=np.maximum(counts, floor), customdata=counts, mode="lines",
            line=dict(color=color(name), width=2.2 if i == 0 else 1.8, dash=dash(i), shape="hvh"),
            name=f"{name} (dropped {h['dropped']:,})",
            hovertemplate=f"{name}<br>log10 w ≈ %{{x:.2f}}<br>tokens = %{{customdata:,.0f}}<extra></extra>"))
    inner = list(range(int(lo) + 1, int(hi)))
    layout = base_layout(
        height=height, title=title,
        xaxis=dict(tickvals=[lo - width, *inner, hi + width], tickangle=0,
                   ticktext=[f"≤{10**lo:g}", *[f"{10.0**t:g}" for t in inner], f"≥{10**hi:g}"],
                   title=dict(text="applied token weight (log scale)"), range=[lo - 2 * width, hi + 2 * width]),
        yaxis=dict(type="log", dtick=1, title=dict(text="kept tokens"),
                   range=[math.log10(0.8), math.log10(top * 2.5)]))
    return figure(traces, layout)


FEW_BARS = 4  # estimators whose survival bars keep their words and printed values
DIAMOND = 0.04  # a theory diamond's half-height on the effective-batch chart, in its y units (fractions)


def effective_bars(
    effective: Mapping[str, Mapping[str, float]],
    theory: Mapping[str, Mapping[str, float]] | None = None,
    *,
    height: int = 300,
    title: str | None = None,
) -> Figure:
    """What survives per estimator: tokens kept, rollouts accepted, ESS of the applied rollout weights over the
    valid rollouts; theory's expected fraction of rollouts accepted (Gaussian closed forms) as black diamonds
    (say so in the title: the chart has no legend). Past FEW_BARS estimators the bars lie down, one row each, the
    estimators' names on the left (standing, their names and values ran into each other at 900 px; a row needs
    height, which a page has, not width): make the figure survival_px(n) tall."""
    names = list(effective)
    many = len(names) > FEW_BARS
    series = [("tokens", "tokens_kept_frac", 1.0), ("rollouts", "rollouts_kept_frac", 0.7), ("ESS", "ess_frac", 0.45)]
    c0 = [n for n in names for _ in series]  # the two levels of each bar's category: estimator, quantity
    c1 = [label for _ in names for label, _, _ in series]
    v = [effective[n][key] for n in names for _, key, _ in series]
    colors = [alpha(color(n), a) for n in names for _, _, a in series]
    expected = {(n, "rollouts"): theory[n]["rollouts_kept_frac"] for n in names
                if "rollouts_kept_frac" in (theory or {}).get(n, {})}
    # each value's label just past its bar, or past the theory's diamond where that sits at or beyond the bar's
    # end (a diamond is ±DIAMOND along the value axis: its half-size on this chart), so no label covers a diamond
    lift = [max(x, expected[key] + DIAMOND) if key in expected and expected[key] > x - DIAMOND else x
            for key, x in zip(zip(c0, c1), v)]
    across, along = ("y", "x") if many else ("x", "y")  # the category axis, the value axis
    traces = [{"type": "bar", across: [c0, c1], along: v, "orientation": "h" if many else "v",
               "marker": dict(color=colors, line=dict(width=0)), "showlegend": False, "name": "kept",
               "hovertemplate": f"%{{{across}}}: %{{{along}:.1%}}<extra></extra>"},
              {"type": "scatter", across: [c0, c1], along: lift, "mode": "text", "text": [f"{x:.0%}" for x in v],
               "textposition": "middle right" if many else "top center", "textfont": dict(size=10),
               "cliponaxis": False, "showlegend": False, "hoverinfo": "skip"}]
    if expected:
        traces.append({"type": "scatter", across: [[n for n, _ in expected], [k for _, k in expected]],
                       along: list(expected.values()), "mode": "markers", "name": "theory: rollouts accepted",
                       "marker": dict(symbol="diamond", size=10, color="black"),
                       "hovertemplate": f"%{{{across}}}<br>theory: %{{{along}:.1%}} of rollouts accepted"
                                        "<extra></extra>"})
    values = dict(range=[0, 1.12 + DIAMOND], tickformat=".0%")
    categories = dict(tickfont=dict(size=9), tickangle=0, **({"autorange": "reversed"} if many else {}))
    layout = base_layout(height=survival_px(len(names)) if many else height, title=title, bargap=0.15, legend=False,
                         **{f"{along}axis": values, f"{across}axis": categories})
    return figure(traces, layout)


def _title_lines(text: str) -> str:
    """"Head: the rest" as the head in bold and, under it, the rest in smaller type (plotly never wraps an
    annotation: on one line, the effective batch's title ran past a chart half of a 900 px window)."""
    head, _, rest = text.partition(": ")
    return f"<b>{head}</b>" + (f"<br><span style='font-size:11px;color:#555'>{rest}</span>" if rest else "")


def survival_px(n: int) -> int:
    """The plot height effective_bars needs for n estimators: 200 px standing, 16 px a bar lying down."""
    return 200 if n <= FEW_BARS else 16 * 3 * n


def stacked(top: Figure, bottom: Figure, *, top_px: int = 240, bottom_px: int = 200,
            between_px: int = 110) -> Figure:
    """Two of these figures as one (one chart for the browser to build, not two), one above the other so that it
    holds at any width: top's traces on x/y with its legend above it, bottom's on x2/y2 without one; each keeps
    its axes, and its title goes above its plot."""
    to, bo = dict(data=top.traces, layout=top.spec_layout), dict(data=bottom.traces, layout=bottom.spec_layout)
    tl, bl = to["layout"], bo["layout"]
    # room over the plots for the legend's rows (about two entries a row at 900 px), so that plotly, which widens
    # the top margin to fit them, does not take it from the plots: their rows of bars would squeeze together
    entries = sum(1 for t in to["data"] if t.get("showlegend", True) is not False)
    margin = dict(l=60, r=10, t=34 + 20 * -(-entries // 2), b=48)  # l: its labels' room (one pass)
    area = top_px + between_px + bottom_px  # the plot area's height in pixels; domains are fractions of it
    split = 1 - top_px / area  # top plot: [split, 1]; bottom plot: [0, low]
    low = bottom_px / area
    layout = {**tl, "height": area + margin["t"] + margin["b"], "margin": margin, "title": None}
    layout["yaxis"] = {**tl.get("yaxis", {}), "domain": [split, 1.0]}
    layout["xaxis"] = {**tl.get("xaxis", {}), "anchor": "y"}
    layout["xaxis2"] = {**bl.get("xaxis", {}), "anchor": "y2"}
    layout["yaxis2"] = {**bl.get("yaxis", {}), "domain": [0.0, low], "anchor": "x2"}
    # top's legend at the figure's top, above its title, outside the plots (between the two charts, an entry per
    # estimator wrapped onto the bottom chart at 900 px; beside them, it took half the width)
    layout["legend"] = {**tl.get("legend", {}), "orientation": "h", "x": 0.0, "xanchor": "left", "yref": "container",
                        "y": 1.0, "yanchor": "top", "font": dict(size=11)}
    for key in ("bargap", "barmode"):
        if key in bl:
            layout[key] = bl[key]
    titles = [(1.0, tl.get("title")), (low, bl.get("title"))]
    layout["annotations"] = [*tl.get("annotations", ()), *bl.get("annotations", ()), *(
        dict(text=_title_lines(t["text"]), x=0.0, xref="paper", xanchor="left", y=y, yref="paper", yanchor="bottom",
             yshift=6, align="left", showarrow=False, font=t.get("font", {}))
        for y, t in titles if t and t.get("text"))]
    traces = [*to["data"], *({**t, "xaxis": "x2", "yaxis": "y2", "showlegend": False} for t in bo["data"])]
    return figure(traces, layout)
