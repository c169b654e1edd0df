"""Explore's batch chooser: upload your own batch (with a column-mapping control), an example, or a synthetic
scenario; returns the (Source, payload) to show and resets batch-dependent state when the batch changes.

Uploads are the main path, drawn in the main area; the synthetic scenario's knobs live in the sidebar.
Errors are shown right under the control that caused them and cleared when a good file arrives.
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from seqis.io import BatchFormatError
from seqis.io.columns import ALIASES, MAX_BYTES, size_text
from seqis.samplers.scenarios import SCENARIOS, describe

from . import explore_data as data
from .device import device
from .presets import FIRST_BATCH, FIRST_SCENARIO, PREFIX
from .state import arrived, bound, current_batch, forget, hold_batch, keep_in_url, keep_view, literal
from .widgets import knob_widgets

P = PREFIX  # "ex."
SOURCES = {"upload": "Upload your batch", "asset": "Example batch", "synthetic": "Synthetic scenario"}
MAX_POSITIONS = {False: 1 << 25, True: 1 << 29}  # B x T a synthetic batch may have (CPU, CUDA)
# the roles a file's column can be mapped to: every role the loader knows (seqis.io's ALIASES), sample_mask included
ROLES = tuple(ALIASES)
AUTO = "(automatic)"
REFUSED = {".pkl": "a pickle", ".pickle": "a pickle", ".joblib": "a joblib pickle", ".dill": "a dill pickle"}
# widget keys whose values mean nothing on another batch -> a value valid on any batch, until their widget is drawn
# a rollout index, a metadata column, the head size K and a head position of the old batch: their widgets start over
BATCH_DEPENDENT = {f"{P}rollout": 0, f"{P}color": None, f"{P}head.k": 1, f"{P}head.rollout": 0, f"{P}head.token": None,
                   "cmp.head.k": 1}


def upload_formats() -> list[str]:
    """File suffixes the loader reads (without the dot), for st.file_uploader's `type`."""
    from seqis.io.columns import FORMATS

    return sorted({f.lstrip(".") for f in FORMATS})


@st.cache_data(max_entries=8, show_spinner=False)
def file_columns(file_digest: str, name: str, _data: bytes) -> list[str]:
    """The column (or array) names in a file (named by its digest), for the column-mapping control; [] when it
    cannot be read."""
    from seqis.io import column_names

    try:
        return column_names(data.Named(_data, name))
    except BatchFormatError:
        return []


def _first_batch() -> data.Source:
    return data.Source("synthetic", FIRST_SCENARIO, SCENARIOS[FIRST_SCENARIO](**FIRST_BATCH), 0)


def _synthetic(sb) -> data.Source | None:
    scenario = bound(sb.selectbox, "Scenario", f"{P}scenario", FIRST_SCENARIO, options=list(SCENARIOS),
                     valid=lambda v: v in SCENARIOS)
    sb.caption(describe(scenario))
    cls = SCENARIOS[scenario]
    own = [f for f in cls.__dataclass_fields__ if f not in cls.__mro__[1].__dataclass_fields__]
    primary = {"n_rollouts", "max_len", "lengths", *own}
    advanced = tuple(f for f in cls.__dataclass_fields__ if f not in primary)
    cfg, err = knob_widgets(cls, f"{P}sc.{scenario}", container=sb, advanced=advanced,
                            advanced_container=sb.expander("More batch knobs", key=f"{P}sc.more", on_change="rerun"),
                            defaults=FIRST_BATCH if scenario == FIRST_SCENARIO else None)
    seed = bound(sb.number_input, "Seed", f"{P}seed", 0, min_value=0, max_value=2**31 - 1, step=1,
                 valid=lambda v: isinstance(v, int) and v >= 0)
    if err:
        sb.error(err)
        return None
    limit = MAX_POSITIONS[device().type == "cuda"]
    if cfg.n_rollouts * cfg.max_len > limit:
        sb.error(f"n_rollouts x max_len = {cfg.n_rollouts * cfg.max_len:,} positions is more than this device's "
                 f"{limit:,}: lower n_rollouts or max_len")
        return None
    return data.Source("synthetic", scenario, cfg, int(seed))


def _mapping(where, names: list[str], expanded: bool) -> None:
    """The column-mapping control: one selectbox per role, (automatic) or a column of the file."""
    with where.expander("Column mapping: which column holds what", expanded=expanded):
        st.caption("Pick the file's column for each role when its name is not one the loader knows "
                   "(prime-rl's and verl's names are found automatically). Advantages, or a reward with a group "
                   "column (advantage = reward - group mean).")
        cols = st.columns(3)
        for i, role in enumerate(ROLES):
            key = f"{P}map.{role}"
            options = [AUTO, *names]
            if st.session_state.get(key) not in options:
                st.session_state[key] = AUTO
            cols[i % 3].selectbox(role, options, key=key)


