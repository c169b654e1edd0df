"""The explorer with its caches warm: `python -m app [streamlit run options]` (what `make run` and the browser
benchmark start; `streamlit run app` works too).

Before the server listens it computes Explore's first screen and the views a first click opens (other scenarios
and examples, Learn's presets) in this process, so "the server is up" means they are ready; Bias & variance's
first run then warms in a low-priority thread (ui/warm.py).
"""

import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads; see streamlit_app.py
APP = Path(__file__).resolve().parent
for path in (str(APP.parent), str(APP)):  # the pages import `ui` and `seqis` from these, as the server will
    if path not in sys.path:
        sys.path.insert(0, path)


def main(argv: list[str]) -> None:
    from streamlit.web import cli
    from ui import warm

    warm.before_serving()
    warm.start_background()
    import ui.chart  # noqa: F401  (plotly.js into app/static before the first page asks for it)

    # what .streamlit/config.toml says, for a start from another folder: the static folder ui/chart.py serves
    # plotly.js from, and no full garbage collection after each run (the config file says why)
    sys.argv = ["streamlit", "run", str(APP), "--server.enableStaticServing", "true", "--runner.postScriptGC",
                "false", *argv]
    cli.main()


if __name__ == "__main__":
    main(sys.argv[1:])
