"""The explorer: `python -m app [--data-root PATH ...] [streamlit run options]` (what `make run` and the browser
benchmark start), the same server as `streamlit run app`, from any folder: app/streamlit_app.py's st.App, whose
lifespan computes Explore's first screen and the views a first click opens before the server listens (ui/warm.py).
`--data-root` (repeatable) names the folders the pages may read server paths from (docs/serving.md); it sets
SEQIS_DATA_ROOTS for them.
"""

import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads; see streamlit_app.py
APP = Path(__file__).resolve().parent
for path in (str(APP.parent), str(APP)):  # the pages import `ui` and `seqis` from these, as the server will
    if path not in sys.path:
        sys.path.insert(0, path)


def take_data_roots(argv: list[str]) -> tuple[list[str], list[str]]:
    """`--data-root PATH` / `--data-root=PATH` (repeatable) taken out of argv: (the folders, made absolute against
    this folder, the one the app starts in; the rest for streamlit). A flag with no path is an error."""
    roots, rest, args = [], [], iter(argv)
    for arg in args:
        if arg == "--data-root":
            value = next(args, "")
        elif arg.startswith("--data-root="):
            value = arg.split("=", 1)[1]
        else:
            rest.append(arg)
            continue
        if not value.strip() or value.startswith("--"):
            raise SystemExit("python -m app: --data-root needs a folder (--data-root /path/to/runs)")
        roots.append(os.path.abspath(os.path.expanduser(value)))
    return roots, rest


def main(argv: list[str]) -> None:
    roots, argv = take_data_roots(argv)
    from streamlit.web import cli
    from ui.paths import ENV

    if roots:  # the flag wins over the environment; the pages read it from there (ui/paths.py)
        os.environ[ENV] = os.pathsep.join(roots)

    # what .streamlit/config.toml says, for a start from another folder: the static folder ui/runtime/chart.py
    # serves plotly.js from, and no full garbage collection after each run (the config file says why)
    sys.argv = ["streamlit", "run", str(APP), "--server.enableStaticServing", "true", "--runner.postScriptGC",
                "false", *argv]
    cli.main()


if __name__ == "__main__":
    main(sys.argv[1:])
