"""The Explore page through Streamlit's AppTest: it renders, its widgets move the numbers they should, a
link's query parameters restore a view, uploads load (a bad one shows the loader's message and keeps the
previous batch), bad knob combinations show an error naming the knob, and the exports are there.

Most tests use a small batch (64 rollouts up to 256 tokens, set through the URL) to stay quick; one
renders the untouched first screen.
"""

import json
import sys
from pathlib import Path

import pytest
import torch
from pages import bound_to_url, charts, open_code  # noqa: E402

from seqis import ESTIMATORS, SEED_ESTIMATORS, run_many
from seqis.core.ratios import Ratios
from seqis.diagnosis.summaries import dropped_map, effective_batch, token_map, weight_histogram
from seqis.io import save_batch
from seqis.samplers.scenarios import make_batch

APP = str(Path(__file__).resolve().parent.parent / "app" / "streamlit_app.py")
SMALL = {"ex.sc.gaussian.n_rollouts": "64", "ex.sc.gaussian.max_len": "256"}


def _apptest():
    pytest.importorskip("streamlit")
    from streamlit.testing.v1 import AppTest

    return AppTest


def explore(**params):
    at = _apptest().from_file(APP, default_timeout=90)
    for k, v in {**SMALL, **params}.items():
        at.query_params[k] = v
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def metric(at, estimator: str, name: str) -> float:
    """A value of the metrics table (estimators as columns)."""
    return float(str(at.table[0].value.loc[name, estimator]).replace(",", ""))


def effective(at, estimator: str, name: str) -> float:
    """A value of the effective-batch table, by its summaries.effective_batch name (the page's row says it in
    words: EFFECTIVE)."""
    from ui.explore_data import EFFECTIVE

    return float(str(at.table[1].value.loc[EFFECTIVE[name], estimator]).replace(",", ""))


def test_first_screen_tells_the_story():
    at = _apptest().from_file(APP, default_timeout=120)
    at.run()
    assert not at.exception
    assert not at.error
    assert at.title[0].value.startswith("Explore")
    assert at.multiselect(key="ex.est").value == list(SEED_ESTIMATORS)
    assert any("What to look at" in c.value for c in at.caption)
    assert "256 rollouts x 4096 positions" in " ".join(c.value for c in at.sidebar.caption)
    assert "Device:" in " ".join(c.value for c in at.sidebar.caption)
    assert len(charts(at)) == 4 + 3  # a rollout map per estimator; heatmap, coefficients, weights and effective batch
    # the story: seq_tis clips long rollouts, mis_po's narrow trajectory band drops short ones, Li's band keeps all
    assert metric(at, "seq_tis", "is_clipped") > 0.05
    assert effective(at, "mis_po", "rollouts_kept_frac") < 0.9
    assert effective(at, "geo_mask", "rollouts_kept_frac") == 1.0


def test_moving_a_slider_changes_the_metrics_it_should():
    at = explore()
    clipped = metric(at, "seq_tis", "is_clipped")
    kept = effective(at, "mis_po", "rollouts_kept_frac")
    at.select_slider(key="ex.seq_tis.seq_clip").set_value(1.2).run()
    assert not at.exception
    assert metric(at, "seq_tis", "is_clipped") > clipped  # a lower clip truncates more rollouts
    assert effective(at, "mis_po", "rollouts_kept_frac") == kept  # another estimator's numbers stay
    at.select_slider(key="ex.mis_po.geo_mask_high").set_value(1.1).run()
    at.select_slider(key="ex.mis_po.geo_mask_low").set_value(0.9).run()
    assert effective(at, "mis_po", "rollouts_kept_frac") > kept  # a wider trajectory band keeps more
    for key, value in (("ex.seq_tis.seq_clip", 1.2), ("ex.mis_po.geo_mask_low", 0.9)):  # the URL follows (bound)
        slider = at.select_slider(key=key)
        assert slider.value == value and at.session_state[key] == value and bound_to_url(slider), key