def _file(where, kind: str) -> tuple[data.Source, bytes] | None:
    """An uploaded file or an asset: loaded once per (digest, mapping); a bad file shows the loader's message
    here and returns None (the previous batch stays)."""
    if kind == "upload":
        up = where.file_uploader(
            "Upload your batch", key=f"{P}upload",
            help=f"{', '.join('.' + f for f in upload_formats())}: one row per rollout with list columns, "
                 "padded [B, T] arrays or a packed micro-batch. Nothing is executed or stored.")
        where.caption(f"Up to {size_text(MAX_BYTES)} here; a larger dump: `python -m seqis diagnose FILE "
                      "--max-bytes 1GB` on the command line.")
        if up is None:
            shared = st.query_params.get(f"{P}file")
            if shared:
                where.info(f"This link was made with an uploaded file, {literal(shared)}. Uploads are never stored: "
                           "upload the file again to see this view.")
            return None
        if up.size > MAX_BYTES:  # Streamlit takes files up to server.maxUploadSize; a batch here is at most this
            where.error(too_big(up.name, up.size))
            return None
        raw, name = up.getvalue(), up.name
        suffix = Path(name).suffix.lower()
        if suffix in REFUSED:
            where.error(f"{name}: {REFUSED[suffix]} file is refused, because loading one can run code. Save the "
                        f"batch as {', '.join('.' + f for f in upload_formats())} instead.")
            return None
        if suffix.lstrip(".") not in upload_formats():
            where.error(f"{name}: {suffix or 'no suffix'} is not a batch format this loader reads; use one of "
                        f"{', '.join('.' + f for f in upload_formats())}.")
            return None
        keep_in_url(f"{P}file", name, "")  # no widget holds it: the file itself is not in the link
    else:
        found = data.assets()
        if not found:
            where.info("No example batches in assets/.")
            return None
        name = bound(where.selectbox, "Example batch", f"{P}asset", sorted(found)[0], options=sorted(found),
                     valid=lambda v: v in found)
        raw = found[name].read_bytes()
    columns, names = {}, []
    if kind == "upload":  # the mapping as the widgets hold it (drawn below, once we know whether the file loads)
        names = file_columns(data.digest(raw), name, raw)
        columns = {role: st.session_state[f"{P}map.{role}"] for role in ROLES
                   if st.session_state.get(f"{P}map.{role}", AUTO) in names}
    try:
        src, err = data.source_of_file(raw, name, kind=kind, columns=columns), None
    except (ValueError, OSError, ImportError) as e:  # BatchFormatError is a ValueError
        src, err = None, str(e) if name in str(e) else f"{name}: {e}"
    mapping = err is not None and kind == "upload" and is_about_columns(err)
    if kind == "upload":
        _mapping(where, names, expanded=mapping)
    if err is not None:  # the loader's words; the mapping's hint only where a column was not found
        where.error(err + ("  \nOpen **Column mapping** above to point at the file's own column names."
                           if mapping else ""))
        return None
    return src, raw


def too_big(name: str, size: int) -> str:
    """The refusal of an upload over the explorer's limit, with the way to check it anyway."""
    need = -(-size // 2**20) + 1  # MB, rounded up
    return (f"{name} is {size_text(size)}, over the {size_text(MAX_BYTES)} a batch may have in this explorer. Check it "
            f"on the command line, which reads it row group by row group (parquet) or line by line (JSONL): "
            f"`python -m seqis diagnose {name} --max-bytes {need}MB` (in Python: `load_batch(path, max_bytes=...)`); "
            "or save fewer rollouts per file.")


def is_about_columns(message: str) -> bool:
    """Whether a loader's refusal is about which column holds what (the column mapping can fix it), not about the
    file itself (truncated, a pickle, a NaN on a loss token, a size limit)."""
    return any(s in message for s in (": looked for ", "(given for ", "is not a role"))


def _a_scenario(src: data.Source) -> bool:
    """A batch the chooser's scenario knobs make (Diagnose's faults are synthetic batches of other generators: they
    reach Explore through its file source, which shows the held batch)."""
    return src.kind == "synthetic" and isinstance(src.config, SCENARIOS.get(src.name, ()))


def knobs_of(src: data.Source) -> dict[str, object]:
    """The chooser's widget values that make a synthetic Source: the scenario, its knobs and the seed."""
    name = src.name
    return {f"{P}source": "synthetic", f"{P}scenario": name, f"{P}seed": src.seed,
            **{f"{P}sc.{name}.{k}": getattr(src.config, k) for k in src.config.__dataclass_fields__}}


def batch_source() -> tuple[data.Source, bytes | None]:
    """Draw the batch chooser (main area and sidebar) and return the batch to show: on a page just arrived at, the
    batch the session holds (Explore's), whatever the URL kept of it."""
    held = current_batch()
    if arrived() and held is not None and _a_scenario(held[0]):
        keep_view(knobs_of(held[0]))
    box = st.container(border=True)
    kind = bound(box.radio, "Batch", f"{P}source", "synthetic", options=list(SOURCES), format_func=SOURCES.get,
                 valid=lambda v: v in SOURCES, horizontal=True, label_visibility="collapsed")
    got = None
    if kind == "synthetic":
        st.sidebar.header("Synthetic batch")
        src = _synthetic(st.sidebar)
        got = (src, None) if src is not None else None
        box.caption("A seeded synthetic batch: pick the scenario and its knobs in the sidebar.")
    else:
        got = _file(box, kind)
    if got is None:
        held = current_batch() or (_first_batch(), None)
        if kind == "upload" and held[0].kind == "upload" and st.session_state.get(f"{P}upload") is None:
            box.caption(f"Showing your upload **{held[0].name}**. Drop another file above to replace it.")
        else:
            (box if kind != "synthetic" else st.sidebar).caption(f"Showing the previous batch: {held[0].label}")
        got = held
    if hold_batch(*got):
        for key, now in BATCH_DEPENDENT.items():  # a rollout index or a metadata column of the old batch
            forget(key, now)
    if kind != "upload" and f"{P}file" in st.query_params:
        del st.query_params[f"{P}file"]
    return got
