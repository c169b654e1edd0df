"""PNG export: plotly figures as PNG bytes through kaleido and a headless chromium, all in one session."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Mapping
from pathlib import Path

import plotly.graph_objects as go

from .style import CHART_TEMPLATE

BROWSERS = ("chromium", "chromium-browser", "google-chrome")


def browser_path() -> str | None:
    """The chromium kaleido should drive: $BROWSER_PATH when set (read, never written), else Debian's."""
    given = os.environ.get("BROWSER_PATH")
    if given:
        return given
    for name in BROWSERS:
        found = shutil.which(name) or (f"/usr/bin/{name}" if os.path.exists(f"/usr/bin/{name}") else None)
        if found:
            return found
    return None


# On a loaded machine kaleido's page can be asked to render before its own scripts have run ("ReferenceError:
# kaleido_scopes is not defined", seen once in a make test beside another): a fresh session then succeeds.
RENDER_ATTEMPTS = 2


def to_png(figures: Mapping[str, go.Figure], *, width: int = 1200, scale: float = 2.0,
           browser: str | None = None) -> dict[str, bytes]:
    """Figures as PNG bytes (name -> bytes), in one headless-chromium session with MathJax off (nothing is
    downloaded). Raises RuntimeError, saying why, when kaleido or a chromium is missing or fails."""
    try:
        import kaleido
    except ImportError as e:
        raise RuntimeError("kaleido is not installed (pip install kaleido)") from e
    path = browser or browser_path()
    if path is None:
        raise RuntimeError("no chromium found for kaleido (install Debian's chromium or set BROWSER_PATH)")

    async def render() -> dict[str, bytes]:
        out = {}
        async with kaleido.Kaleido(n=1, mathjax=False, path=path) as k:
            for name, fig in figures.items():
                # a copy (cached figures stay) in the page's look: the template ui/runtime/chart.py draws with
                styled = go.Figure(fig.to_plotly_json()).update_layout(template=CHART_TEMPLATE)
                h = fig.layout.height or 500
                out[name] = await k.calc_fig(styled.to_dict(), opts=dict(format="png", width=width, height=h,
                                                                          scale=scale))
        return out

    for attempt in range(RENDER_ATTEMPTS):
        try:
            pngs = asyncio.run(render())
            break
        except Exception as e:  # kaleido reports a missing or broken browser with several exception types
            if attempt + 1 == RENDER_ATTEMPTS or not Path(path).exists():
                raise RuntimeError(f"kaleido could not render the figures: {e}") from e
    bad = [name for name, png in pngs.items() if not png.startswith(b"\x89PNG")]
    if bad:
        raise RuntimeError(f"kaleido returned something other than a PNG for {', '.join(bad)}")
    return pngs
