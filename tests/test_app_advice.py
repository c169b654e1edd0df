"""Explore's advice (issue 43 item 3): it compares the registry, the relevant presets and the shown columns, says so
(the page prints Advice.scope under its suggestion), and lists the shown columns' readings and the suggestion's."""

from app.ui import explore_data as data
from seqis import ESTIMATORS, SEED_ESTIMATORS
from seqis.diagnosis.advice import head_carried, relevant_presets
from seqis.samplers.scenarios import SCENARIOS


def test_explores_advice_says_what_it_compared_beyond_the_shown_columns():
    src = data.Source("synthetic", "gaussian", SCENARIOS["gaussian"](n_rollouts=32, max_len=128, s=0.04), 0)
    tight = ESTIMATORS["mis_po"].config(geo_mask_low=0.99)  # a shown column at knobs the default lacks
    view = data.explore(src, tuple((n, ESTIMATORS[n].config()) for n in SEED_ESTIMATORS[:3]) + (("mis_po", tight),))
    a = view.advice()
    n_pre = len(relevant_presets(head_carried(data.load_batch(src))))  # a synthetic batch carries a head: SC too
    assert a.scope.startswith(f"compared the {len(ESTIMATORS)} registry estimators and {n_pre} presets")
    assert "the 1 shown with their knobs" in a.scope
    assert set(ESTIMATORS) <= set(a.compared) and len(a.compared) > len(ESTIMATORS) + n_pre
    listed = [(r.name, r.knobs) for r in a.readings if not r.fitted]
    assert ("mis_po", dict(tight.as_dict())) in listed
    assert ("seq_tis", dict(ESTIMATORS["seq_tis"].config().as_dict())) in listed
    assert any((r.name, r.knobs) == (a.suggestion, a.knobs) for r in a.readings)



def test_an_upload_over_the_limit_is_refused_in_words_naming_the_command_line(monkeypatch):
    # issue 43: a file over 200 MB showed a small "!" with the reason in a tooltip. Streamlit now takes it
    # (maxUploadSize, below) and the page refuses it in words; the limit is lowered here to spare 200 MB of memory
    import sys

    from pages import APP
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(APP, default_timeout=90)
    at.query_params["ex.source"] = "upload"
    at.run()
    assert any("Up to 200 MB here" in c.value and "--max-bytes" in c.value for c in at.caption)
    monkeypatch.setattr(sys.modules["ui.batch_source"], "MAX_BYTES", 1000)
    at.file_uploader[0].upload("big.parquet", b"\0" * 1500).run()
    assert not at.exception
    (err,) = [e.value for e in at.error if "big.parquet" in e.value]
    assert "big.parquet is 1.465 KB, over the 1000 bytes a batch may have in this explorer" in err
    assert "python -m seqis diagnose big.parquet --max-bytes 2MB" in err


def test_the_column_mapping_offers_every_role_the_loader_knows():
    from app.ui.batch_source import ROLES
    from seqis.io.columns import ALIASES

    assert "sample_mask" in ROLES and set(ROLES) == set(ALIASES)


def test_streamlit_takes_files_over_the_batch_limit_so_the_page_can_say_why():
    from pathlib import Path

    import tomllib

    from seqis.io.columns import MAX_BYTES

    cfg = tomllib.loads((Path(__file__).parents[1] / ".streamlit" / "config.toml").read_text())
    assert cfg["server"]["maxUploadSize"] * 2**20 > MAX_BYTES
