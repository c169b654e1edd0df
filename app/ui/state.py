"""Page state that lives in the URL, so a copied link reopens the same view.

Every widget that defines a view is drawn through `bound(...)`: its first value comes from the URL's
query parameter of the same key, else from the value it had earlier in this session (kept across page
switches), else the default; each rerun writes the current value back into the URL (a value equal to
its default is left out, so links stay short). Keys are prefixed per page ("ex.", "bv.", "lt.") so
pages never share widget state. `set_view` sets a whole view at once (Learn's presets).

Two switches hold for the whole app, kept for the session and in the URL: presenter mode (`?present=1`, `present()`)
and the advanced knobs (`?advanced=1`, `show_advanced()`).

Also every session-state key shared between pages: BATCH_KEY (the batch Explore shows; `current_batch`) and
SEEN_KEY (the uploads this session has already shown; `first_look`).

A value from the URL is the sender's, not the reader's: a server path in it passes ui/paths.py's rule where it is
used (ui/served.py), like a typed one, and a value shown back on the page is shown `literal`ly.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import streamlit as st

_KEPT = "_view_state"  # session-state dict: widget key -> last value, survives page switches


def dump(value: Any) -> str:
    """A widget value as a query-parameter string."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float):
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, (list, tuple)):
        return ",".join(dump(v) for v in value)
    return str(value)


def parse(raw: str, default: Any) -> Any:
    """A query-parameter string as a value of the default's type; the default if it does not parse."""
    try:
        if raw == "none":
            return None
        if isinstance(default, bool):
            if raw not in ("1", "0", "true", "false", "True", "False"):
                return default
            return raw in ("1", "true", "True")
        if isinstance(default, int):
            v = float(raw)
            return int(v) if v.is_integer() else default
        if isinstance(default, float):
            return float(raw)
        if default is None:  # an optional knob: a number, or one of its string choices (verl's rollout_rs)
            try:
                return float(raw)
            except ValueError:
                return raw
        if isinstance(default, (list, tuple)):
            return [p for p in raw.split(",") if p]
        return raw
    except ValueError:
        return default


def _kept() -> dict:
    if _KEPT not in st.session_state:
        st.session_state[_KEPT] = {}
    return st.session_state[_KEPT]


def initial(key: str, default: Any, valid: Callable | None = None) -> Any:
    """The value a bound widget starts from: URL, else this session's earlier value, else default."""
    raw = st.query_params.get(key)
    if raw is not None:
        value = parse(raw, default)
        if valid is None or valid(value):
            return value
    kept = _kept()
    if key in kept and (valid is None or valid(kept[key])):
        return kept[key]
    return default


def bound(widget: Callable, label: str, key: str, default: Any, *, valid: Callable | None = None, **kwargs) -> Any:
    """Draw `widget(label, key=key, **kwargs)` (e.g. `st.sidebar.slider`) with its state initialised from
    the URL (or this session's earlier value, or `default`; a value `valid` rejects is skipped), and
    mirror its value back into the URL."""
    if key not in st.session_state or (valid is not None and not valid(st.session_state[key])):
        st.session_state[key] = initial(key, default, valid)
    value = widget(label, key=key, **kwargs)
    remember(key, value, default)
    return value


def remember(key: str, value: Any, default: Any) -> None:
    """Keep a view value for this session and in the URL (left out of the URL when it is the default)."""
    _kept()[key] = value
    if _same(value, default):
        if key in st.query_params:
            del st.query_params[key]
    elif st.query_params.get(key) != dump(value):
        st.query_params[key] = dump(value)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return list(a) == list(b)
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    return a == b