def test_query_params_restore_a_view():
    at = explore(**{
        "ex.est": "seq_tis,token_tis", "ex.seq_tis.seq_clip": "5.0", "ex.token_tis.token_clip": "inf",
        "ex.scenario": "catastrophic", "ex.sc.catastrophic.n_rollouts": "32", "ex.sc.catastrophic.max_len": "128",
        "ex.seed": "7", "ex.rollout": "3", "ex.drops": "token_tis",
    })
    assert at.multiselect(key="ex.est").value == ["seq_tis", "token_tis"]
    assert at.select_slider(key="ex.seq_tis.seq_clip").value == 5.0
    assert at.select_slider(key="ex.token_tis.token_clip").value == float("inf")
    assert at.sidebar.selectbox(key="ex.scenario").value == "catastrophic"
    assert at.sidebar.number_input(key="ex.seed").value == 7
    assert at.number_input(key="ex.rollout").value == 3
    assert "synthetic catastrophic (seed 7): **32 rollouts" in " ".join(c.value for c in at.sidebar.caption)
    assert list(at.table[0].value.columns) == ["seq_tis", "token_tis"]


def test_a_link_in_streamlits_form_restores_a_view():
    """The form Streamlit's binding writes (a knob slider's shown value, a list repeated, a choice by its label)."""
    at = explore(**{"ex.est": ["seq_tis", "token_tis"], "ex.seq_tis.seq_clip": "5", "ex.token_tis.token_clip": "∞",
                    "ex.source": "Synthetic scenario", "ex.scenario": "catastrophic",
                    "ex.sc.catastrophic.n_rollouts": "32", "ex.sc.catastrophic.max_len": "128"})
    assert at.multiselect(key="ex.est").value == ["seq_tis", "token_tis"]
    assert at.select_slider(key="ex.seq_tis.seq_clip").value == 5.0
    assert at.select_slider(key="ex.token_tis.token_clip").value == float("inf")
    assert at.sidebar.selectbox(key="ex.scenario").value == "catastrophic"
    assert at.query_params["ex.seq_tis.seq_clip"] == "5"  # a value already in the binding's form stays as it is


def test_bad_query_values_fall_back_to_defaults():
    at = explore(**{"ex.est": "nope", "ex.seq_tis.seq_clip": "abc", "ex.scenario": "nope", "ex.rollout": "99999"})
    assert at.multiselect(key="ex.est").value == list(SEED_ESTIMATORS)
    assert at.select_slider(key="ex.seq_tis.seq_clip").value == 2.0
    assert at.sidebar.selectbox(key="ex.scenario").value == "gaussian"
    assert at.number_input(key="ex.rollout").value < 64


def test_a_value_off_the_slider_grid_is_kept():
    at = explore(**{"ex.seq_tis.seq_clip": "2.718"})
    assert at.select_slider(key="ex.seq_tis.seq_clip").value == 2.718


def test_a_bad_knob_combination_names_the_knob():
    at = explore(**{"ex.est": "seq_mis,seq_tis"})
    at.select_slider(key="ex.seq_mis.geo_mask_low").set_value(1.0).run()
    at.select_slider(key="ex.seq_mis.geo_mask_high").set_value(1.0).run()
    assert not at.exception
    assert any("geo_mask_low must be below geo_mask_high" in e.value for e in at.error)
    assert list(at.table[0].value.columns) == ["seq_tis"]  # the others still draw


def test_upload_loads_and_a_bad_one_keeps_the_previous_batch(tmp_path):
    path = tmp_path / "tiny.npz"
    save_batch(make_batch("gaussian", n_rollouts=24, max_len=48, seed=3), path)
    at = explore(**{"ex.source": "upload"})
    at.file_uploader[0].upload("tiny.npz", path.read_bytes()).run()
    assert not at.exception and not at.error
    assert at.title[0].value == "Diagnose"  # a new upload opens on Diagnose first
    assert any("upload tiny.npz" in s.value and "opens here first" in s.value for s in at.success)
    next(b for b in at.button if b.key == "dg.open.explore").click().run()  # the link carries it to Explore
    assert not at.exception and at.title[0].value.startswith("Explore")
    captions = " ".join(c.value for c in at.sidebar.caption)
    assert "upload tiny.npz: **24 rollouts" in captions
    shown = " ".join(c.value for c in at.caption)  # right after the upload: not "opened earlier in this session"
    assert "Showing your upload **tiny.npz**" in shown and "earlier" not in shown
    assert any("cannot carry an uploaded file" in c.value for c in at.sidebar.caption)  # a link loses the file
    assert list(at.table[0].value.columns) == list(SEED_ESTIMATORS)
    at.run()
    assert at.title[0].value.startswith("Explore")  # seen once: it stays on Explore now

    at.file_uploader[0].upload("broken.parquet", b"this is not parquet").run()
    assert not at.exception
    assert any("broken.parquet" in e.value and "parquet" in e.value for e in at.error)
    assert not any("Column mapping" in e.value for e in at.error)  # not a column problem: no mapping hint
    captions = " ".join(c.value for c in at.caption)
    assert "Showing the previous batch: upload tiny.npz" in captions


