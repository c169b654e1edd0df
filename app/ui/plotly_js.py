"""Which plotly.js the browser loads, from the app's static folder: plotly.js's cartesian bundle (scatter, bar,
histogram, heatmap, ...: every trace type the explorer draws), fetched from npm at set-up in the version the
installed plotly package writes figures for; else the full bundle the plotly package ships.

The cartesian bundle is a third of the full one (1.5 MB vs 4.8 MB) and a browser compiles it in about a third of
the time, which is most of a page's first load after the data. `make` runs this file (`python app/ui/plotly_js.py`);
without npm or the registry it says so and the explorer serves the full bundle. No streamlit here.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

STATIC = Path(__file__).resolve().parents[1] / "static"  # app/static/, served at /app/static/
PACKAGE = "plotly.js-cartesian-dist-min"
CARTESIAN = "plotly-cartesian.min.js"
FULL = "plotly.min.js"
CARTESIAN_TRACES = frozenset({"bar", "box", "contour", "heatmap", "histogram", "histogram2d", "histogram2dcontour",
                              "image", "pie", "scatter", "scatterternary", "violin"})  # the package's README


def version_of(js: Path) -> str | None:
    """The plotly.js version in a bundle's banner ("plotly.js (cartesian - minified) v4.1.1")."""
    with open(js, encoding="utf-8", errors="replace") as f:
        head = f.read(300)
    return next((w[1:] for w in head.split() if w.startswith("v") and w[1:2].isdigit()), None)


def wanted() -> str:
    """The plotly.js version the installed plotly package writes figures for."""
    from plotly.offline import get_plotlyjs_version

    return get_plotlyjs_version()


def _place(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    part = dst.with_suffix(".part")
    shutil.copyfile(src, part)
    part.replace(dst)  # whole or not at all: a server reading it never sees half a file


def fetch(static: Path = STATIC) -> Path:
    """npm pack the cartesian bundle of the wanted version into `static` (a no-op when it is there)."""
    version, dest = wanted(), static / CARTESIAN
    if dest.exists() and version_of(dest) == version:
        return dest
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("npm is not installed")
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([npm, "pack", "--silent", f"{PACKAGE}@{version}"], cwd=tmp, check=True,
                       capture_output=True, timeout=120)
        (tgz,) = Path(tmp).glob("*.tgz")
        with tarfile.open(tgz) as tar:
            tar.extract(f"package/{CARTESIAN}", tmp, filter="data")
        js = Path(tmp) / "package" / CARTESIAN
        if version_of(js) != version:
            raise RuntimeError(f"{PACKAGE}@{version} holds plotly.js {version_of(js)}")
        _place(js, dest)
    return dest


def publish(static: Path = STATIC) -> str:
    """The file in `static` the browser should load: the cartesian bundle when it is there in the wanted version,
    else the plotly package's full bundle, copied there (once per install)."""
    import plotly

    cartesian = static / CARTESIAN
    if cartesian.exists() and version_of(cartesian) == wanted():
        return CARTESIAN
    src, dst = Path(plotly.__file__).parent / "package_data" / FULL, static / FULL
    if not dst.exists() or dst.stat().st_size != src.stat().st_size:
        _place(src, dst)
    return FULL


if __name__ == "__main__":
    try:
        print(f"plotly.js cartesian bundle: {fetch(Path(sys.argv[1]) if len(sys.argv) > 1 else STATIC)}")
    except (RuntimeError, OSError, subprocess.SubprocessError, ValueError) as e:
        print(f"could not fetch {PACKAGE} ({e}): the explorer serves plotly's full bundle instead")
