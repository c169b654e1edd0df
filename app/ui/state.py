"""Page state that lives in the URL, so a copied link reopens the same view.

Every widget that defines a view is drawn through `bound(...)`, which hands it to Streamlit's own binding
(`bind="query-params"`, `persist_state="session"`, Streamlit 1.67): its first value comes from the URL's query
parameter of the same key, else from the value it had earlier in this session (kept across page switches), else
the default; Streamlit writes each change into the URL (a value equal to the default is left out, so links stay
short). Keys are prefixed per page ("ex.", "bv.", "lt.") so pages never share widget state. `set_view` sets a whole
view at once (Learn's presets) and `forget` puts one value back to its default; both write session state, since
Streamlit refuses `st.query_params` writes to a bound key, and the widgets then update the URL themselves.

The URL form is Streamlit's: a selection widget's option as its `format_func` shows it (a list as repeated
parameters, `?ex.est=seq_tis&ex.est=seq_is`), a switch as true/false, a number as written. `url_form` gives that form
and `query` makes links in it; a link in this module's older form (`dump`: "2.0", "inf", "a,b", "1") is read too
(`bound` puts its value into session state, and it reaches the URL in Streamlit's form), so old links keep working.

Two switches hold for the whole app, kept for the session and in the URL: presenter mode (`?present=1`, `present()`)
and the advanced knobs (`?advanced=true`, `show_advanced()`).

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

from .st_private import unless_bound

_FORMS = "_view_forms"  # session-state dict: key of each widget drawn this session -> its value's URL form
_ADOPTED = "_view_adopted"  # session-state dict: widget keys read from an old-form link on the run before
_RESET = "_view_reset"  # session-state dict: widget keys `forget` put back to their default, until drawn
_SWITCHES = "_view_switches"  # session-state dict: app-wide switch -> on, kept across page switches

CHOICE_WIDGETS = ("selectbox", "radio", "select_slider", "multiselect", "segmented_control", "pills")
_INDEXED = ("selectbox", "radio")  # take their default as `index`
_MANY = ("multiselect", "segmented_control", "pills")  # take their default as `default`; the rest as `value`


def dump(value: Any) -> str:
    """A value in this module's older URL form (still read from old links; `url_form` is the one written now)."""
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
    """A query-parameter string (the older form, or a knob slider's shown number: "∞", "off") as a value of the
    default's type; the default if it does not parse."""
    if raw in ("∞", "off") and not isinstance(default, (str, list, tuple, bool)):
        raw = {"∞": "inf", "off": "none"}[raw]
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


def _kind(widget: Callable) -> str:
    """The Streamlit command a widget is (`st.sidebar.select_slider` -> "select_slider")."""
    return getattr(widget, "__name__", "")


def url_form(kind: str, value: Any, format_func: Callable | None = None) -> str | list[str]:
    """`value` as Streamlit's binding writes it into the URL for a widget of `kind`: a choice as its format_func
    shows it (several as a list: repeated parameters), a switch as true/false, anything else as str."""
    if kind in CHOICE_WIDGETS:
        show = format_func or str
        if isinstance(value, (list, tuple)):
            return [str(show(v)) for v in value]
        return str(show(value))
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _store(name: str) -> dict:
    if name not in st.session_state:
        st.session_state[name] = {}
    return st.session_state[name]


def _start(kind: str, default: Any, kwargs: dict) -> dict:
    """The keyword that gives a widget of `kind` its default, so Streamlit's binding knows it (a default value is
    left out of the URL, and a link without the key opens at it)."""
    if kind in _INDEXED:
        if "index" in kwargs:
            return {}
        options = list(kwargs.get("options", ()))
        return {"index": options.index(default) if default in options else 0}
    if kind in _MANY:
        return {} if "default" in kwargs else {"default": default}
    return {} if "value" in kwargs else {"value": default}


def _adopt_old_link(kind: str, key: str, default: Any, valid: Callable | None, kwargs: dict) -> None:
    """A link's value for `key` in this module's older form ("2.0" where the knob slider shows "2", "a,b", "1",
    "upload" where the radio shows "Upload your batch"), which Streamlit's binding ignores and drops from the URL:
    read here into session state, so the link opens its view. Streamlit's binding reads the URL as the page loaded,
    so the value goes back into the URL (in Streamlit's form) on the next run, as a programmatic set."""
    adopted = _store(_ADOPTED)
    if key in adopted:  # adopted on the run before: set again, so Streamlit writes it into the URL
        del adopted[key]
        if key in st.session_state:
            st.session_state[key] = st.session_state[key]
        return
    raw = st.query_params.get_all(key)
    if not raw or key in st.session_state:
        return
    options = list(kwargs.get("options", ())) if kind in CHOICE_WIDGETS else None
    if options is not None:
        shown = {str(url_form(kind, o, kwargs.get("format_func"))) for o in options}
        if all(r in shown for r in raw):
            return
    value = parse(",".join(raw), default)
    values = value if isinstance(value, (list, tuple)) else [value]
    if (options is not None and not all(v in options for v in values)) or (valid is not None and not valid(value)):
        return
    new = url_form(kind, value, kwargs.get("format_func"))
    if (new if isinstance(new, list) else [new]) != raw:
        st.session_state[key] = value
        adopted[key] = True