def test_upload_bridge_takes_bytes_with_a_name(tmp_path):
    _apptest()
    sys.path.insert(0, str(Path(APP).parent))
    from ui import explore_data as data

    path = tmp_path / "b.npz"
    save_batch(make_batch("gaussian", n_rollouts=8, max_len=16, seed=1), path)
    raw = path.read_bytes()
    src = data.source_of_file(raw, "b.npz")
    assert src.kind == "upload" and src.digest == data.digest(raw)
    batch = data.load_batch(src, _payload=raw)
    assert batch.shape[0] == 8 and not batch.trainer_logprobs.requires_grad
    with pytest.raises(ValueError):
        data.source_of_file(b"{]", "bad.json")


def test_an_estimator_views_token_arrays_are_its_weights_and_kept_mask_on_the_loss_tokens(tmp_path):
    # the view reads the loss tokens through one per-batch index (x.reshape(-1)[positions]); the definition is
    # x[mask], row-major: the same values in the same order, on a ragged batch whose padding sits mid-tensor
    _apptest()
    sys.path.insert(0, str(Path(APP).parent))
    from ui import explore_data as data

    path = tmp_path / "b.npz"
    batch = make_batch("catastrophic", n_rollouts=24, max_len=64, seed=3)
    save_batch(batch, path)
    raw = path.read_bytes()
    src = data.source_of_file(raw, "b.npz")
    b = data.load_batch(src, _payload=raw)
    for name in ("seq_tis", "token_tis", "mis_po"):
        c = data.shown(name, ESTIMATORS[name].config())
        v = data.estimator_view(src, c, _payload=raw)
        out = run_many([c.composition], b)[c.composition]
        assert (~b.loss_mask).any() and v.coefficients.shape == (int(b.loss_mask.sum()),)
        assert (v.coefficients == out.weights[b.loss_mask].float().numpy()).all(), name
        assert (v.kept == out.masks["kept"][b.loss_mask].numpy()).all(), name
        h = weight_histogram(out)  # from the view's flat arrays: the same counts as from out's own mask
        assert (v.hist["counts"] == h["counts"].numpy()).all() and v.hist["dropped"] == h["dropped"], name
        assert v.hist["underflow"] == h["underflow"], name


def test_exports_and_downloads_are_offered():
    """One export control for the page: the picked estimator in the picked trainer's language, its knobs' current
    values; a download button for it and the CSVs."""
    at = explore(**{"ex.est": "seq_tis,mis_po", "ex.seq_tis.seq_clip": "3.0"})
    assert not [c for c in at.code if "[loss]" in c.value]  # the popover's code is drawn while it is open
    open_code(at)
    assert any("[loss]" in c.value and "sequence_clip_high = 3.0" in c.value for c in at.code)
    labels = [b.proto.label for b in at.get("download_button")]
    assert "Metrics CSV" in labels and "Rollouts CSV" in labels and "Download seq_tis.prime-rl.toml" in labels
    at.selectbox(key="ex.export").select("mis_po").run()
    at.selectbox(key="ex.export.fw").select("verl").run()
    assert not at.exception
    assert not [c for c in at.code if "rollout_correction:" in c.value]  # a new pick is a new popover, closed
    open_code(at)
    assert [c.value for c in at.code if "rollout_correction:" in c.value and "token_k1,seq_mean_k1" in c.value]
    assert "Download mis_po.verl.yaml" in [b.proto.label for b in at.get("download_button")]
    assert any(b.label == "Render PNGs" for b in at.button)


def test_every_estimator_renders():
    at = explore(**{"ex.est": ",".join(ESTIMATORS)})
    assert list(at.table[0].value.columns) == list(ESTIMATORS)
    assert not at.error
    torch.testing.assert_close(effective(at, "pg", "tokens_kept_frac"), 1.0)


