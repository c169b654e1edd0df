"""The folders this server reads, as it is configured (SEQIS_DATA_ROOTS, which `python -m app --data-root` sets;
secrets.toml's [seqis] data_roots; Streamlit's server.address), and the picker through which a server path enters
from the page. The rule itself is ui/paths.py's; every path from the page, a link or a scan passes `confine`.
"""

from __future__ import annotations

import os
from pathlib import Path

import streamlit as st

from . import paths
from .state import bound, literal

WALK_TTL_S = 60  # the picker's list of runs is looked for again after this long (a new run shows up)


def _secret():
    """[seqis] data_roots from .streamlit/secrets.toml (or ~/.streamlit/secrets.toml), None when not set."""
    try:
        section = st.secrets.get("seqis")
    except FileNotFoundError:  # no secrets file (StreamlitSecretNotFoundError is one)
        return None
    return section.get("data_roots") if section else None


def roots() -> paths.Roots:
    """The roots this server reads now. A malformed setting turns typed paths off, saying why."""
    address = st.get_option("server.address")
    try:
        return paths.roots_from(os.environ.get(paths.ENV), _secret(), address)
    except ValueError as e:
        off = paths.roots_from(None, None, None)
        return paths.Roots(off.paths, off.base, "secrets.toml [seqis] data_roots", off=f"secrets.toml [seqis] {e}")


def confine(text: str, kind: str = "path") -> Path:
    """paths.confine against this server's roots (raises paths.Refused)."""
    return paths.confine(text, roots(), kind)


def check_files(files, where: str) -> None:
    """paths.check_files against this server's roots (raises paths.Refused)."""
    paths.check_files(files, roots(), where)


def off_note(r: paths.Roots) -> str:
    return (f"Paths on this server are off: {r.off}. Uploads work as always. To read runs here, name the folders "
            "the explorer may read: `python -m app --data-root /path/to/runs` (repeatable), "
            f"`{paths.ENV}=/path/a{os.pathsep}/path/b`, or `data_roots = [\"/path/to/runs\"]` under `[seqis]` in "
            ".streamlit/secrets.toml; or serve on this machine only (`--server.address 127.0.0.1`). "
            "docs/serving.md says more.")


@st.cache_data(ttl=WALK_TTL_S, max_entries=4, show_spinner="Looking for runs...")
def _found(root_paths: tuple[str, ...], base: str) -> paths.Found:
    return paths.find(paths.Roots(tuple(Path(p) for p in root_paths), Path(base), "picker"))


def found(r: paths.Roots) -> paths.Found:
    """The run folders and scan parquets under the roots (a bounded walk, cached for WALK_TTL_S)."""
    return _found(tuple(map(str, r.paths)), str(r.base))


def pick(where, label: str, key: str, kind: str, placeholder: str, help: str) -> Path | None:
    """The Run page's picker: a selectbox of the run folders (kind "folder") or scan parquets ("file") found under
    the roots, which also takes a typed path. Returns the confined, resolved path, or None (nothing picked, or
    refused: the refusal is shown, one message whether or not the path exists)."""
    r = roots()
    if not r.on:
        where.info(off_note(r), icon=":material/lock:")
        return None
    hits = found(r)
    options = [paths.shown(p, r) for p in (hits.folders if kind == "folder" else hits.files)]
    text = bound(where.selectbox, label, key, None, options=options, index=None, accept_new_options=True,
                 placeholder=placeholder, help=help)
    what = ("run folder" if kind == "folder" else "scan file") + ("" if len(options) == 1 else "s")
    note = f"{len(options)} {what} found" if options else f"No {what} found"
    where.caption(f"{note} under {', '.join(literal(str(p)) for p in r.paths)}"
                  + (" (the search stopped early: type the path of one deeper down)." if hits.cut else "."))
    if text is None or not str(text).strip():
        return None
    try:
        return paths.confine(text, r, kind)
    except paths.Refused as e:
        where.error(e.message(literal))
        return None
