"""Run: a whole training run as timelines (seqis.runs.scan): the mismatch per step and environment, what each
correction drops, incidents marked. One click opens a step: a point on a timeline opens it in Diagnose (its
findings first; Explore is one button away there), an incident's or the step picker's buttons in either.

Opens the example run under assets/ (scanned in place), a run folder on the server (scanned in place, with
progress), a scan parquet on the server, or an uploaded one (`python -m seqis scan RUN --out scan.parquet`).
Server paths are picked from the runs found under the folders this server reads, or typed; either way they pass
ui/paths.py's rule (ui/served.py), and are off on a server beyond loopback with no folders configured.
"""

from pathlib import Path

import pandas as pd
import streamlit as st
from ui import run_charts, run_data, served
from ui.paths import Refused
from ui.runtime.chart import chart
from ui.state import bound, literal

from seqis import ESTIMATORS

P = "run."
SOURCES = {"example": "Example run", "folder": "Run folder", "file": "Scan file", "upload": "Upload a scan"}
METRICS = ["kl_k3", "kl_k1", "chi2_token", "ess_seq", "ppl_ratio", "abs_log_ratio_p99", "abs_log_ratio_max"]
VIEWS = Path(__file__).resolve().parent
INCIDENT_BUTTONS = 5  # incidents (distinct steps) with their own open buttons


def _choices() -> list[str]:
    try:
        from seqis import PRESETS
    except ImportError:
        return list(ESTIMATORS)
    return list(ESTIMATORS) + list(PRESETS)


def _scan_in_place(path: str, names: tuple[str, ...], by: str | None, engine: str = "local") -> pd.DataFrame | None:
    """The run scanned with a progress bar; None (and why, on the page) when it cannot be."""
    start = "Scanning the run on Ray (its workers start first)..." if engine == "ray" else "Scanning the run..."
    bar = st.progress(0.0, text=start)
    shown = lambda done, total, step: bar.progress(done / max(total, 1), text=f"step {step}: {done} of {total}")
    try:
        return run_data.scan_folder(path, run_data.fingerprint(path), names, by, progress=shown, engine=engine)
    except (OSError, ImportError) as e:  # on Ray: no worker could read the run, or import seqis; no cluster there
        if engine != "ray":
            raise
        st.error(str(e))
        return None
    finally:
        bar.empty()


def _engine() -> str:
    """Where a run folder is scanned: this server's cores, or Ray (offered where Ray is installed)."""
    if not run_data.HAS_RAY:
        return "local"
    return bound(st.radio, "Scan on", f"{P}engine", "local", options=list(run_data.ENGINES),
                 format_func=run_data.ENGINES.get, valid=lambda v: v in run_data.ENGINES, horizontal=True,
                 help="Ray: the cluster the server's RAY_ADDRESS names, else the cluster this server is part of, "
                      "else a local Ray on its cores. On a cluster the run must sit on storage every node mounts at "
                      "the same path (docs/runs-on-a-cluster.md).")


def open_scan() -> tuple[pd.DataFrame | None, str | None]:
    """Draw the source controls; the scan to show and the run folder its steps open from."""
    kind = bound(st.radio, "Open", f"{P}source", "example", options=list(SOURCES), format_func=SOURCES.get,
                 valid=lambda v: v in SOURCES, horizontal=True, label_visibility="collapsed")
    if kind in ("example", "folder"):
        left, right = st.columns([3, 1])
        names = bound(left.multiselect, "Corrections", f"{P}estimators", list(run_data.SEED_FOUR),
                      options=_choices(), valid=lambda v: isinstance(v, list) and set(v) <= set(_choices()))
        by = bound(right.text_input, "Group by (metadata column)", f"{P}by", "env_name").strip() or None
        engine = _engine()
        if not names:
            st.info("Pick at least one correction.")
            return None, None
    if kind == "example":
        if not run_data.EXAMPLE_RUN.is_dir():
            st.info("No example run in assets/ (make it: python scripts/make_assets.py --only prime_rl_run).")
            return None, None
        path = str(run_data.EXAMPLE_RUN)
        st.caption(f"The example: a generated prime-rl token export ({path}, assets/README.md says how it was made).")
        return _scan_in_place(path, tuple(names), by, engine), path
    if kind == "folder":
        folder = served.pick(st, "Run folder on the server", f"{P}path", "folder",
                             "Pick a run, or type its folder: outputs/token_exports",
                             "The runs found under the folders this server reads (prime-rl's outputs/ or "
                             "token_exports/, a folder of step_N dumps); or type a folder inside them.")
        if folder is None:
            return None, None
        path = str(folder)
        try:
            return _scan_in_place(path, tuple(names), by, engine), path
        except (ValueError, OSError) as e:  # not a run (no steps), a link out of the roots, unreadable
            st.error(e.message(literal) if isinstance(e, Refused) else str(e))
            return None, None
    if kind == "file":
        file = served.pick(st, "Scan parquet on the server", f"{P}file", "file",
                           "Pick a scan, or type its path: scan.parquet",
                           "The scans found under the folders this server reads (written by python -m seqis scan "
                           "RUN --out scan.parquet); or type a path inside them.")
        if file is None:
            return None, None
        try:
            return run_data.scan_file(str(file), file.stat().st_mtime_ns), None
        except (ValueError, OSError) as e:  # a parquet that is not a scan, unreadable
            st.error(f"{literal(str(file))}: {e}")
            return None, None
    up = st.file_uploader("Scan parquet", type=["parquet"], key=f"{P}upload",
                          help="Written by python -m seqis scan RUN --out scan.parquet. Nothing is executed.")
    if up is None:
        return None, None
    raw = up.getvalue()
    return run_data.scan_upload(run_data.digest(raw), raw), None


