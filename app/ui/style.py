"""The explorer's look, in one place: colours (every estimator keeps one colour on every page), line dashes,
fonts, the base plotly layout and tick helpers. Chart modules import these; nothing here draws a chart."""

from __future__ import annotations

import plotly.graph_objects as go

from seqis import ESTIMATORS

# One palette for every series: a colour per registry estimator (its row picks it: seq_tis blue, seq_mis vermilion,
# geo_mask teal, mis_po purple, pg amber, seq_is slate, token_tis crimson, icepop green, seq_mis_product brown,
# geo_is sky, prefix_is olive, max_mask pink), then colours for series that are not estimators (a true gradient,
# a fit, a framework's preset); any two differ by CIE76 delta-E >= 20 (tests/test_app_style.py), so no two
# estimators look alike on a chart.
PALETTE = ["#3b6fd8", "#e4572e", "#17a398", "#8e44ad", "#f2a541", "#5c6f7b", "#c2185b", "#2e7d32", "#795548",
           "#56b4e9", "#bcbd22", "#f781bf"]
EXTRA = ["#111111", "#9e9e9e", "#1a237e", "#827717", "#aa00ff", "#64dd17"]  # series that are not estimators
STATUS_COLORS = {"kept": "#3b6fd8", "clipped": "#f2a541", "dropped": "#d62728"}
STATUS_SYMBOLS = {"kept": "circle", "clipped": "diamond", "dropped": "x"}
DASHES = ["solid", "dash", "dot", "dashdot", "longdash", "longdashdot"]
# the page's own typeface first (Streamlit serves Source Sans to the page, so charts read as part of it); system
# sans fonts where it is missing (a PNG export)
FONT = dict(family='"Source Sans", "Source Sans Pro", Inter, -apple-system, "Segoe UI", Helvetica, Arial, sans-serif',
            size=12)
TITLE_SIZE = 14
# chart toolbar ("modebar") hidden until hover and kept off titles; no plotly logo
CHART_CONFIG = {"displaylogo": False, "modeBarButtonsToRemove": ["lasso2d", "select2d"]}
# axes: light grids, room for their labels, no tick marks (plotly draws dark ones beside a heatmap's labels unless
# told), axis titles a size over the tick labels
_AXIS = dict(gridcolor="#e6eaf1", zerolinecolor="#d5dae5", linecolor="#d5dae5", automargin=True, ticks="",
             title=dict(standoff=8, font=dict(size=13)), tickfont=dict(color="#5f6270"))
# what every chart in the app starts from (ui/runtime/chart.py adds it; a figure's own settings win): white, light
# grids, axes that make room for their labels, the estimator palette for unnamed series; the page's font on every chart
# (also those built without base_layout), bold titles, tick labels a few px off the plot (margin.pad: without it
# "0" of x and "-0.2" of y meet in the corner), as Streamlit's own plotly theme drew them before ui/runtime/chart.py
CHART_TEMPLATE = dict(layout=dict(
    colorway=PALETTE, paper_bgcolor="#ffffff", plot_bgcolor="#ffffff", font=dict(FONT, color="#31333f"),
    title=dict(font=dict(weight="bold")), margin=dict(pad=6),
    xaxis=_AXIS, yaxis=_AXIS, hoverlabel=dict(bgcolor="#ffffff", font=dict(family=FONT["family"])),
    legend=dict(bgcolor="rgba(0,0,0,0)"), colorscale=dict(sequential="Viridis"),
))


PRESET_COLOR = EXTRA[2]  # a framework's preset (Explore shows one beside the estimators): none of theirs


def estimator_color(name: str) -> str:
    """The estimator's colour: its row in the registry picks it; a preset key gets PRESET_COLOR."""
    names = list(ESTIMATORS)
    return PALETTE[names.index(name) % len(PALETTE)] if name in names else PRESET_COLOR


def series_color(series: str, i: int = 0) -> str:
    """The estimator's colour if `series` names a registry estimator or starts with one ("mis_po trajectory band",
    "seq_mis_product: w <= 2"; the longest name that fits), else EXTRA's i-th."""
    fits = [n for n in ESTIMATORS if series == n or series.startswith((n + " ", n + ":"))]
    return estimator_color(max(fits, key=len)) if fits else EXTRA[i % len(EXTRA)]


