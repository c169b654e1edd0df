"""Run: a whole training run as timelines (seqis.runs.scan): the mismatch per step and environment, what each
correction drops, incidents marked. One click opens a step: a point on a timeline opens it in Diagnose (its
findings first; Explore is one button away there), an incident's or the step picker's buttons in either.

Follow (a switch): the page looks at the run again every few seconds while it trains (st.fragment on a timer,
not a rerun of the page): new steps are scanned as they land, incidents at steps that landed since the switch
was turned on are marked new (and announced), and the latest step is one click from Diagnose.

Opens the example run under assets/ (scanned in place), a run folder on the server (scanned in place, with
progress), a scan parquet on the server, or an uploaded one (`python -m seqis scan RUN --out scan.parquet`).
Server paths are picked from the runs found under the folders this server reads, or typed; either way they pass
ui/paths.py's rule (ui/served.py), and are off on a server beyond loopback with no folders configured.
"""

import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pandas as pd
import streamlit as st
from ui import run_charts, run_data, served, warm
from ui.paths import Refused
from ui.runtime.chart import chart
from ui.state import bound, literal, peek, switch_page

from seqis import ESTIMATORS
from seqis.diagnosis import trend

P = "run."
SOURCES = {"example": "Example run", "folder": "Run folder", "file": "Scan file", "upload": "Upload a scan"}
METRICS = ["kl_k3", "kl_k1", "abs_ratio_mean", "chi2_token", "ess_seq", "ppl_ratio", "abs_log_ratio_p99",
           "abs_log_ratio_max"]
VIEWS = Path(__file__).resolve().parent
INCIDENT_BUTTONS = 5  # incidents (distinct steps) with their own open buttons
FOLLOWABLE = ("example", "folder", "file")  # sources on this server that can grow while the page looks
FOLLOW_EVERY = 5  # seconds between looks while following (a fragment on a timer: the page itself does not rerun)


def _choices() -> list[str]:
    try:
        from seqis import PRESETS
    except ImportError:
        return list(ESTIMATORS)
    return list(ESTIMATORS) + list(PRESETS)


def _scan_in_place(path: str, names: tuple[str, ...], by: str | None, engine: str = "local",
                   following: bool = False) -> pd.DataFrame | None:
    """The run scanned with a progress bar; None (and why, on the page) when it cannot be. Following, the scan
    runs behind the page, so a look on the timer never cuts one short: None until its first scan is done."""
    if following:
        df, doing = run_data.scan_behind(path, names, by, engine)
        if doing:
            (st.caption if df is not None else st.info)(doing)
        return df
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


def _scan_or_say(path: str, names: tuple[str, ...], by: str | None, engine: str,
                 following: bool) -> pd.DataFrame | None:
    try:
        return _scan_in_place(path, names, by, engine, following)
    except (ValueError, OSError) as e:  # not a run (no steps), a link out of the roots, unreadable
        st.error(e.message(literal) if isinstance(e, Refused) else str(e))
        return None


def _read_or_say(file: Path) -> pd.DataFrame | None:
    """A scan parquet on the server, read again when it is rewritten (its modification time is in the key)."""
    try:
        return run_data.scan_file(str(file), file.stat().st_mtime_ns)
    except (ValueError, OSError) as e:  # a parquet that is not a scan, unreadable
        st.error(f"{literal(str(file))}: {e}")
        return None


def _upload_or_say(name: str, raw: bytes) -> pd.DataFrame | None:
    try:
        return run_data.scan_upload(run_data.digest(raw), raw)
    except ValueError as e:  # not a scan, or a damaged one
        st.error(f"{literal(name)}: {e}")
        return None


def _group_by(where, path: str) -> str | None:
    """The Group-by control: only the metadata columns the run's steps carry (run_data.group_columns), or a
    line saying there are none (each step is then one group)."""
    columns = run_data.group_columns(path, run_data.fingerprint(path))
    if not columns:
        where.caption("Group by: this run's steps carry no metadata column with a few values (env_name, rank, "
                      "...): each step is one group.")
        return None
    options = ["none", *columns]
    default = "env_name" if "env_name" in columns else "none"
    by = bound(where.selectbox, "Group by (metadata column)", f"{P}by", default, options=options,
               valid=lambda v: v in options, help="The metadata columns of this run's steps; a step without the "
               "chosen one is scanned as one group.")
    return None if by == "none" else by


