"""seqis explorer: `streamlit run app` (or `python -m app`, what `make run` starts).

Run by Streamlit for every page view, this file is the frame: page config, the sidebar's device line, and routing
(st.navigation) to the pages in views/. Pages read widgets, get data through the cached bridges in ui/, and hand
results to the chart modules in ui/.

Imported (not run), it is the server: `streamlit run app` looks here for an ASGI app, finds `app` below (an st.App
serving this file) and starts it; its lifespan computes Explore's first screen before the server listens
(ui/warm.py). Without it, a server just started did all of that for its first visitor: imports, the batch, four
estimators and seven figures, 4-7 s before the first chart on 2 loaded cores, against 2-4 s with the caches warm.
"""

import os
import sys
from pathlib import Path

# Before torch loads its OpenMP runtime: idle OpenMP threads sleep instead of spinning. On a busy machine (other
# processes, or the page's own server threads) spinning threads steal the cores the work needs: one estimator's
# view took 0.9-1.5 s with spinning and 17-42 ms without, on 2 loaded cores. A value the user set wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# `streamlit run app` puts app/ (not the repo root) on the path; make `seqis` importable uninstalled too.
_ROOT = Path(__file__).resolve().parent.parent
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

import streamlit as st  # noqa: E402


def frame() -> None:
    """The page frame, run on every page view: config, navigation, the device line (and the presenter mode or
    the advanced-knobs switch), then the page."""
    from ui import warm
    from ui.device import device_label
    from ui.runtime import chart
    from ui.state import ADVANCED, PRESENT, bound, note_page, present
    from ui.style import PRESENT_CSS, RESPONSIVE_CSS

    st.set_page_config(page_title="seqis: sequence-level IS explorer", page_icon="⚖️", layout="wide")
    explore = st.Page("views/explore.py", title="Explore", icon=":material/scatter_plot:", url_path="home",
                      default=True)

    def explore_by_name() -> None:
        """/explore, typed by hand: Explore lives at the root URL; go there, keeping the view in the URL."""
        kept = [k for k in st.query_params if k != ADVANCED]  # the advanced switch's widget is bound: it keeps itself
        st.switch_page(explore, query_params={k: st.query_params.get_all(k) for k in kept})

    pages = [
        st.Page("views/lessons.py", title="Lessons", icon=":material/menu_book:", url_path="lessons"),
        explore,
        st.Page("views/compare.py", title="Compare", icon=":material/compare_arrows:", url_path="compare"),
        st.Page("views/bias_variance.py", title="Bias & variance", icon=":material/target:",
                url_path="bias-variance"),
        st.Page("views/length_thresholds.py", title="Length & thresholds", icon=":material/straighten:",
                url_path="length-thresholds"),
        st.Page("views/training.py", title="Training", icon=":material/trending_up:", url_path="training"),
        st.Page("views/diagnose.py", title="Diagnose", icon=":material/troubleshoot:", url_path="diagnose"),
        st.Page("views/run.py", title="Run", icon=":material/timeline:", url_path="run"),
        st.Page("views/learn.py", title="Learn", icon=":material/school:", url_path="learn"),
        st.Page(explore_by_name, title="Explore", url_path="explore", visibility="hidden"),
    ]
    page = st.navigation(pages)
    note_page(page.url_path)
    st.html(RESPONSIVE_CSS)
    st.sidebar.caption(f"Device: **{device_label()}**")
    if present():  # presenter mode: larger chart text (ui/runtime/chart.py), kept in the URL across page switches
        st.html(PRESENT_CSS)
        st.query_params[PRESENT] = "1"
    else:
        bound(st.sidebar.toggle, "Advanced knobs", ADVANCED, False,
              help="Also draw the knobs most views leave alone (adv_tau, the advantage scale: it only rescales every "
                   "weight). A value set by a link applies either way.")
    with st.sidebar:
        chart.preload()
    try:
        with warm.page_running():  # the background warm-up waits while a page runs
            page.run()
    finally:  # also after a page stops or switches: once per server, the other batches, Learn's presets, Bias &
        warm.start_background()  # variance's first run and the lessons warm in a low-priority thread


if __name__ == "__main__":  # Streamlit runs this file for every page view as the module __main__
    frame()
else:  # imported by `streamlit run app`, which serves the st.App it finds here
    from ui.warm import lifespan

    app = st.App(__file__, lifespan=lifespan)
