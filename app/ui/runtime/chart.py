"""Every chart of the explorer: a plotly figure drawn by one small component that keeps its node between reruns
and updates it in place (Plotly.react), instead of st.plotly_chart, which draws a changed figure anew (Streamlit
puts the figure into the element's identity). A slider move then costs the browser the changed traces, not a new
chart. Figures keep the look Streamlit's theme gave them (style.CHART_TEMPLATE); a click on a point can rerun
the page with that point (`click=True`). In presenter mode (state.present) every font is scaled by PRESENT_SCALE,
so a chart reads from the back of a room."""

from __future__ import annotations

import json
import weakref
from pathlib import Path

import plotly.io as pio
import streamlit as st

from .. import plotly_js
from ..state import present
from ..style import CHART_CONFIG, CHART_TEMPLATE, FONT

_HERE = Path(__file__).resolve().parent
_PLOTLY = plotly_js.publish()  # the plotly.js file app/static/ serves (server.enableStaticServing)
_VERSION = plotly_js.wanted()  # in its URL: a new version is a new URL, so no browser keeps a stale one
_mount = st.components.v2.component("seqis_chart", js=(_HERE / "chart.js").read_text(), isolate_styles=False)
_json: dict[tuple[int, float], str] = {}  # (id(figure), font scale) -> its JSON while the figure lives
PRESENT_SCALE = 1.45  # presenter mode: 12 px ticks become 17 px, a 15 px title 22 px
_FONTS = ("font", "tickfont", "textfont", "titlefont", "insidetextfont", "outsidetextfont")


def scaled_fonts(node, k: float):
    """A copy of a plotly spec (dicts and lists) with every font size multiplied by k, and every font without a
    size given the page's size times k (so the template's default grows too)."""
    if isinstance(node, list):
        return [scaled_fonts(v, k) for v in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, v in node.items():
        if key in _FONTS and isinstance(v, dict):
            out[key] = {**scaled_fonts(v, k), "size": round(v.get("size", FONT["size"]) * k, 1)}
        else:
            out[key] = scaled_fonts(v, k)
    return out


def figure_json(fig, scale: float = 1.0) -> str:
    """The figure as plotly JSON with the explorer's template (fonts times `scale`), serialized once per figure
    object and scale. A larger scale also gives the figure room: its height and top margin grow with it."""
    text = _json.get((id(fig), scale))
    if text is None:
        spec = fig.to_plotly_json()
        layout = {**spec.get("layout", {}), "template": CHART_TEMPLATE}  # not plotly's default template
        if scale != 1.0:
            layout = scaled_fonts(layout, scale)
            layout["font"] = {**layout.get("font", {}), "size": round(FONT["size"] * scale, 1)}
            if "height" in layout:
                layout["height"] = round(layout["height"] * (1 + (scale - 1) / 2))
            margin = layout.get("margin", {})
            if "t" in margin:
                layout["margin"] = {**margin, "t": round(margin["t"] * scale)}
            legend = layout.get("legend", {})
            if isinstance(legend.get("y"), (int, float)) and legend["y"] < 0:  # a legend under the x axis: the
                layout["legend"] = {**legend, "y": legend["y"] * scale**1.5}  # axis's labels grew, move it down
        spec["layout"] = layout
        text = _json[(id(fig), scale)] = pio.to_json(spec, validate=False, engine="auto")
        weakref.finalize(fig, _json.pop, (id(fig), scale), None)
    return text


def _plotly_url() -> str:
    return f"{_base()}app/static/{_PLOTLY}?v={_VERSION}"


def payload(fig, *, click: bool = False, scale: float = 1.0) -> bytes:
    """What the component receives: the figure, plotly's config, where plotly.js lives, whether clicks report."""
    head = json.dumps(dict(config=CHART_CONFIG, click=click, plotly=_plotly_url()))
    return (head[:-1] + ', "figure": ' + figure_json(fig, scale) + "}").encode()


def _base() -> str:
    path = (st.get_option("server.baseUrlPath") or "").strip("/")
    return f"/{path}/" if path else "/"


def _scale() -> float:
    """The charts' font scale: PRESENT_SCALE in presenter mode."""
    return PRESENT_SCALE if present() else 1.0


def prepare(*figs) -> None:
    """Serialize figures now (figure_json keeps the text while a figure lives): a run that computes everything it
    draws before it draws any of it sends its deltas together, and the browser renders them once."""
    for fig in figs:
        figure_json(fig, _scale())


def chart(fig, *, key: str, click: bool = False, scale: float | None = None) -> dict | None:
    """Draw `fig` in the current container under `key` (stable across reruns: the node is kept and updated).
    With click=True, returns the clicked point ({"x", "y", "curve", "index", "customdata", "name"}) on the rerun
    a click causes, else None. `scale`: the font scale, if not the page's (Lessons' presenter mode asks more)."""
    result = _mount(data=payload(fig, click=click, scale=scale or _scale()), key=key, width="stretch",
                    **({"on_click_change": lambda: None} if click else {}))
    return getattr(result, "click", None) if click else None


def preload() -> None:
    """Load plotly.js in the browser once the page is idle (the app frame calls it on every page), so a page
    reached from one without charts (Learn -> Explore) does not wait for it."""
    _mount(data=json.dumps(dict(plotly=_plotly_url())).encode(), key="seqis.chart.preload", height=0)

