"""How the AppTest tests open a page of the explorer: the whole app (its frame and navigation), one view."""

import sys
from pathlib import Path

from streamlit.testing.v1 import AppTest

APP = str(Path(__file__).resolve().parent.parent / "app" / "streamlit_app.py")
if str(Path(APP).parent) not in sys.path:  # the app's own `ui` package, as `streamlit run app` finds it
    sys.path.insert(0, str(Path(APP).parent))
from ui.plotly_js import CARTESIAN_TRACES  # noqa: E402


def open_view(view: str, *, timeout: float = 120, **params) -> AppTest:
    """The app on `view` (e.g. "views/run.py") with `params` in the URL, run once, with no exception."""
    at = AppTest.from_file(APP, default_timeout=timeout)
    at.query_params.update(params)
    at.switch_page(view).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


PLOTLY_JS_UNDERSCORED = {"paper_bgcolor", "plot_bgcolor", "error_x", "error_y", "error_z"}  # its own such names


def charts(at: AppTest) -> list[dict]:
    """The plotly figures the page drew (ui/runtime/chart.py's component), in page order, each validated by plotly (the
    app sends them unvalidated: an invalid property fails here) and drawable by the cartesian bundle the browser
    may load (ui/plotly_js.py)."""
    import json

    import plotly.graph_objects as go

    out = []

    def plotly_names(node, path="figure"):  # a "_" in a name: plotly.py's magic underscore, which plotly.js never reads
        if isinstance(node, dict):
            for k, v in node.items():
                assert "_" not in k or k in PLOTLY_JS_UNDERSCORED, f"{path}.{k}: no such property in plotly.js"
                plotly_names(v, f"{path}.{k}")
        elif isinstance(node, list):
            for i, v in enumerate(node):
                plotly_names(v, f"{path}[{i}]")

    for e in at.get("bidi_component"):
        fig = json.loads(e.proto.bytes).get("figure") if e.proto.component_name == "seqis_chart" else None
        if fig is not None:  # (the frame's plotly preload has none)
            go.Figure(fig)  # raises ValueError on a property plotly does not know
            plotly_names(fig)
            assert {t.get("type", "scatter") for t in fig["data"]} <= CARTESIAN_TRACES, fig["data"]
            out.append(fig)
    return out


def bound_to_url(widget) -> bool:
    """Whether an AppTest widget is bound to the URL's parameter of its key (Streamlit's bind="query-params"). The
    browser writes a bound widget's moves into the URL, so AppTest's query_params never shows them:
    tests/test_browser_explore.py checks the URL itself."""
    return widget.proto.query_param_key == widget.key


SMALL = {"ex.sc.gaussian.n_rollouts": "64", "ex.sc.gaussian.max_len": "256"}  # Explore on a quick batch


def explore(*, timeout: float = 90, **params) -> AppTest:
    """Explore (the app's first page) on the small batch with `params` in the URL, run once, with no exception."""
    at = AppTest.from_file(APP, default_timeout=timeout)
    for k, v in {**SMALL, **params}.items():
        at.query_params[k] = v
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def open_code(at: AppTest) -> AppTest:
    """Open Explore's export popover (its code is drawn while it is open; opening it reruns the page)."""
    at.session_state["ex.export.show"] = True
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at
