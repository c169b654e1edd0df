"""The Learn page through AppTest: one card per registry row with its formula, trades, reduction, source
and defaults; a preset opens the page where its point lives with its setting (widgets and URL), and that page
says what to look at on arrival."""


import pytest

pytest.importorskip("streamlit")
from pages import APP, open_view  # noqa: E402
from streamlit.testing.v1 import AppTest  # noqa: E402

from seqis import ESTIMATORS  # noqa: E402


def learn() -> AppTest:
    return open_view("views/learn.py", timeout=90)


def test_one_card_per_estimator():
    at = learn()
    assert at.title[0].value.startswith("Learn")
    latex = [e.value for e in at.latex]
    assert len(latex) == len(ESTIMATORS)
    for spec in ESTIMATORS.values():
        assert any(spec.formula in x for x in latex)
        text = " ".join(m.value for m in at.markdown)
        assert f"`{spec.name}`" in text and spec.summary in text
    text = " ".join(m.value for m in at.markdown)
    for heading in ("**Trades.**", "**Reduces to.**", "**Source.**"):
        assert text.count(heading) >= 4  # the seed estimators' docstrings have all three
    # the defaults tables list each knob with its default and help text
    assert "| `seq_clip` | 2 | C: the sequence weight" in text
    assert "| `token_clip` | off |" in text and "| `geo_clip` | ∞ |" in text


def test_a_preset_opens_explore_with_its_setting():
    at = learn()
    button = next(b for b in at.button if b.label == "Older prime-rl C = 10")
    button.click().run()
    assert not at.exception
    assert at.title[0].value.startswith("Explore")
    assert at.multiselect(key="ex.est").value == ["seq_tis", "seq_is"]
    assert at.select_slider(key="ex.seq_tis.seq_clip").value == 10.0
    # in the URL, in Streamlit's form for a bound widget: the knob slider's shown value, a list repeated
    assert at.query_params["ex.seq_tis.seq_clip"] == "10"
    assert at.query_params["ex.est"] == ["seq_tis", "seq_is"]


def test_a_scenario_preset_sets_the_batch_and_resets_other_knobs():
    at = AppTest.from_file(APP, default_timeout=90)
    at.query_params["ex.mis_po.geo_mask_low"] = "0.9"  # a leftover of an earlier view
    at.query_params["ex.sc.gaussian.max_len"] = "256"
    at.run()
    at.switch_page("views/learn.py").run()
    next(b for b in at.button if b.label == "IcePop on catastrophes").click().run()
    assert not at.exception
    assert at.multiselect(key="ex.est").value == ["icepop", "mis_po"]
    assert at.select_slider(key="ex.mis_po.geo_mask_low").value == 0.996  # back to the preset's default
    assert any(i.value.startswith("**IcePop on catastrophes.**") for i in at.info)  # the caption on arrival


def test_catastrophic_preset_opens_length_and_thresholds_where_the_fact_lives():
    at = learn()
    next(b for b in at.button if b.label == "Catastrophic tokens").click().run()
    assert not at.exception
    assert at.title[0].value == "Length & thresholds"
    assert at.select_slider(key="lt.L").value == 10
    info = [i.value for i in at.info]
    assert any(i.startswith("**Catastrophic tokens.**") and "Catastrophic-token dilution" in i for i in info), info
    at.run()  # the caption shows once, on arrival
    assert not any(i.value.startswith("**Catastrophic tokens.**") for i in at.info)


def test_the_best_clip_preset_opens_bias_and_variance_on_its_toy():
    at = learn()
    next(b for b in at.button if b.label == "The best clip").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.title[0].value == "Bias & variance"
    assert at.select_slider(key="bv.H").value == 16 and at.select_slider(key="bv.q").value == 0.45
    assert at.selectbox(key="bv.sweep").value == "seq_tis · seq_clip"
    text = " ".join(c.value for c in at.caption)
    assert "Li's C* = √(2(1+χ²)) = **1.94** with χ² = E_μ[w²] − 1 = 0.885, the whole rollout's" in text
    assert any(i.value.startswith("**The best clip.**") for i in at.info)


def test_every_preset_names_a_page_and_keys_of_that_page():
    from ui.presets import PAGES, PRESETS

    for name, presets in PRESETS.items():
        for p in presets:
            assert p.page in PAGES and p.help, (name, p.label)
            assert all(k.startswith(p.page + ".") for k in p.view), (name, p.label, list(p.view))
    pages = {p.page for ps in PRESETS.values() for p in ps}
    assert pages == {"ex", "lt", "bv", "tr"}  # every fact's page has at least one preset


def test_presets_are_listed_by_framework_with_when_they_shipped_their_source_and_quirks():
    from seqis.presets import FRAMEWORKS, PRESETS

    at = learn()
    titles = [e.proto.label for e in at.expander]
    for framework in FRAMEWORKS:
        assert any(t.startswith(f"**{framework}**") for t in titles), framework
    tables = " ".join(m.value for m in at.markdown)
    for p in PRESETS.values():
        assert f"`{p.name}`" in tables and p.source in tables and p.versions.replace("|", "/") in tables
    assert "ZeroDivisionError" in tables  # verl's IcePop quirk, named in its row
    assert any("rollout_corr_helper.py" in c.value for c in at.code)  # verl's module docstring: the formulas


def test_a_frameworks_preset_opens_explore_beside_the_estimators():
    at = AppTest.from_file(APP, default_timeout=90)
    at.query_params["ex.sc.gaussian.max_len"] = "256"
    at.query_params["ex.est"] = "seq_tis"
    at.run()
    at.switch_page("views/learn.py").run()
    at.selectbox(key="learn.fw.nemo-rl").select("nemo-rl/seq-mask-tis").run()
    next(b for b in at.button if b.key == "learn.fw.nemo-rl.open").click().run()
    assert not at.exception and not at.error
    assert at.title[0].value.startswith("Explore")
    assert at.selectbox(key="ex.fw").value == "nemo-rl"
    assert at.selectbox(key="ex.fw.nemo-rl").value == "nemo-rl/seq-mask-tis"
    assert list(at.table[0].value.columns) == ["nemo-rl/seq-mask-tis", "seq_tis"]  # the estimators stay