def test_an_example_asset_loads(tmp_path, monkeypatch):
    import seqis.io

    path = tmp_path / "example.npz"
    save_batch(make_batch("gaussian", n_rollouts=16, max_len=32, seed=5), path)
    monkeypatch.setattr(seqis.io, "list_assets", lambda: [path])
    at = explore(**{"ex.source": "asset"})
    assert at.selectbox(key="ex.asset").value == "example.npz"
    assert "asset example.npz: **16 rollouts" in " ".join(c.value for c in at.sidebar.caption)


def _png_renderer_present() -> bool:
    sys.path.insert(0, str(Path(APP).parent))
    from ui.png import browser_path

    try:
        import kaleido  # noqa: F401
    except ImportError:
        return False
    return browser_path() is not None


@pytest.mark.slow  # kaleido drives chromium: make test runs it
def test_figures_render_as_png():
    """With kaleido and a chromium present the zip must come (a rendering failure fails this test); without
    them the page must say why."""
    at = explore(**{"ex.sc.gaussian.n_rollouts": "16", "ex.sc.gaussian.max_len": "32", "ex.est": "seq_tis"})
    next(b for b in at.button if b.label == "Render PNGs").click().run()
    assert not at.exception
    labels = [b.proto.label for b in at.get("download_button")]
    if _png_renderer_present():
        assert "Download 4 PNGs (zip)" in labels, [e.value for e in at.error]
    else:
        assert any("camera icon" in e.value for e in at.error)


@pytest.mark.slow  # kaleido drives chromium: make test runs it
def test_to_png_gives_png_bytes_and_leaves_the_environment_alone(monkeypatch):
    if not _png_renderer_present():
        pytest.skip("kaleido or chromium missing")
    import os

    import plotly.graph_objects as go
    from ui.png import to_png

    monkeypatch.delenv("BROWSER_PATH", raising=False)
    before = dict(os.environ)
    pngs = to_png({"a": go.Figure(go.Scatter(x=[0, 1], y=[1, 0]), layout=dict(height=200))}, width=300, scale=1)
    assert pngs["a"].startswith(b"\x89PNG") and len(pngs["a"]) > 1000
    assert dict(os.environ) == before


def test_to_png_tries_a_fresh_session_once_when_kaleido_fails(monkeypatch, tmp_path):
    # under load kaleido's page was once asked to render before its scripts ran ("kaleido_scopes is not defined"):
    # one fresh session follows; a second failure is the caller's RuntimeError
    pytest.importorskip("kaleido")
    import kaleido
    import plotly.graph_objects as go

    sys.path.insert(0, str(Path(APP).parent))
    from ui.png import to_png

    sessions = []

    class Flaky:
        def __init__(self, **kw):
            sessions.append(kw)

        async def __aenter__(self):
            return self

        async def __aexit__(self, *exc):
            return False

        async def calc_fig(self, fig, opts):
            if len(sessions) < fails + 1:
                raise RuntimeError("ReferenceError: kaleido_scopes is not defined")
            return b"\x89PNG fake"

    monkeypatch.setattr(kaleido, "Kaleido", Flaky)
    browser = tmp_path / "chromium"
    browser.write_text("")
    fails = 1
    assert to_png({"a": go.Figure()}, browser=str(browser)) == {"a": b"\x89PNG fake"} and len(sessions) == 2
    sessions.clear()
    fails = 2
    with pytest.raises(RuntimeError, match="kaleido_scopes"):
        to_png({"a": go.Figure()}, browser=str(browser))
    assert len(sessions) == 2


def test_to_png_raises_when_the_browser_cannot_start():
    sys.path.insert(0, str(Path(APP).parent))
    import plotly.graph_objects as go
    from ui.png import to_png

    with pytest.raises(RuntimeError):
        to_png({"a": go.Figure()}, browser="/nonexistent/chromium")


def test_a_batch_too_large_for_the_device_is_refused():
    at = explore(**{"ex.sc.gaussian.n_rollouts": "2048", "ex.sc.gaussian.max_len": "32768"})
    assert any("positions is more than this device's" in e.value for e in at.sidebar.error)
    assert "Showing the previous batch" in " ".join(c.value for c in at.sidebar.caption)


