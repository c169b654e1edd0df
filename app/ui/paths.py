"""Which folders of the server the explorer reads: the roots, the one rule every path from the page passes, and
the runs found under the roots (the Run page's picker). No streamlit here: ui/served.py reads the configuration
and draws the widgets; this module decides.

The rule. A path typed on the page, carried in a link, or recorded in a scan is expanded (`~`), made absolute
against the folder the app was started in, and its `..` segments applied to the text (`a/link/..` is `a`, whatever
`link` is); that path must lie inside a root, as configured or as resolved, before the filesystem is asked
anything. Then its symlinks are resolved, and the result must lie inside a resolved root too. Paths are compared as
paths, never as string prefixes (/data/runs2 is not inside /data/runs). Applying `..` first means resolving never
walks through a folder outside the roots, so `/elsewhere/x/../../data/run` reveals nothing about /elsewhere (it is
/data/run). One message answers every refusal, whether the path is outside, missing, or not the kind asked for,
so the page answers no probes about what exists on the server. What is read afterwards is the resolved path,
never the text.

URL decoding belongs to whoever decodes: Streamlit decodes a query parameter once, and this module never decodes
again (a folder literally named `%2e%2e` is a name, not a way up).

The roots, first found wins: `python -m app --data-root PATH` (repeatable; it sets SEQIS_DATA_ROOTS), the
SEQIS_DATA_ROOTS environment variable (os.pathsep-separated), `[seqis] data_roots = [...]` in
.streamlit/secrets.toml; with none of them, the folder the app was started in, but only while the server listens
on loopback: a server reachable from other machines with no roots configured reads no typed path at all (uploads
work as always). The repository's assets/ (the shipped examples, nothing else) is always readable.
"""

from __future__ import annotations

import ipaddress
import os
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from seqis.io.columns import ASSETS_DIR, FORMATS
from seqis.io.prime_rl_lines import RANK_FILE
from seqis.runs.layout import STEP_DIR, STEP_IN_NAME
from seqis.runs.scan import _META_KEY as SCAN_META  # the footer key write_scan sets: what makes a parquet a scan

ENV = "SEQIS_DATA_ROOTS"
FLAG = "--data-root"
DEPTH = 4  # folders below a root the picker looks into (assets/runs/prime_rl_example is 2 below assets/)
ENTRIES = 20_000  # directory entries the picker's walk reads at most, over all roots
FOUND = 200  # runs and scans it lists at most
FOOTERS = 200  # parquet footers it reads at most (is it a scan?)
SKIP = ("__pycache__", "node_modules", "site-packages")  # never runs; hidden folders (.git, .venv) are skipped too


class Refused(ValueError):
    """A path the page may not read. str() is the message; message(quote) quotes the paths in it (the page shows
    them literally: a path from a link must not draw a link or an image)."""

    def __init__(self, template: str, *paths: str):
        self.template, self.paths = template, paths
        super().__init__(self.message())

    def message(self, quote=str) -> str:
        return self.template.format(*(quote(p) for p in self.paths))


@dataclass(frozen=True)
class Roots:
    """Where paths from the page may point."""

    paths: tuple[Path, ...]  # resolved; assets/ always among them
    base: Path  # the folder the app was started in: relative paths are relative to it
    source: str  # where the roots came from: SEQIS_DATA_ROOTS (or --data-root), secrets.toml, default
    off: str | None = None  # why typed paths are off (a server beyond loopback with no roots configured)
    given: tuple[Path, ...] = ()  # as configured (absolute, `..` applied, links not resolved): /data/runs typed
    # through a link the root is reached by passes the first check

    @property
    def on(self) -> bool:
        return self.off is None

    def shown(self) -> str:
        return ", ".join(str(p) for p in self.paths)


def is_loopback(address: str | None) -> bool:
    """Whether Streamlit's server.address keeps the server on this machine. Unset means every interface (what
    Streamlit binds then); a host name or a unix socket (what a reverse proxy forwards the world to) counts as
    beyond loopback too."""
    if not address:
        return False
    host = address.strip().strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _lexical(text: str, base: Path) -> Path:
    """`text` expanded, made absolute against `base`, `.` and `..` applied to the text: no filesystem access but
    the home folder's lookup for `~user`."""
    p = Path(text)
    try:
        p = p.expanduser()
    except RuntimeError:  # no home folder to expand ~ to: the name stays literal (a folder called ~)
        pass
    return Path(os.path.normpath(p if p.is_absolute() else base / p))