def column_colors(names, runs: dict[str, str] | None = None) -> dict[str, str]:
    """A colour per shown series, all different: the colour of the registry estimator a series runs (`runs`: series
    -> estimator name, else the series' own name), unless an earlier series took it; every other series (a preset;
    a second clip of one estimator) the first colour of the palette no series has (Compare shows several presets
    side by side)."""
    runs = runs or {}
    own: dict[str, str] = {}
    for n in names:
        e = runs.get(n, n)
        if e in ESTIMATORS and estimator_color(e) not in own.values():
            own[n] = estimator_color(e)
    free = iter(c for c in [*PALETTE, *EXTRA] if c not in own.values())
    return {n: own[n] if n in own else next(free, PRESET_COLOR) for n in names}


def dash(i: int) -> str:
    """Line dashes by position, so estimators whose lines coincide stay visible."""
    return DASHES[i % len(DASHES)]


def alpha(hex_color: str, a: float) -> str:
    """#rrggbb as rgba with opacity a."""
    h = hex_color.lstrip("#")
    r, g, b = (int(h[i:i + 2], 16) for i in (0, 2, 4))
    return f"rgba({r},{g},{b},{a})"


def log_ticks(lo: float, hi: float) -> dict:
    """Plain tick labels at 1-3-10 steps for a log axis spanning [lo, hi] (at least two ticks)."""
    vals = [m * 10**k for k in range(-1, 7) for m in (1, 3) if lo / 1.5 <= m * 10**k <= hi * 1.5]
    if len(vals) > 4:  # a narrow chart: decades only, so the labels stay level and apart
        vals = [v for v in vals if f"{v:g}".lstrip("0.").startswith("1")]
    if len(vals) < 2:  # a narrow span (every rollout about as long): label its ends
        vals = sorted({float(lo), float(hi)})
    return dict(tickvals=vals, ticktext=[f"{v:,.0f}" if v >= 1 else f"{v:g}" for v in vals], tickangle=0)


def base_layout(*, height: int, title: str | None = None, legend: bool = True, **extra) -> dict:
    """A figure's layout as a plain dict. No template: ui/runtime/chart.py adds CHART_TEMPLATE when it draws (a template
    in every figure would cost ~15 ms of validation per figure and rerun); png.to_png adds it too."""
    layout = dict(
        height=height,
        margin=dict(l=10, r=10, t=56 if title else 10, b=10 if not legend else 30),
        title=dict(text=title, x=0.0, xanchor="left", y=0.98, yanchor="top", font=dict(size=TITLE_SIZE))
        if title else None,
        font=FONT,
        showlegend=legend,
        legend=dict(orientation="h", yanchor="top", y=-0.28, xanchor="left", x=0.0, font=dict(size=12)),
        hoverlabel=dict(font=dict(size=12)),
    )
    layout.update(extra)
    return layout


def labels_apart(labels: list[dict], y_range, plot_px: float) -> None:
    """Give annotations that label horizontal lines beside a plot (each a dict with "y" in axis units: log10 on a
    log axis) a yshift in px so no two boxes touch (centres a line of their type apart: an annotation's box is
    about 1.65 times its font size tall); each keeps its order, and a crowded run spreads about its mean position
    (the others stay on their lines)."""
    if len(labels) < 2:
        return
    gap = 1.7 * max(a.get("font", {}).get("size", 12) for a in labels) + 1  # px between two centres
    per = plot_px / max(y_range[1] - y_range[0], 1e-12)  # px per unit of y
    order = sorted(range(len(labels)), key=lambda i: labels[i]["y"])
    want = [(labels[i]["y"] - y_range[0]) * per for i in order]
    groups = [[k] for k in range(len(want))]  # runs of labels a gap apart about their mean position

    def spots(g: list[int]) -> list[float]:
        mid = sum(want[k] for k in g) / len(g)
        return [mid + (j - (len(g) - 1) / 2) * gap for j in range(len(g))]

    merged = True
    while merged:  # merge two neighbouring runs while they overlap
        merged = False
        for a in range(len(groups) - 1):
            if spots(groups[a])[-1] + gap > spots(groups[a + 1])[0] + 1e-9:
                groups[a:a + 2] = [groups[a] + groups[a + 1]]
                merged = True
                break
    for g in groups:
        for k, at in zip(g, spots(g), strict=True):
            labels[order[k]]["yshift"] = round(at - want[k], 1)


def two_lines(title: str) -> tuple[dict, bool]:
    """A layout title for "Head: the rest" as the head and, under it in smaller type, the rest; and whether it
    has a second line (the chart then needs about 76 px above its plot). Plotly never wraps a title: a long one is
    cut where the chart is half or a third of a 900 px window."""
    head, _, rest = title.partition(": ")
    if not rest:
        return dict(text=head), False
    return dict(text=head, subtitle=dict(text=rest, font=dict(size=12, color="#555")), yref="container", y=1.0,
                yanchor="top", pad=dict(t=12)), True