def set_view(params: dict[str, Any], *, reset: str | None = None) -> None:
    """Set a view's state (presets): write the values into session state and the URL. With `reset`
    (a key prefix such as "ex."), first forget every other view value under that prefix, so the view is
    exactly the preset on top of the defaults (an uploaded file and other private state stay)."""
    if reset is not None:  # only view values (the widgets drawn through `bound`), not a page's private state
        kept = _kept()
        for key in [k for k in kept if k.startswith(reset) and k not in params]:
            del kept[key]
            if key in st.session_state:
                del st.session_state[key]
        for key in [k for k in st.query_params if k.startswith(reset) and k not in params]:
            del st.query_params[key]
    for key, value in params.items():
        st.session_state[key] = value
        _kept()[key] = value
        st.query_params[key] = dump(value)


def literal(text: str, limit: int = 300) -> str:
    """A value from the URL (or typed) as markdown that shows it as it is: a code span, so a link's value cannot
    draw a link, an image or emphasis on the page; cut to `limit` characters."""
    text = str(text) if len(str(text)) <= limit else str(text)[:limit] + "..."
    text = text.replace("\n", " ")
    run = max((len(r) for r in re.findall("`+", text)), default=0)
    fence = "`" * (run + 1)
    pad = " " if text.startswith("`") or text.endswith("`") or not text.strip() else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def query(params: dict[str, Any]) -> dict[str, str]:
    """A view as query parameters (for st.switch_page(..., query_params=...))."""
    return {k: dump(v) for k, v in params.items()}


def forget(key: str) -> None:
    """Drop a view value everywhere (widget state, this session's memory, the URL), so its widget starts
    from its default on the next draw: batch-dependent state when the batch changes."""
    for store in (st.session_state, _kept(), st.query_params):
        if key in store:
            del store[key]


# ---------------------------------------------------------------------------------------------------------
# app-wide switches

PRESENT = "present"  # presenter mode: larger chart text, only the controls a lesson names
ADVANCED = "advanced"  # draw the knobs declared advanced (adv_tau)


def _switch(key: str) -> bool:
    """A 0/1 switch: the URL's value when it has one (then kept for the session), else the session's."""
    raw = st.query_params.get(key)
    if raw is not None:
        _kept()[key] = parse(raw, False)
    return bool(_kept().get(key, False))


def present() -> bool:
    """Presenter mode (`?present=1`): a projector's view. Stays on for the session until `?present=0`."""
    return _switch(PRESENT)


def show_advanced() -> bool:
    """Whether knob widgets draw the knobs declared advanced (`?advanced=1`, or the sidebar's switch)."""
    return _switch(ADVANCED)


def switches() -> dict[str, str]:
    """The app-wide switches that are on, as query parameters: a page switch carries them along."""
    return {k: "1" for k in (PRESENT, ADVANCED) if _kept().get(k)}


# ---------------------------------------------------------------------------------------------------------
# the batch shared between pages

BATCH_KEY = "batch.current"  # (explore_data.Source, payload bytes or None): the batch Explore shows


def current_batch():
    """The (Source, payload) Explore holds, or None before Explore has shown a batch. Build it with
    ui.explore_data.load_batch(src, _payload=payload)."""
    return st.session_state.get(BATCH_KEY)


def hold_batch(src, payload: bytes | None) -> bool:
    """Make (src, payload) the shared batch; True when it replaces a different one."""
    before = st.session_state.get(BATCH_KEY)
    st.session_state[BATCH_KEY] = (src, payload)
    return before is not None and before[0] != src


SEEN_KEY = "batch.uploads_seen"  # digests of the uploads this session has shown
ARRIVED_KEY = "batch.upload_arrived"  # the label of an upload Explore just sent to Diagnose (read once)


def first_look(src) -> bool:
    """True the first time this session shows the uploaded batch `src` (an explore_data.Source), on any page:
    an upload opens on Diagnose first. Marks it seen."""
    if src.kind != "upload":
        return False
    seen = st.session_state.setdefault(SEEN_KEY, set())
    new = src.digest not in seen
    seen.add(src.digest)
    return new


def fragment_rerun() -> bool:
    """Whether this script run reruns fragments only (not the whole page)."""
    from streamlit.runtime.scriptrunner import get_script_run_ctx

    ctx = get_script_run_ctx()
    return bool(ctx is not None and ctx.fragment_ids_this_run)
