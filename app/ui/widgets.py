"""Widgets generated from declared knobs: a config class in, a validated config instance out.

A knob's metadata (seqis.core.types.knob) gives its help text, slider range, log scale, whether None is
allowed and its choices, so a new estimator or scenario needs no page edit.
"""

from __future__ import annotations

import math
from dataclasses import MISSING

import streamlit as st

from seqis.core.types import knobs

from .state import bound, initial, keep_in_url, show_advanced

MANTISSAS = (1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0)  # nice values per decade (log knobs)
LINEAR_STEPS = 40  # about this many steps on a linear slider


def nice(x: float) -> float:
    """x rounded to 4 significant digits (slider values people can read)."""
    return float(f"{x:.4g}")


def _nice_step(span: float, n: int) -> float:
    """A step of 1, 2, 2.5 or 5 x 10^k near span / n."""
    raw = span / n
    k = math.floor(math.log10(raw))
    for m in (1.0, 2.0, 2.5, 5.0, 10.0):
        if m * 10**k >= raw:
            return m * 10**k
    return 10.0 ** (k + 1)


def _log_grid(lo: float, hi: float) -> list[float]:
    k0, k1 = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    vals = {nice(m * 10**k) for k in range(k0, k1 + 1) for m in MANTISSAS}
    return [v for v in vals if lo * (1 - 1e-9) <= v <= hi * (1 + 1e-9)] + [lo, hi]


def _linear_grid(lo: float, hi: float) -> list[float]:
    step = _nice_step(hi - lo, LINEAR_STEPS)
    start = math.ceil(lo / step - 1e-9) * step
    n = int(math.floor((hi - start) / step + 1e-9))
    return [nice(start + i * step) for i in range(n + 1)] + [lo, hi]


def knob_grid(field) -> list:
    """The values a knob's slider offers over its ui range: nice numbers per decade on a log knob whose
    range spans a factor of 4 or more, else a linear grid with a 1/2/2.5/5 step; powers of two (and
    1.5 times them) for log-scaled integers; the default always in it,
    and +inf at the end where the knob declares it (inf=True)."""
    m = field.metadata
    lo, hi = m["ui"]
    default = field.default
    is_int = isinstance(default, int) and not isinstance(default, bool)
    if is_int and m["log"] and lo > 0:
        pows = {int(b * 2**k) for k in range(0, 40) for b in (1, 1.5) if lo <= b * 2**k <= hi}
        values = pows | {int(lo), int(hi)}
    elif is_int:
        step = max(1, int(_nice_step(hi - lo, LINEAR_STEPS))) if hi - lo > 2 * LINEAR_STEPS else 1
        values = set(range(int(lo), int(hi) + 1, step)) | {int(hi)}
    elif m["log"] and lo > 0 and hi / lo >= 4:
        values = set(_log_grid(lo, hi))
    else:
        values = set(_linear_grid(lo, hi))
    if isinstance(default, (int, float)) and not isinstance(default, bool) and math.isfinite(default):
        values.add(default)
    grid = sorted(values)
    if default == math.inf or m["inf"]:  # the knob declares that +inf means "off"
        grid.append(math.inf)
    return grid


def fmt(v) -> str:
    if v is None:
        return "off"
    if isinstance(v, float):
        return "∞" if v == math.inf else f"{v:.4g}"
    return str(v)


def _admissible(field, v) -> bool:
    """A number the knob's declared constraints accept (outside the slider's range is fine)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v) or v == -math.inf:
        return False
    m = field.metadata
    if m["finite"] and v == math.inf:
        return False
    return (m["gt"] is None or v > m["gt"]) and (m["ge"] is None or v >= m["ge"])


def _with_value(grid: list, v) -> list:
    """The grid with v added in order (None stays first, inf last)."""
    head = [g for g in grid if g is None]
    nums = sorted({g for g in grid if g is not None} | {v})
    return head + nums


def knob_widgets(cls, prefix: str, *, container=st, exclude: tuple[str, ...] = (), defaults: dict | None = None,
                 advanced: tuple[str, ...] = (), advanced_container=None):
    """One widget per knob of `cls`, keyed `{prefix}.{field}` and bound to the URL; returns
    (config instance or None, error message or None).

    defaults: start values that differ from the config's own (the page's first view); advanced: knobs
    drawn in `advanced_container` (e.g. an expander) instead of `container`, and only while it is open when it
    tracks its state (an expander with on_change="rerun": a closed one's widgets are not sent, since a collapsed
    expander's widgets still cost the browser a render on every run; they keep their values, as an undrawn
    advanced knob does, and a value off its default is noted in `container`). A value from the URL or a
    preset that is off the slider's grid but valid for the knob is added to the grid. A knob declared
    advanced (adv_tau) is drawn only while the app shows its advanced knobs (state.show_advanced); else it
    keeps its value from the URL or this session, or its default, and says so when that is not the default."""
    values = {}
    defaults = defaults or {}
    for f in knobs(cls):
        if f.name in exclude:
            continue
        m = f.metadata
        key = f"{prefix}.{f.name}"
        tucked = f.name in advanced and advanced_container is not None
        where = advanced_container if tucked else container
        default = defaults.get(f.name, f.default if f.default is not MISSING else None)
        if m.get("advanced") and not show_advanced():
            values[f.name] = _hidden(f, key, default, container)
            continue
        if tucked and getattr(where, "open", None) is False:
            values[f.name] = _hidden(f, key, default, container, why="its knob is in the closed section above")
            continue
        if m["choices"] is not None:
            values[f.name] = bound(where.selectbox, f.name, key, default, options=list(m["choices"]),
                                   help=m["help"], valid=lambda v, c=m["choices"]: v in c)
            continue
        if isinstance(default, bool):
            values[f.name] = bound(where.checkbox, f.name, key, default, help=m["help"])
            continue
        grid = knob_grid(f)
        if m["optional"]:
            grid = [None, *grid]
        for v in (default, initial(key, default)):  # the session's or the link's value, which may be off the grid
            if v is not None and v not in grid and _admissible(f, v):
                grid = _with_value(grid, v)
        values[f.name] = bound(where.select_slider, f.name, key, default, options=grid, format_func=fmt,
                               help=m["help"], valid=lambda v, g=grid: v in g)
    try:
        return cls(**values), None
    except ValueError as e:
        return None, str(e)


def _hidden(field, key: str, default, container, why: str = "an advanced knob, set by the link"):
    """A knob left undrawn: its value from the URL or this session (if the knob admits it), else the default, kept
    in the URL as a drawn widget's would be; a note saying `why` when it is not the default."""
    value = initial(key, default, valid=lambda v: v == default or _admissible(field, v))
    keep_in_url(key, value, default, fmt)  # no widget is bound to it: kept in the URL by hand, in its slider's form
    if value != default:
        container.caption(f"{field.name} = {fmt(value)} ({why})")
    return value


def config_from_state(cls, prefix: str, defaults: dict | None = None):
    """The config the knob widgets `knob_widgets(cls, prefix, defaults=...)` hold now, read from session state
    without drawing them (a section outside their fragment reads it); None when the values make an invalid
    config."""
    values = {}
    defaults = defaults or {}
    for f in knobs(cls):
        key = f"{prefix}.{f.name}"
        default = defaults.get(f.name, f.default if f.default is not MISSING else None)
        values[f.name] = initial(key, default)
    try:
        return cls(**values)
    except (ValueError, TypeError):
        return None
