"""seqis explorer: `streamlit run app`.

The frame: page config, the sidebar's device line, and routing (st.navigation) to the pages in views/.
Pages read widgets, get data through the cached bridges in ui/, and hand results to the chart modules in ui/.
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
from ui import chart, warm  # noqa: E402
from ui.device import device_label  # noqa: E402
from ui.state import ADVANCED, PRESENT, bound, present  # noqa: E402
from ui.style import PRESENT_CSS, RESPONSIVE_CSS  # noqa: E402

st.set_page_config(page_title="seqis: sequence-level IS explorer", page_icon=":material/balance:", layout="wide")

EXPLORE = st.Page("views/explore.py", title="Explore", icon=":material/scatter_plot:", url_path="home", default=True)


def _explore_by_name() -> None:
    """/explore, typed by hand: Explore lives at the root URL; go there, keeping the view in the URL."""
    st.switch_page(EXPLORE, query_params=st.query_params.to_dict())


PAGES = [
    st.Page("views/lessons.py", title="Lessons", icon=":material/menu_book:", url_path="lessons"),
    EXPLORE,
    st.Page("views/compare.py", title="Compare", icon=":material/compare_arrows:", url_path="compare"),
    st.Page("views/bias_variance.py", title="Bias & variance", icon=":material/target:", url_path="bias-variance"),
    st.Page("views/length_thresholds.py", title="Length & thresholds", icon=":material/straighten:",
            url_path="length-thresholds"),
    st.Page("views/training.py", title="Training", icon=":material/trending_up:", url_path="training"),
    st.Page("views/diagnose.py", title="Diagnose", icon=":material/troubleshoot:", url_path="diagnose"),
    st.Page("views/run.py", title="Run", icon=":material/timeline:", url_path="run"),
    st.Page("views/learn.py", title="Learn", icon=":material/school:", url_path="learn"),
    st.Page(_explore_by_name, title="Explore", url_path="explore", visibility="hidden"),
]



page = st.navigation(PAGES)
st.html(RESPONSIVE_CSS)
st.sidebar.caption(f"Device: **{device_label()}**")
if present():  # presenter mode: larger chart text (ui/chart.py), kept in the URL across page switches
    st.html(PRESENT_CSS)
    st.query_params[PRESENT] = "1"
else:
    bound(st.sidebar.toggle, "Advanced knobs", ADVANCED, False,
          help="Also draw the knobs most views leave alone (adv_tau, the advantage scale: it only rescales every "
               "weight). A value set by a link applies either way.")
with st.sidebar:
    chart.preload()
try:
    page.run()
finally:  # also after a page stops or switches: once per server, the other batches, Learn's presets and Bias &
    warm.start_background()  # variance's first run warm in a low-priority thread (python -m app started it already)