def _into_url(kind: str, key: str, default: Any, fmt: Callable | None) -> None:
    """A value set in session state for a widget not yet bound (a preset, `set_view`, one kept from an earlier page)
    written into the URL before the widget binds it: Streamlit's binding writes a value into the URL when the user
    moves the widget, not when code set it before the widget's first draw."""
    value = st.session_state.get(key, default)
    if key in st.session_state and key not in st.query_params and value != default:
        with unless_bound():
            st.query_params[key] = url_form(kind, value, fmt)


def bound(widget: Callable, label: str, key: str, default: Any, *, valid: Callable | None = None, **kwargs) -> Any:
    """Draw `widget(label, key=key, **kwargs)` (e.g. `st.sidebar.slider`) bound to the URL's `key` and kept for the
    session by Streamlit (`bind="query-params"`, `persist_state="session"`), starting at `default`. A session value
    `valid` rejects is dropped first (the widget then starts from the URL or the default); an old-form link value
    is read too (`_adopt_old_link`)."""
    kind = _kind(widget)
    fmt = kwargs.get("format_func")
    _store(_FORMS)[key] = lambda v, kind=kind, fmt=fmt: url_form(kind, v, fmt)
    if _store(_RESET).pop(key, False):  # `forget` asked for the default
        st.session_state[key] = default
    elif key in st.session_state and valid is not None and not valid(st.session_state[key]):
        del st.session_state[key]
    _adopt_old_link(kind, key, default, valid, kwargs)
    _into_url(kind, key, default, fmt)
    return widget(label, key=key, **_start(kind, default, kwargs), **kwargs, bind="query-params",
                  persist_state="session")


def initial(key: str, default: Any, valid: Callable | None = None) -> Any:
    """The value the widget `key` starts from before it is drawn (or an undrawn knob's): this session's value, else
    the URL's (in either form; a choice as its option, read by `peek`), else `default`."""
    if key in st.session_state and (valid is None or valid(st.session_state[key])):
        return st.session_state[key]
    raw = st.query_params.get_all(key)
    if raw:
        value = parse(",".join(raw), default) if isinstance(default, (list, tuple)) else parse(raw[0], default)
        if valid is None or valid(value):
            return value
    return default


def peek(key: str, default: Any, options: dict) -> Any:
    """The choice (a key of `options`, shown as its value) the radio or select box `key` starts from before it is
    drawn: this session's, else the URL's in either form, else `default`."""
    if key in st.session_state and st.session_state[key] in options:
        return st.session_state[key]
    raw = st.query_params.get(key)
    by_shown = {v: k for k, v in options.items()}
    return raw if raw in options else by_shown.get(raw, default)


def keep_in_url(key: str, value: Any, default: Any, form: Callable[[Any], str] = str) -> None:
    """Write a value no widget is bound to into the URL as `form` shows it (left out when it is the default): an
    uploaded file's name, a knob left undrawn (in its slider's form, which the slider reads when drawn again). A key
    still bound from the run before (a knob just hidden) is skipped: Streamlit drops a hidden widget's parameter at
    the end of this run, and the next run writes it back here."""
    with unless_bound():
        if value == default:
            if key in st.query_params:
                del st.query_params[key]
        elif st.query_params.get(key) != form(value):
            st.query_params[key] = form(value)


def set_view(params: dict[str, Any], *, reset: str | None = None) -> None:
    """Set a view's state (presets) in session state; its widgets take it and write it into the URL. With `reset`
    (a key prefix such as "ex."), every other widget value under that prefix drawn this session goes back to its
    default, so the view is exactly the preset on top of the defaults (an uploaded file and other private state
    stay). Call before the widgets are drawn in this run (Streamlit refuses a write after)."""
    if reset is not None:
        for key in _store(_FORMS):
            if key.startswith(reset) and key not in params:
                forget(key)
    for key, value in params.items():
        st.session_state[key] = value