@pytest.mark.gpu
def test_explore_summaries_match_between_cpu_and_cuda():
    """The summaries the page draws (seqis.diagnosis.summaries) on CUDA equal the CPU's, for every estimator."""
    cpu = make_batch("catastrophic", n_rollouts=300, max_len=2048, seed=11)
    gpu = cpu.to("cuda")
    rc, rg = Ratios.of(cpu), Ratios.of(gpu)
    tc, tg = token_map(rc), token_map(rg)
    torch.testing.assert_close(tg.values.cpu(), tc.values, equal_nan=True)
    assert torch.equal(tg.index.cpu(), tc.index)
    outs_c, outs_g = run_many(list(ESTIMATORS), cpu, ratios=rc), run_many(list(ESTIMATORS), gpu, ratios=rg)
    for name in ESTIMATORS:
        oc, og = outs_c[name], outs_g[name]
        torch.testing.assert_close(dropped_map(og.masks["kept"], rg.mask, tg).cpu(),
                                   dropped_map(oc.masks["kept"], rc.mask, tc), equal_nan=True)
        hc, hg = weight_histogram(oc), weight_histogram(og)
        assert (hg["counts"] - hc["counts"]).abs().sum() <= 0.001 * hc["counts"].sum() + 2, name  # fp edges
        assert hg["dropped"] == hc["dropped"], name
        ec, eg = effective_batch(oc), effective_batch(og)
        assert eg.keys() == ec.keys()
        for k in ec:
            assert eg[k] == pytest.approx(ec[k], rel=1e-4, abs=1e-6), (name, k)