def _resolved(lexical: Path) -> Path:
    """Symlinks resolved (os.path.realpath: a missing path resolves as far as it exists and raises nothing)."""
    return Path(os.path.realpath(lexical))


def split(value) -> list[str]:
    """A roots setting as a list of paths: an os.pathsep-separated string (the environment variable) or a list
    of strings (secrets.toml); empty entries dropped."""
    if value is None:
        return []
    if isinstance(value, str):
        return [s.strip() for s in value.split(os.pathsep) if s.strip()]
    if isinstance(value, (list, tuple)) and all(isinstance(s, str) for s in value):
        return [s.strip() for s in value if s.strip()]
    raise ValueError(f"data_roots: a list of folders, got {value!r}")


def roots_from(env: str | None, secrets, address: str | None, *, base: Path | None = None,
               assets: Path = ASSETS_DIR) -> Roots:
    """The roots: SEQIS_DATA_ROOTS (`env`, which --data-root sets), else secrets.toml's [seqis] data_roots
    (`secrets`), else the start folder when `address` is loopback, else none (typed paths off). Relative roots
    are relative to `base` (the start folder)."""
    base = _resolved(Path(base or Path.cwd()))
    shipped = _resolved(Path(assets))
    for source, value in ((f"{ENV} (or {FLAG})", env), ("secrets.toml [seqis] data_roots", secrets)):
        given = [_lexical(s, base) for s in split(value)]
        if given:
            return Roots(_unique([_resolved(g) for g in given] + [shipped]), base, source, given=_unique(given))
    if is_loopback(address):
        return Roots(_unique([base, shipped]), base, "default")
    where = f"server.address {address}" if address else "every interface (server.address unset)"
    return Roots((shipped,), base, "default", off=f"this server listens on {where} and no data roots are set")


def _unique(paths: list[Path]) -> tuple[Path, ...]:
    return tuple(dict.fromkeys(paths))


def inside(resolved: Path, roots: Roots) -> bool:
    """Whether a resolved path lies inside a resolved root."""
    return any(resolved.is_relative_to(r) for r in roots.paths)


WHAT = {"folder": "run folder", "file": "scan file", "path": "file or folder"}


def refusal(text: str, roots: Roots, kind: str = "path") -> Refused:
    """The one refusal of a path the page may not read, whatever the reason."""
    hint = f"to read another folder, start the server with `python -m app --data-root FOLDER` or set {ENV}"
    return Refused(f"{{}}: no {WHAT[kind]} by that name in the folders this server reads ({{}}); {hint}", text,
                   roots.shown())


def confine(text: str, roots: Roots, kind: str = "path") -> Path:
    """The resolved path `text` names, when it lies inside a root and (kind "folder" / "file") is one; else
    Refused with refusal()'s message, the same for every reason. Containment is decided before anything is
    looked up: first on the text (`..` applied), then on the resolved path."""
    text = str(text).strip()
    if not text or "\x00" in text:
        raise refusal(text, roots, kind)
    lexical = _lexical(text, roots.base)
    if not any(lexical.is_relative_to(r) for r in roots.given + roots.paths):
        raise refusal(text, roots, kind)
    resolved = _resolved(lexical)  # reads the links of a path inside a root, and of what they point to
    if not inside(resolved, roots):
        raise refusal(text, roots, kind)
    if (kind == "folder" and not resolved.is_dir()) or (kind == "file" and not resolved.is_file()):
        raise refusal(text, roots, kind)
    return resolved


def check_files(files, roots: Roots, where: str) -> None:
    """Refuse a run whose files (inside a confined folder) lead out of the roots: a step folder or file that is a
    symlink to elsewhere. `where` names the run in the message; the target is not named. A run's thousands of files
    share a few hundred step folders, which share their parents: one lstat per folder and per file (is it a link?),
    a full resolve only for a link."""
    real: dict[str, str] = {}  # folder -> resolved

    def resolve(p: str) -> str:
        if p not in real:
            head, name = os.path.split(p)
            real[p] = p if not name else os.path.realpath(p) if os.path.islink(p) else os.path.join(resolve(head), name)
        return real[p]

    folders: dict[str, bool] = {}  # folder -> whether it resolves inside a root
    for f in files:  # strings, not Paths: this runs on every rerun of a run's page, for each of its files
        f = os.fspath(f)
        f = f if os.path.isabs(f) else os.path.abspath(f)
        folder, _, name = f.rpartition(os.sep)
        ok = folders.get(folder)
        if ok is None:
            ok = folders[folder] = inside(Path(resolve(folder or os.sep)), roots)
        if not ok or (os.path.islink(f) and not inside(_resolved(Path(f)), roots)):
            raise Refused("{}: {} links out of the folders this server reads; it is not read", where, name)


