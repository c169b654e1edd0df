"""Explore's "my framework" picker through AppTest: a framework's preset is drawn as a column beside the estimators,
its knobs start at the framework's defaults and move its numbers, its export is in the framework's own language,
and the custom composition's knobs (the mechanism's parts) build a correction or say what is wrong with it."""

from pathlib import Path

import pytest

from seqis import PRESETS, run_many
from seqis.presets import FRAMEWORKS
from seqis.samplers.scenarios import make_batch

pytest.importorskip("streamlit")
from pages import open_code  # noqa: E402
from streamlit.testing.v1 import AppTest  # noqa: E402

APP = str(Path(__file__).resolve().parent.parent / "app" / "streamlit_app.py")
SMALL = {"ex.sc.gaussian.n_rollouts": "64", "ex.sc.gaussian.max_len": "256", "ex.est": "seq_tis"}


def explore(**params) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=90)
    for k, v in {**SMALL, **params}.items():
        at.query_params[k] = v
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def metric(at: AppTest, column: str, name: str) -> float:
    return float(str(at.table[0].value.loc[name, column]).replace(",", ""))


def small_batch(**overrides):
    return make_batch("gaussian", n_rollouts=64, max_len=256, seed=0, **overrides)


def test_the_picker_offers_every_framework_and_its_presets():
    at = explore()
    assert at.selectbox(key="ex.fw").options == ["none", *FRAMEWORKS]
    at.selectbox(key="ex.fw").select("trl").run()
    assert not at.exception
    assert at.selectbox(key="ex.fw.trl").options == [k.split("/", 1)[1] for k in PRESETS if k.startswith("trl/")]


def test_a_picked_preset_is_a_column_with_the_frameworks_numbers_and_knobs():
    key = "verl/bypass_pg_geo_rs_token_tis"
    at = explore(**{"ex.fw": "verl", "ex.fw.verl": key})
    assert not at.error
    assert list(at.table[0].value.columns) == [key, "seq_tis"]
    want = run_many([key], small_batch())[key].scalars()
    assert metric(at, key, "is_masked") == pytest.approx(want["is_masked"], rel=1e-3, abs=1e-6)
    assert at.selectbox(key=f"ex.{key}.rollout_is").value == "token"  # verl's own knob names and defaults
    assert at.selectbox(key=f"ex.{key}.rollout_rs").value == "seq_mean_k1"
    assert any(PRESETS[key].source in c.value for c in at.caption)
    assert any(m.value.startswith(f"**{key}** · {PRESETS[key].summary[:40]}") for m in at.markdown)
    yaml = [c.value for c in open_code(at).code if "rollout_correction:" in c.value and key in c.value]
    assert yaml and "rollout_rs: seq_mean_k1" in yaml[0]


def test_a_presets_knob_moves_its_numbers():
    key = "trl/sequence_mask"
    at = explore(**{"ex.fw": "trl", "ex.fw.trl": key, "ex.sc.gaussian.s": "0.3"})
    before = metric(at, key, "is_masked")
    at.select_slider(key=f"ex.{key}.vllm_importance_sampling_clip_max").set_value(1.5).run()
    assert not at.exception and not at.error
    assert metric(at, key, "is_masked") > before  # a tighter C_max masks more rollouts
    open_code(at)
    assert any("GRPOConfig(" in c.value and "vllm_importance_sampling_clip_max=1.5" in c.value for c in at.code)


def test_the_custom_composition_builds_a_correction_from_its_parts():
    key = "custom/composition"
    at = explore(**{"ex.fw": "custom", "ex.fw.custom": key, "ex.sc.gaussian.s": "0.3"})
    assert not at.error and key in at.table[0].value.columns
    base = run_many([key], small_batch(s=0.3))[key].scalars()
    assert metric(at, key, "is_masked") == pytest.approx(base["is_masked"], rel=1e-3, abs=1e-6)
    at.selectbox(key=f"ex.{key}.rule2_statistic").select("ratio").run()  # a token band [None, None]: refused
    assert any("Criterion on ratio needs a low or a high edge" in e.value for e in at.error)
    at.select_slider(key=f"ex.{key}.rule2_high").set_value(1.2).run()  # drop tokens with rho > 1.2
    assert not at.error and not at.exception
    cfg = PRESETS[key].config.replace(rule2_statistic="ratio", rule2_high=1.2)
    want = run_many([(key, cfg)], small_batch(s=0.3))[key].scalars()
    assert metric(at, key, "is_masked") == pytest.approx(want["is_masked"], rel=1e-3, abs=1e-6)
    assert want["is_masked"] > base["is_masked"]
    # its exports: every trainer is offered (the list stays put while the parts move); one that cannot run a
    # geometric gate with truncated, banded token weights says so
    assert {"verl", "trl"} <= set(at.selectbox(key="ex.export.fw").options)
    at.selectbox(key="ex.export.fw").select("trl").run()
    open_code(at)
    assert any(c.value.startswith(f"# seqis {key}") and "cannot express in trl" in c.value for c in at.code)
    at.selectbox(key="ex.export.fw").select("verl").run()
    open_code(at)
    assert any(c.value.startswith(f"# seqis {key}") and "rollout_correction:" in c.value for c in at.code)


def test_a_string_choice_off_by_default_survives_the_link():
    """verl/decoupled_token_is has rollout_rs None by default; a link that sets it keeps it (not parsed as a
    number and dropped)."""
    key = "verl/decoupled_token_is"
    at = explore(**{"ex.fw": "verl", "ex.fw.verl": key, f"ex.{key}.rollout_rs": "seq_mean_k3",
                    f"ex.{key}.rollout_rs_threshold": "0.01"})
    assert not at.error
    assert at.selectbox(key=f"ex.{key}.rollout_rs").value == "seq_mean_k3"


def test_a_preset_beside_the_four_seed_estimators_starts_a_second_row():
    at = explore(**{"ex.est": "seq_tis,seq_mis,geo_mask,mis_po", "ex.fw": "slime", "ex.fw.slime": "slime/mis"})
    assert not at.error
    assert list(at.table[0].value.columns) == ["slime/mis", "seq_tis", "seq_mis", "geo_mask", "mis_po"]


def test_the_rollout_map_draws_bands_read_from_the_composition():
    import math
    import sys

    sys.path.insert(0, str(Path(APP).parent))
    from ui.explore_charts import bands_of

    from seqis.registry import resolve

    assert ("curve", "w = exp(S) clip high = 2", math.log(2.0)) in bands_of(resolve("seq_tis"))
    geo = [(k, v) for k, _, v in bands_of(resolve("geo_mask"))]
    assert geo == [("hline", math.log(0.5)), ("hline", math.log(2.0))]
    # verl's geo RS '0.999_1.001' is a band on -S/T: the lines sit at -log 1.001 and -log 0.999
    verl = [v for k, _, v in bands_of(resolve("verl/decoupled_geo_rs")) if k == "hline"]
    assert verl == pytest.approx([-math.log(1.001), -math.log(0.999)])
    assert [k for k, _, _ in bands_of(resolve("mis_po"))] == ["note", "hline", "hline"]  # the token band: a note
    assert all(k == "note" for k, _, _ in bands_of(resolve("prime-rl/default")))  # sign-conditioned, per token
