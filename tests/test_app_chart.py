"""The explorer's chart component (app/ui/runtime/chart.py) and which plotly.js it serves (app/ui/plotly_js.py)."""

import json
import subprocess

import numpy as np
import plotly.graph_objects as go
import pytest
from pages import APP  # noqa: F401  (puts the app's `ui` package on the path)
from ui import plotly_js
from ui.runtime import chart
from ui.style import CHART_TEMPLATE


def _bundle(path, banner: str) -> None:
    path.write_text(f"/**\n* {banner}\n* Copyright 2012-2026, Plotly, Inc.\n*/\nwindow.Plotly = {{}};\n")


def test_the_cartesian_bundle_is_served_only_in_the_version_plotly_writes_for(tmp_path):
    want = plotly_js.wanted()
    _bundle(tmp_path / plotly_js.CARTESIAN, f"plotly.js (cartesian - minified) v{want}")
    assert plotly_js.version_of(tmp_path / plotly_js.CARTESIAN) == want
    assert plotly_js.publish(tmp_path) == plotly_js.CARTESIAN
    _bundle(tmp_path / plotly_js.CARTESIAN, "plotly.js (cartesian - minified) v1.0.0")  # another version: stale
    assert plotly_js.publish(tmp_path) == plotly_js.FULL
    full = tmp_path / plotly_js.FULL
    assert full.stat().st_size > 1_000_000 and plotly_js.version_of(full) == want  # the package's own, copied
    assert not list(tmp_path.glob("*.part"))


def test_fetching_without_npm_says_so_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(plotly_js.shutil, "which", lambda name: None)
    with pytest.raises(RuntimeError, match="npm is not installed"):
        plotly_js.fetch(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_fetching_refuses_a_package_of_another_version(tmp_path, monkeypatch):
    def fake_pack(cmd, cwd, **kw):  # what `npm pack` leaves: a tarball whose bundle says another version
        import tarfile
        js = tmp_path / "src" / "package" / plotly_js.CARTESIAN
        js.parent.mkdir(parents=True)
        _bundle(js, "plotly.js (cartesian - minified) v0.0.1")
        with tarfile.open(f"{cwd}/p.tgz", "w:gz") as tar:
            tar.add(js, arcname=f"package/{plotly_js.CARTESIAN}")
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(plotly_js.shutil, "which", lambda name: "/usr/bin/npm")
    monkeypatch.setattr(plotly_js.subprocess, "run", fake_pack)
    dest = tmp_path / "static"
    with pytest.raises(RuntimeError, match="holds plotly.js 0.0.1"):
        plotly_js.fetch(dest)
    assert not dest.exists()


def test_the_payload_carries_the_figure_with_the_template_and_what_the_browser_needs():
    fig = go.Figure(dict(data=[dict(type="scatter", x=np.arange(3.0), y=np.arange(3.0), name="a")],
                         layout=dict(height=300, title=dict(text="t"))), _validate=False)
    spec = json.loads(chart.payload(fig, click=True))
    assert spec["click"] is True and spec["plotly"].endswith(f"?v={plotly_js.wanted()}")
    assert spec["plotly"].split("?")[0].rsplit("/", 1)[1] in (plotly_js.CARTESIAN, plotly_js.FULL)
    assert spec["config"]["displaylogo"] is False
    layout = spec["figure"]["layout"]
    assert layout["template"] == json.loads(json.dumps(CHART_TEMPLATE))  # ours, not plotly's default
    assert layout["height"] == 300 and layout["title"]["text"] == "t"
    go.Figure(spec["figure"])  # valid plotly
    # a figure is serialized once while it lives: the same object gives the same text without re-serializing
    assert chart.figure_json(fig) is chart.figure_json(fig)