def shown(path: Path, roots: Roots) -> str:
    """A path as the page shows it (and keeps in the URL): relative to the start folder when inside it."""
    return str(path.relative_to(roots.base)) if path.is_relative_to(roots.base) else str(path)


# ---------------------------------------------------------------------------------------------------------
# the runs under the roots, for the picker


@dataclass(frozen=True)
class Found:
    """What the picker found: run folders and scan parquets (paths as found below a root), and whether the walk
    stopped at one of its bounds before seeing everything."""

    folders: tuple[Path, ...]
    files: tuple[Path, ...]
    cut: bool


def _is_scan(path: Path) -> bool:
    import pyarrow.parquet as pq

    try:
        return SCAN_META in (pq.read_schema(path).metadata or {})
    except (OSError, ValueError):  # not a parquet (ArrowInvalid is a ValueError), unreadable
        return False


def _is_run(entries: list[os.DirEntry]) -> bool:
    """A folder load_run reads (seqis.runs.layout's rules, on names only): step_N/ folders, rank_R.jsonl files,
    step-named dumps, or a token_exports/ folder (prime-rl's output dir)."""
    for e in entries:
        if e.name == "token_exports" or STEP_DIR.match(e.name) or RANK_FILE.match(e.name):
            return True
        if Path(e.name).suffix.lower() in FORMATS and STEP_IN_NAME.search(Path(e.name).stem):
            return True
    return False


def find(roots: Roots, *, depth: int = DEPTH, entries: int = ENTRIES, found: int = FOUND,
         footers: int = FOOTERS) -> Found:
    """Run folders and scan parquets under the roots, breadth first (shallow ones first when a bound cuts the
    walk): at most `depth` folders down, `entries` directory entries read, `found` results, `footers` parquet
    footers read. Hidden folders are skipped; a symlink is followed only when it resolves inside a root, and no
    folder is read twice (overlapping roots, links back up)."""
    folders: list[Path] = []
    files: list[Path] = []
    seen: set[Path] = set()
    queue = deque((r, 0) for r in roots.paths)
    budget, cut = entries, False
    while queue:
        if len(folders) + len(files) >= found:
            cut = True
            break
        folder, level = queue.popleft()
        real = _resolved(folder)
        if real in seen or not inside(real, roots):
            continue
        seen.add(real)
        try:
            with os.scandir(folder) as it:
                listing = []
                for e in it:
                    budget -= 1
                    if budget < 0:
                        break
                    listing.append(e)
        except OSError:  # not a folder, unreadable
            continue
        if budget < 0:
            cut = True
            break
        if _is_run(listing):  # offered, and not looked into: its step folders are not runs of their own
            folders.append(folder)
            continue
        for e in sorted(listing, key=lambda e: e.name):
            if e.name.startswith(".") or e.name in SKIP:
                continue
            try:
                if e.is_symlink() and not inside(_resolved(Path(e.path)), roots):
                    continue  # a link out of the roots: not followed, not offered
                if e.is_dir() and level < depth:
                    queue.append((Path(e.path), level + 1))
                elif e.name.lower().endswith(".parquet") and e.is_file() and not STEP_IN_NAME.search(e.name):
                    if footers > 0:
                        footers -= 1
                        if _is_scan(Path(e.path)):
                            files.append(Path(e.path))
                    else:
                        cut = True
            except OSError:
                continue
    folders = sorted(folders, key=lambda p: _in_order(p, roots))[:found]
    files = sorted(files, key=lambda p: _in_order(p, roots))
    return Found(tuple(folders), tuple(files[:max(0, found - len(folders))]), cut)


def _in_order(path: Path, roots: Roots) -> tuple[int, Path]:
    """The picker's order: the roots as named (the shipped assets last), by path within each; not by where the
    folders happen to lie on disk."""
    real = _resolved(path)
    return next((i for i, r in enumerate(roots.paths) if real.is_relative_to(r)), len(roots.paths)), path