def report(df: pd.DataFrame) -> None:
    s = df.attrs.get("summary", {})
    steps = sorted(df["step"].unique()) if not df.empty else []
    st.caption(f"{len(steps)} steps ({steps[0] if steps else '-'} to {steps[-1] if steps else '-'}), "
               f"{df['group'].nunique()} groups, {df['estimator'].nunique()} corrections; {len(df)} rows")
    problems = [f"not read: {e}" for e in s.get("failed", [])] + [f"skipped: {n}" for n in s.get("skipped", [])]
    if s.get("unstable_left_out"):
        problems.append(f"still being written, left out: steps {', '.join(map(str, s['unstable_left_out']))}")
    if problems:
        st.warning("  \n".join(problems))


NOT_HERE = "The run's files are not on this server: its steps cannot be opened here."


def _pages() -> list[tuple[str, str]]:
    """(title, file) of the pages a step opens in, the one a timeline click opens first."""
    return [("Diagnose", "diagnose.py")] * (VIEWS / "diagnose.py").exists() + [("Explore", "explore.py")]


def go_to_step(run_path: str, step: int, file: str) -> None:
    """Carry one step of the run to a page (its batch held for Explore and Diagnose) and switch to it."""
    try:
        run_data.hand_step_to_explore(run_path, step)
    except (ValueError, OSError) as e:
        st.error(f"Step {step} could not be opened: {e}")
        return
    st.switch_page(f"views/{file}")


def open_step(run_path: str | None, step: int, where, *, tag: str = "open", short: bool = False) -> None:
    """Buttons that carry one step of the run to Diagnose and to Explore (`tag` keeps each set's keys apart)."""
    if run_path is None:
        where.caption(NOT_HERE)
        return
    for col, (title, file) in zip(where.columns(len(_pages())), _pages()):
        label = title if short else f"Open step {step} in {title}"
        if col.button(label, key=f"{P}{tag}.{file}.{step}", width="stretch"):
            go_to_step(run_path, step, file)


def clickable_chart(fig, key: str, run_path: str | None) -> None:
    """A timeline whose points open their step: a click on a point reruns the page with it (once: coming back
    to the page does not open the step again) and carries its step to the first of _pages()."""
    point = chart(fig, key=f"{P}{key}", click=True)
    if point is None:
        return
    if run_path is None:
        st.info(NOT_HERE)
        return
    go_to_step(run_path, int(point["x"]), _pages()[0][1])


st.title("Run: every step of a training run")
df, run_path = open_scan()
if df is None:
    st.stop()
if df.empty:
    st.warning("The scan has no rows (no complete step was read).")
    report(df)
    st.stop()
report(df)
run_path = run_data.run_folder_of(df, run_path)
found = run_data.worst(df)

st.subheader("Incidents")
if found.empty:
    st.caption("No step stands out: no finding of the diagnosis, no per-token KL 10x its group's median.")
else:
    show = found[["step", "group", "reason", "kl_k3", "abs_log_ratio_max", "n_rollouts"]].assign(
        group=found["group"].fillna(run_charts.WHOLE_STEP))
    st.dataframe(show, hide_index=True, width="stretch")
    for _, row in found.drop_duplicates("step").head(INCIDENT_BUTTONS).iterrows():  # one click from an incident
        text, buttons = st.columns([1, 1], vertical_alignment="center")
        group = row["group"] if isinstance(row["group"], str) else run_charts.WHOLE_STEP
        text.markdown(f"**Step {row['step']}** · {group} · {row['reason']}")
        open_step(run_path, int(row["step"]), buttons, tag="incident", short=True)

metric = bound(st.selectbox, "Mismatch metric", f"{P}metric", "kl_k3", options=[m for m in METRICS if m in df],
               valid=lambda v: v in df)
if run_path is not None:
    st.caption(f"Click a point to open its step in {_pages()[0][0]}.")
clickable_chart(run_charts.mismatch_timeline(df, metric, found), "timeline", run_path)
steps = sorted(int(s) for s in df["step"].unique())
default = int(found.iloc[0]["step"]) if not found.empty else steps[-1]
step = bound(st.selectbox, "Step", f"{P}step", default, options=steps, valid=lambda v: v in steps)
open_step(run_path, step, st.container())

names = [e for e in dict.fromkeys(df["estimator"])]
clickable_chart(run_charts.dropped_timelines(df, names), "dropped", run_path)
with st.expander("The scan's rows of this step"):
    st.dataframe(df[df["step"] == step], hide_index=True, width="stretch")