def titled(fig: go.Figure, title: str, *, height: int = 420, legend_below: bool = True) -> go.Figure:
    """Give an existing figure the explorer's title, size and margins (the lab pages' charts)."""
    fig.update_layout(title=dict(text=title, x=0, xanchor="left", y=0.98, yanchor="top",
                                 font=dict(size=TITLE_SIZE + 1)),
                      height=height, margin=dict(l=10, r=10, t=56, b=10), hovermode="closest", font=FONT)
    if legend_below:
        # at the figure's bottom (yref container) with room kept for its rows (about two entries a row at 900 px)
        # under the x axis's labels and title; placed under the plot (y=-0.18 of its height) it sat on the tick
        # labels of a short chart
        entries = sum(1 for t in fig.data if t.showlegend is not False and t.name)
        rows = -(-entries // 2)
        fig.update_layout(legend=dict(orientation="h", yref="container", y=0.0, yanchor="bottom", xanchor="left", x=0),
                          margin_b=LEGEND_ABOVE + LEGEND_ROW * rows, height=height + LEGEND_ROW * rows)
    return fig


LEGEND_ABOVE, LEGEND_ROW = 64, 20  # px under a plot for its x axis's labels and title; a row of a legend


# Columns wrap instead of squeezing: each keeps at least 240 px, so four rollout maps stand side by side at 1600 px
# and stack at 900 px, and metric labels and chart titles keep their room; a container keyed "narrow..." holds
# controls that may shrink to 140 px (Explore's estimator picker keeps 400 px, room for four chips: a multiselect
# does not wrap its chips, it scrolls them out of sight). A chart's toolbar (plotly's modebar, shown on hover) sits
# in a strip above the chart (12 px of padding and the 16 px gap between elements), not over the chart's title:
# inside the chart it hid the right half of any title longer than half the chart (14 of the 23 charts of six pages
# at 900 px, 6 at 1600). A plain table's headers wrap (a preset key in a header no longer sets a column's width),
# and a table wider than its column scrolls sideways in its own box, with a scrollbar that shows.
RESPONSIVE_CSS = """<style>
[data-testid="stMain"] [data-testid="stHorizontalBlock"] { flex-wrap: wrap; row-gap: 1rem; }
[data-testid="stMain"] [data-testid="stColumn"] { min-width: min(240px, 100%); }
[data-testid="stMain"] [class*="st-key-narrow"] [data-testid="stColumn"] { min-width: min(140px, 100%); }
[data-testid="stMain"] .st-key-narrow-ex-controls [data-testid="stColumn"]:first-child { min-width: min(400px, 100%); }
[data-testid="stMain"] [data-testid="stTable"] th { white-space: normal; overflow-wrap: break-word; }
[data-testid="stMain"] [data-testid="stTable"] > div { overflow-x: auto; scrollbar-width: thin; }
.seqis-chart { padding-top: 12px; }
.seqis-chart .modebar-container { top: -28px !important; }
</style>"""


# Presenter mode (?present=1): the page's own text a size up too (charts scale in ui/runtime/chart.py), the top
# toolbar gone
PRESENT_CSS = """<style>
[data-testid="stMain"] { font-size: 1.1rem; }
[data-testid="stMain"] h1 { font-size: 2.3rem; padding-top: 0.25rem; }
[data-testid="stMainBlockContainer"] { padding-top: 1.5rem; }
[data-testid="stToolbar"] { display: none; }
</style>"""

# ... and on Lessons nothing but the screen: no sidebar, no button to open it, no header over "Lesson N of M"; every
# text at least 22 px (a projector's back row), the title larger, the page's padding small so 720 px hold a screen
PRESENT_LESSON_CSS = """<style>
[data-testid="stSidebar"], [data-testid="stSidebarCollapsedControl"], [data-testid="stExpandSidebarButton"],
[data-testid="stHeader"] { display: none; }
[data-testid="stMainBlockContainer"] { padding-top: 0.75rem; padding-bottom: 1rem; max-width: 100%; }
[data-testid="stMain"] :is(p, li, label, span, button, summary, input, td, th,
  [data-testid="stCaptionContainer"], [data-testid="stMarkdownContainer"]) { font-size: 22px !important; }
[data-testid="stApp"] [data-testid="stMain"] :is(h1, h1 *) { font-size: 1.75rem !important; }
[data-testid="stMain"] h1 { padding: 0.1rem 0 0.3rem 0; }
[data-testid="stMain"] [data-testid="stVerticalBlock"] { gap: 0.55rem; }
</style>"""