def open_scan(following: bool = False) -> tuple[Callable[[], pd.DataFrame | None] | None, str | None]:
    """Draw the source controls; a function that gets the scan to show (None: nothing to show yet) and the run
    folder its steps open from. Following, the function is called again at every look (a run folder is then
    scanned behind the page: None until its first scan is done; a scan file is reread once rewritten)."""
    kind = bound(st.radio, "Open", f"{P}source", "example", options=list(SOURCES), format_func=SOURCES.get,
                 valid=lambda v: v in SOURCES, horizontal=True, label_visibility="collapsed")
    if kind in ("example", "folder"):
        left, right = st.columns([3, 1])
        names = bound(left.multiselect, "Corrections", f"{P}estimators", list(run_data.SEED_FOUR),
                      options=_choices(), valid=lambda v: isinstance(v, list) and set(v) <= set(_choices()))
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
        return partial(_scan_in_place, path, tuple(names), _group_by(right, path), engine, following), path
    if kind == "folder":
        folder = served.pick(st, "Run folder on the server", f"{P}path", "folder",
                             "Pick a run, or type its folder: outputs/token_exports",
                             "The runs found under the folders this server reads (prime-rl's outputs/ or "
                             "token_exports/, a folder of step_N dumps); or type a folder inside them.")
        if folder is None:
            return None, None
        path = str(folder)
        try:
            by = _group_by(right, path)
        except (ValueError, OSError) as e:  # not a run (no steps), a link out of the roots, unreadable
            st.error(e.message(literal) if isinstance(e, Refused) else str(e))
            return None, None
        return partial(_scan_or_say, path, tuple(names), by, engine, following), path
    if kind == "file":
        file = served.pick(st, "Scan parquet on the server", f"{P}file", "file",
                           "Pick a scan, or type its path: scan.parquet",
                           "The scans found under the folders this server reads (written by python -m seqis scan "
                           "RUN --out scan.parquet); or type a path inside them.")
        if file is None:
            return None, None
        return partial(_read_or_say, file), None
    up = st.file_uploader("Scan parquet", type=["parquet"], key=f"{P}upload",
                          help="Written by python -m seqis scan RUN --out scan.parquet. Nothing is executed.")
    if up is None:
        return None, None
    raw = up.getvalue()
    return partial(_upload_or_say, up.name, raw), None


def report(df: pd.DataFrame) -> None:
    s = df.attrs.get("summary", {})
    steps = sorted(df["step"].unique()) if not df.empty else []
    st.caption(f"{len(steps)} steps ({steps[0] if steps else '-'} to {steps[-1] if steps else '-'}), "
               f"{df['group'].nunique()} groups, {df['estimator'].nunique()} corrections; {len(df)} rows")
    problems = [f"not read: {e}" for e in s.get("failed", [])] + [f"skipped: {n}" for n in s.get("skipped", [])]
    for note in s.get("notes", []):
        st.info(note)
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
    switch_page(f"views/{file}")


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


def new_incidents(df: pd.DataFrame, found: pd.DataFrame, following: bool) -> pd.Series:
    """Which incidents are at steps that landed since Follow was switched on (for this scan's run and
    settings), one bool per row of `found`; each new one is announced once (a toast)."""
    source = (df.attrs.get("path"), df.attrs.get("settings"))
    seen = st.session_state.get(f"{P}seen")
    if not following:
        st.session_state.pop(f"{P}seen", None)
        return pd.Series(False, index=found.index)
    if seen is None or seen["source"] != source:  # Follow just switched on (or another run): nothing is new yet
        seen = st.session_state[f"{P}seen"] = {"source": source, "steps": set(df["step"].unique()), "told": set()}
    new = ~found["step"].isin(seen["steps"])
    for _, row in found[new].iterrows():
        key = (int(row["step"]), row["group"] if isinstance(row["group"], str) else None)
        if key not in seen["told"]:
            seen["told"].add(key)
            group = key[1] or run_charts.WHOLE_STEP
            st.toast(f"New incident: step {key[0]} · {group} · {row['reason']}")
    return new


def latest_step(df: pd.DataFrame, run_path: str | None) -> None:
    """The newest step of a followed run, one click from Diagnose (and Explore)."""
    steps = sorted(int(s) for s in df["step"].unique())
    latest = steps[-1]
    row = df[(df["step"] == latest) & df["group"].isna()].head(1)
    row = row if not row.empty else df[df["step"] == latest].head(1)
    sev = row["severity"].iloc[0]
    finding = f" · {sev}: {row['finding'].iloc[0]}" if isinstance(sev, str) and sev != "ok" else ""
    text, buttons = st.columns([1, 1], vertical_alignment="center")
    text.markdown(f"**Latest: step {latest}** · kl_k3 {row['kl_k3'].iloc[0]:.3g}{finding} · looked at "
                  f"{time.strftime('%H:%M:%S')}")
    open_step(run_path, latest, buttons, tag="latest", short=True)


def pick_step(df: pd.DataFrame, found: pd.DataFrame, run_path: str | None) -> int:
    """The Step selector: the worst step at first, and again whenever another run is shown (a step kept from the
    run before would open a step of this one nobody picked); a step from the URL holds on a first look."""
    steps = sorted(int(s) for s in df["step"].unique())
    default = int(found.iloc[0]["step"]) if not found.empty else steps[-1]
    run_id = (str(df.attrs.get("path")), str(run_path), str(st.session_state.get(f"{P}source")))
    shown_before = st.session_state.get(f"{P}step.run")
    if shown_before is not None and shown_before != run_id:
        st.session_state[f"{P}step"] = default
    st.session_state[f"{P}step.run"] = run_id
    return bound(st.selectbox, "Step", f"{P}step", default, options=steps, valid=lambda v: v in steps)