def _renamed_parquet(tmp_path) -> tuple[bytes, int]:
    """A small batch saved with column names the loader does not know."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    b = make_batch("gaussian", n_rollouts=12, max_len=40, seed=2)
    rows = [b.loss_mask[j].nonzero().flatten().tolist() for j in range(12)]
    table = pa.table({
        "policy_lp": [b.trainer_logprobs[j, r].tolist() for j, r in enumerate(rows)],
        "sampler_lp": [b.inference_logprobs[j, r].tolist() for j, r in enumerate(rows)],
        "adv": b.advantages.tolist(),
    })
    path = tmp_path / "odd.parquet"
    pq.write_table(table, path)
    return path.read_bytes(), 12


def test_an_upload_with_other_column_names_is_mapped_in_the_page(tmp_path):
    raw, B = _renamed_parquet(tmp_path)
    at = explore(**{"ex.source": "upload"})
    at.file_uploader[0].upload("odd.parquet", raw).run()
    assert not at.exception
    assert any("no trainer logprobs column" in e.value and "policy_lp" in e.value and "Column mapping" in e.value
               for e in at.error)  # a column problem: the hint says where to fix it
    at.selectbox(key="ex.map.trainer_logprobs").set_value("policy_lp")
    at.selectbox(key="ex.map.inference_logprobs").set_value("sampler_lp")
    at.selectbox(key="ex.map.advantages").set_value("adv").run()
    assert not at.exception and not at.error  # the error is gone once the file loads
    assert at.title[0].value == "Diagnose"  # and the batch opens on Diagnose first
    next(b for b in at.button if b.key == "dg.open.explore").click().run()
    assert not at.exception and not at.error
    assert f"upload odd.parquet: **{B} rollouts" in " ".join(c.value for c in at.sidebar.caption)


def test_a_pickle_is_refused_with_a_message_where_the_user_looks():
    at = explore(**{"ex.source": "upload"})
    at.file_uploader[0].upload("batch.pkl", b"\x80\x04K\x01.").run()
    assert not at.exception
    assert any("batch.pkl" in e.value and "pickle" in e.value and "refused" in e.value for e in at.error)
    at.file_uploader[0].upload("batch.parquet", b"\x80\x04K\x01." * 20).run()  # a pickle renamed: still a pickle
    assert any("batch.parquet: is a Python pickle" in e.value and "Column mapping" not in e.value for e in at.error)


def test_a_shared_link_to_an_upload_asks_for_the_file_again():
    at = explore(**{"ex.source": "upload", "ex.file": "mine.parquet"})
    assert any("mine.parquet" in i.value and "upload the file again" in i.value for i in at.info)


def test_changing_the_batch_resets_the_rollout_pick(tmp_path):
    at = explore()
    at.number_input(key="ex.rollout").set_value(5).run()
    assert at.number_input(key="ex.rollout").value == 5
    at.sidebar.number_input(key="ex.seed").set_value(3).run()  # a new batch
    assert not at.exception
    assert "ex.rollout" not in at.query_params  # back to its default (the new batch's longest rollout)


def test_rollouts_can_be_coloured_by_metadata():
    at = explore()
    options = at.selectbox(key="ex.color").options
    assert "group_id" in options and "reward" in options
    at.selectbox(key="ex.color").set_value("reward").run()
    assert not at.exception
    fig = charts(at)[0]
    assert "reward = %{text}" in json.dumps(fig)
    # a category column gets a key: one legend entry per value, in the colour its points have, and nothing else
    key = {t["name"]: t["marker"]["color"] for t in fig["data"] if t.get("showlegend", True)}
    assert fig["layout"]["showlegend"] and set(key) == {"reward = 0.0", "reward = 1.0"}, key
    points = [t for t in fig["data"] if t.get("mode") == "markers" and t.get("text") is not None]
    shown = {(text, color) for t in points for text, color in zip(t["text"], t["marker"]["color"])}
    assert shown == {(name.split(" = ")[1], color) for name, color in key.items()}


def test_a_figure_as_plain_data_is_the_json_plotly_writes_for_it():
    """The chart builders' figures (explore_charts.Figure: trace and layout dicts) go to the browser as their own
    JSON; plotly's figure objects, the reference, write the same for each of Explore's figures (its default
    template aside: the chart component puts the explorer's in), with every numeric array a typed array."""
    import plotly.io as pio
    from ui import explore_data as data
    from ui.presets import FIRST_ESTIMATORS

    from seqis.samplers.scenarios import SCENARIOS

    src = data.Source("synthetic", "drift", SCENARIOS["drift"](n_rollouts=32, max_len=128), 0)
    view = data.explore(src, tuple((n, data.start(n).config) for n in [*FIRST_ESTIMATORS, "token_tis"]))
    for color_by in (None, "reward", "group_id"):
        for name, fig in view.figures(color_by, "mis_po", 3).items():
            ours = json.loads(pio.to_json(fig.to_plotly_json(), validate=False))
            ref = json.loads(pio.to_json(fig.plotly.to_plotly_json(), validate=False))
            ref["layout"].pop("template")
            assert ours == ref, (name, color_by)
            assert not long_number_lists(ours), name  # numbers go as typed arrays, not JSON lists


def long_number_lists(node) -> list:
    """The lists of 16 or more plain numbers in a spec."""
    if isinstance(node, dict):
        return [x for v in node.values() for x in long_number_lists(v)]
    if isinstance(node, list):
        if len(node) >= 16 and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in node):
            return [node]
        return [x for v in node for x in long_number_lists(v)]
    return []


def test_the_coefficient_lines_draw_every_token_with_fewer_points():
    """A step line through step_points' kept points holds, at every loss token, the value the token has (the
    reference: the value at the last kept point at or before it); a sequence-level weight needs two points."""
    sys.path.insert(0, str(Path(APP).parent))
    from ui.explore_charts import coefficient_plot, step_points

    gen = torch.Generator().manual_seed(0)
    for _ in range(50):
        n = int(torch.randint(1, 60, (1,), generator=gen))
        y = torch.randint(0, 3, (n,), generator=gen).double().numpy()  # runs of equal values
        keep = step_points(y)
        assert keep[0] == 0 and keep[-1] == n - 1
        for t in range(n):
            assert y[keep[keep <= t].max()] == y[t]
    positions = torch.arange(100, 4196).numpy()
    fig = coefficient_plot(positions, positions * 0.0, {"seq_tis": positions * 0.0 + 0.7})
    assert list(fig.data[0].x) == [100, 4195] and list(fig.data[0].y) == [0.7, 0.7]