def literal(text: str, limit: int = 300) -> str:
    """A value from the URL (or typed) as markdown that shows it as it is: a code span, so a link's value cannot
    draw a link, an image or emphasis on the page; cut to `limit` characters."""
    text = str(text) if len(str(text)) <= limit else str(text)[:limit] + "..."
    text = text.replace("\n", " ")
    run = max((len(r) for r in re.findall("`+", text)), default=0)
    fence = "`" * (run + 1)
    pad = " " if text.startswith("`") or text.endswith("`") or not text.strip() else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def query(params: dict[str, Any]) -> dict[str, str | list[str]]:
    """A view as query parameters in its widgets' URL form (for `switch_page` after `set_view`), for the widgets drawn
    this session, whose form is known: the others write their value from session state into the URL when drawn."""
    forms = _store(_FORMS)
    return {k: forms[k](v) for k, v in params.items() if k in forms}


def switch_page(page, params: dict[str, Any] | None = None):
    """st.switch_page to `page` with `params` (a view, `query`'s form) and the app-wide switches in its URL. Always
    with query parameters: without them Streamlit clears the URL, which it refuses while a widget is bound to it.
    The page's own widgets bring back their values kept for the session (persist_state), URL included."""
    st.switch_page(page, query_params={**switches(), **(params or {})})


def forget(key: str, now: Any = None) -> None:
    """Put a view value back to its default: batch-dependent state when the batch changes. Its widget, when next
    drawn, is set to the default it is drawn with (which may depend on the new batch), and Streamlit drops it from
    the URL; until then the value is `now` (one valid on any batch, for code that reads it before the widget is
    drawn), or stays. Not dropped from session state: a dropped bound widget is seeded again from the browser's URL,
    which still holds the old value (checked in Chromium)."""
    if now is not None and key in st.session_state:
        st.session_state[key] = now
    _store(_RESET)[key] = True


# ---------------------------------------------------------------------------------------------------------
# app-wide switches

PRESENT = "present"  # presenter mode: larger chart text, only the controls a lesson names
ADVANCED = "advanced"  # draw the knobs declared advanced (adv_tau)


def present() -> bool:
    """Presenter mode (`?present=1`): a projector's view. Stays on for the session until `?present=0`. No widget
    holds it, so its URL parameter is read here by hand."""
    raw = st.query_params.get(PRESENT)
    if raw is not None:
        _store(_SWITCHES)[PRESENT] = parse(raw, False)
    return bool(_store(_SWITCHES).get(PRESENT, False))


def show_advanced() -> bool:
    """Whether knob widgets draw the knobs declared advanced: the sidebar's bound switch (`?advanced=true`), or,
    while it is not drawn (presenter mode), its value kept for the session or a link's."""
    if ADVANCED in st.session_state:
        return bool(st.session_state[ADVANCED])
    raw = st.query_params.get(ADVANCED)
    return raw is not None and parse(raw, False)


def switches() -> dict[str, str]:
    """The app-wide switches that are on and no widget carries, as query parameters: a page switch carries them
    along (the advanced switch's widget keeps itself, except in presenter mode, which does not draw it)."""
    out = {PRESENT: "1"} if present() else {}
    if out and show_advanced():
        out[ADVANCED] = "true"
    return out


# ---------------------------------------------------------------------------------------------------------
# the batch shared between pages

BATCH_KEY = "batch.current"  # (explore_data.Source, payload bytes or None): the batch Explore shows


_PAGES = "_view_pages"  # session-state list: the page this run shows, and the one the run before showed


def note_page(path: str) -> None:
    """The frame's call, before the page runs: which page this run shows (for `arrived`)."""
    pages = st.session_state.setdefault(_PAGES, [None, None])
    pages[:] = [pages[1], path]


def arrived() -> bool:
    """Whether this run is the first on its page since another page ran (a switch, from a link or the sidebar)."""
    before, now = st.session_state.get(_PAGES, [None, None])
    return before != now


def keep_view(params: dict[str, Any]) -> None:
    """Carry a view's values (a shared batch's knobs) onto a page just arrived at, where neither the URL nor a reset
    says otherwise: Streamlit's sidebar navigation keeps only some bound values in the URL (Explore's 64 x 512 batch
    arrived on Compare as the default 256 x 4096, checked in Chromium), so a page that shows "Explore's batch" sets
    the knobs of the batch Explore holds before its widgets are drawn."""
    reset = _store(_RESET)
    set_view({k: v for k, v in params.items() if k not in st.query_params and k not in reset})


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