def warn_early(df: pd.DataFrame, metric: str, run_path: str | None) -> None:
    """The early warning: each step's metric against the steps just before it, and the rate it alarms on clean
    runs (measured: docs/diagnose.md)."""
    st.subheader("Early warning")
    st.caption(f"Each step's {metric} against its own last {trend.WINDOW} steps (median and MAD, on the log"
               + (" of its excess over 1" if metric in trend.OFFSETS else "") + f"): a step with z above "
               f"{trend.Z_ALARM:g} is an alarm, a rise the run's average hides. On clean synthetic runs (the mismatch "
               f"held fixed, a fresh batch each step) a step passes it about {trend.CLEAN_FALSE_ALARM:.1g} of the time "
               "(docs/diagnose.md, Early warning). No z before 8 steps of history.")
    n = df["step"].nunique()
    if n <= trend.MIN_HISTORY:  # no step has the history to be read against: no empty chart
        st.caption(f"This run has {n} steps: a step is read once {trend.MIN_HISTORY} steps came before it.")
        return
    fig, alarms = run_charts.early_warning(df, metric)
    clickable_chart(fig, "warning", run_path)
    if alarms.empty:
        st.caption("No alarm in this run.")
    else:
        st.dataframe(alarms, hide_index=True, width="stretch")


def show_run(load: Callable[[], pd.DataFrame | None], run_path: str | None, following: bool = False) -> None:
    """The scan's incidents and timelines. While following, this runs again on a timer (a fragment, holding no
    control of the source: those are drawn once per page run): a run folder is rescanned when its files change
    (only new or changed steps are read), a scan file reread when it is rewritten."""
    df = load()
    if df is None:
        return
    if df.empty:
        st.warning("The scan has no rows (no complete step was read).")
        report(df)
        return
    report(df)
    run_path = run_data.run_folder_of(df, run_path)
    found = run_data.worst(df)
    new = new_incidents(df, found, following)
    if following:
        latest_step(df, run_path)

    st.subheader("Incidents")
    if found.empty:
        st.caption("No step stands out: no finding of the diagnosis, no per-token KL 10x its group's median.")
    else:
        show = found[["step", "group", "reason", "kl_k3", "abs_log_ratio_max", "n_rollouts"]].assign(
            group=found["group"].fillna(run_charts.WHOLE_STEP))
        if following:
            show.insert(0, "new", new.map({True: "new", False: ""}))
        st.dataframe(show, hide_index=True, width="stretch")
        for i, row in found.drop_duplicates("step").head(INCIDENT_BUTTONS).iterrows():  # one click from an incident
            text, buttons = st.columns([1, 1], vertical_alignment="center")
            group = row["group"] if isinstance(row["group"], str) else run_charts.WHOLE_STEP
            mark = " · :red-badge[new]" if new[i] else ""
            text.markdown(f"**Step {row['step']}** · {group} · {row['reason']}{mark}")
            open_step(run_path, int(row["step"]), buttons, tag="incident", short=True)

    metric = bound(st.selectbox, "Mismatch metric", f"{P}metric", "kl_k3", options=[m for m in METRICS if m in df],
                   valid=lambda v: v in df)
    if run_path is not None:
        st.caption(f"Click a point to open its step in {_pages()[0][0]}.")
    clickable_chart(run_charts.mismatch_timeline(df, metric, found, new=new), "timeline", run_path)
    step = pick_step(df, found, run_path)
    open_step(run_path, step, st.container())

    names = [e for e in dict.fromkeys(df["estimator"])]
    clickable_chart(run_charts.dropped_timelines(df, names), "dropped", run_path)
    with st.expander("The scan's rows of this step"):
        st.dataframe(df[df["step"] == step], hide_index=True, width="stretch")
    warn_early(df, metric, run_path)  # last: the step picker above reads as the early warning's when under it


st.title("Run: every step of a training run")
source = peek(f"{P}source", "example", SOURCES)
followable = source in FOLLOWABLE  # (the source radio is drawn below)
left, right, _ = st.container(key="narrow-run-follow").columns([1, 1, 4], vertical_alignment="bottom")
following = bound(left.toggle, "Follow", f"{P}follow", False, disabled=not followable,
                  help="Look at the run again every few seconds and show the steps as they land: a run folder is "
                       "rescanned (only new or changed steps are read), a scan file reread when rewritten (by "
                       "`seqis scan RUN --out scan.parquet --follow`). An upload cannot be followed.")
every = bound(right.number_input, "every (s)", f"{P}every", FOLLOW_EVERY, min_value=2, max_value=600, step=1,
              valid=lambda v: isinstance(v, int) and 2 <= v <= 600, disabled=not following)
load, run_path = open_scan(following and followable)
if load is not None and following and followable:
    warm.fragment(show_run, run_every=every)(load, run_path, following=True)
elif load is not None:
    show_run(load, run_path)
