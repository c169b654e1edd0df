"""Every chart of the explorer: a plotly figure drawn by one small component that keeps its node between reruns
and updates it in place (Plotly.react), instead of st.plotly_chart, which draws a changed figure anew (Streamlit
puts the figure into the element's identity). A slider move then costs the browser the changed traces, not a new
chart. Figures keep the look Streamlit's theme gave them (style.CHART_TEMPLATE); a click on a point can rerun
the page with that point (`click=True`)."""

from __future__ import annotations

import json
import weakref
from pathlib import Path

import plotly.io as pio
import streamlit as st

from . import plotly_js
from .style import CHART_CONFIG, CHART_TEMPLATE

_HERE = Path(__file__).resolve().parent
_PLOTLY = plotly_js.publish()  # the plotly.js file app/static/ serves (server.enableStaticServing)
_VERSION = plotly_js.wanted()  # in its URL: a new version is a new URL, so no browser keeps a stale one
_mount = st.components.v2.component("seqis_chart", js=(_HERE / "chart.js").read_text(), isolate_styles=False)
_json: dict[int, str] = {}  # id(figure) -> its JSON while the figure lives (cached figures repeat)


def figure_json(fig) -> str:
    """The figure as plotly JSON with the explorer's template, serialized once per figure object."""
    text = _json.get(id(fig))
    if text is None:
        spec = fig.to_plotly_json()
        spec["layout"] = {**spec.get("layout", {}), "template": CHART_TEMPLATE}  # not plotly's default template
        text = _json[id(fig)] = pio.to_json(spec, validate=False, engine="auto")
        weakref.finalize(fig, _json.pop, id(fig), None)
    return text


def _plotly_url() -> str:
    return f"{_base()}app/static/{_PLOTLY}?v={_VERSION}"


def payload(fig, *, click: bool = False) -> bytes:
    """What the component receives: the figure, plotly's config, where plotly.js lives, whether clicks report."""
    head = json.dumps(dict(config=CHART_CONFIG, click=click, plotly=_plotly_url()))
    return (head[:-1] + ', "figure": ' + figure_json(fig) + "}").encode()


def _base() -> str:
    path = (st.get_option("server.baseUrlPath") or "").strip("/")
    return f"/{path}/" if path else "/"


def chart(fig, *, key: str, click: bool = False) -> dict | None:
    """Draw `fig` in the current container under `key` (stable across reruns: the node is kept and updated).
    With click=True, returns the clicked point ({"x", "y", "curve", "index", "customdata", "name"}) on the rerun
    a click causes, else None."""
    result = _mount(data=payload(fig, click=click), key=key, width="stretch",
                    **({"on_click_change": lambda: None} if click else {}))
    return getattr(result, "click", None) if click else None


def preload() -> None:
    """Load plotly.js in the browser once the page is idle (the app frame calls it on every page), so a page
    reached from one without charts (Learn -> Explore) does not wait for it."""
    _mount(data=json.dumps(dict(plotly=_plotly_url())).encode(), key="seqis.chart.preload", height=0)