def test_effective_batch_labels_sit_above_the_theory_diamonds():
    """Each bar's label is drawn at its bar's top, or above the theory's diamond where the diamond reaches above
    that top: no label over a diamond (they collided at 100% and 71% on the first screen)."""
    sys.path.insert(0, str(Path(APP).parent))
    from ui.explore_charts import DIAMOND, effective_bars

    eff = {n: dict(tokens_kept_frac=t, rollouts_kept_frac=r, ess_frac=e)
           for n, (t, r, e) in dict(a=(1.0, 1.0, 0.59), b=(0.85, 0.71, 0.71), c=(0.5, 0.2, 0.1),
                                    d=(0.4, 0.3, 0.3)).items()}
    theory = dict(a=dict(rollouts_kept_frac=1.0), b=dict(rollouts_kept_frac=0.717), c=dict(rollouts_kept_frac=0.6),
                  d=dict(rollouts_kept_frac=0.1))
    fig = effective_bars(eff, theory)
    bars, labels, diamonds = fig.data
    assert [t.type for t in fig.data] == ["bar", "scatter", "scatter"] and labels.mode == "text"
    assert list(labels.text) == [f"{v:.0%}" for v in bars.y]
    at = {(n, k): y for n, k, y in zip(*labels.x, labels.y)}
    for n, k, d in zip(*diamonds.x, diamonds.y):
        bar = eff[n]["rollouts_kept_frac"]
        assert at[n, k] >= bar  # never inside its bar
        assert at[n, k] >= d + DIAMOND or d + DIAMOND <= bar, (n, at[n, k], d)  # clear of the diamond's top
    assert at["d", "rollouts"] == 0.3  # a diamond well inside the bar leaves the label on the bar
    assert at["c", "rollouts"] == 0.6 + DIAMOND and at["a", "rollouts"] == 1.0 + DIAMOND
    assert fig.layout.yaxis.range[1] >= 1.0 + DIAMOND + 0.1  # room for a label above a diamond at 100%


def test_the_mapping_hint_follows_every_column_refusal_and_no_other():
    sys.path.insert(0, str(Path(APP).parent))
    from ui.batch_source import is_about_columns

    from seqis.io import load_batch

    def refusal(data: dict) -> str:
        with pytest.raises(ValueError) as e:
            load_batch(json.dumps(data).encode(), format=".json")
        return str(e.value)

    lp = [[-0.1, -0.2]]
    assert is_about_columns(refusal({"policy_lp": lp}))  # no trainer log-probs column
    assert is_about_columns(refusal({"trainer_logprobs": lp, "inference_logprobs": lp}))  # no advantages
    assert not is_about_columns(refusal({"trainer_logprobs": [[-0.1, float("nan")]], "inference_logprobs": lp,
                                         "advantages": [1.0]}))  # a NaN: the file, not its column names


def test_more_batch_knobs_are_drawn_only_while_their_section_is_open():
    """A closed "More batch knobs" expander sends no widgets (a collapsed expander's sliders still cost the
    browser a render on every run), yet a link's value for one of its knobs makes the batch, is noted in the
    sidebar, and is the widget's value once the section is opened."""
    from ui.state import BATCH_KEY

    at = explore(**{"ex.sc.gaussian.group_size": "4"})
    labels = {s.label for s in at.sidebar.select_slider}
    assert "n_rollouts" in labels and "group_size" not in labels and "min_len" not in labels
    assert any("group_size = 4" in c.value for c in at.sidebar.caption)
    src, _ = at.session_state[BATCH_KEY]
    assert src.config.group_size == 4 and src.config.min_len == 16
    at.session_state["ex.sc.more"] = True
    at.run()
    assert not at.exception
    knobs = {s.label: s for s in at.sidebar.select_slider}
    assert knobs["group_size"].value == 4 and knobs["min_len"].value == 16
    knobs["min_len"].set_value(8).run()
    src, _ = at.session_state[BATCH_KEY]
    assert src.config.min_len == 8 and src.config.group_size == 4
    at.session_state["ex.sc.more"] = False  # closed again: the moved value stays, and is noted
    at.run()
    src, _ = at.session_state[BATCH_KEY]
    assert "min_len" not in {s.label for s in at.sidebar.select_slider} and src.config.min_len == 8
    assert any("min_len = 8" in c.value for c in at.sidebar.caption)
    at.run()  # Streamlit drops a hidden widget's parameter as the run that hides it ends; the next one writes it back
    assert at.query_params["ex.sc.gaussian.min_len"] == "8"
