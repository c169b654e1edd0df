"""Explore's advice (issue 43 item 3): it compares the registry, the relevant presets and the shown columns, says so
(the page prints Advice.scope under its suggestion), and lists the shown columns' readings and the suggestion's."""

from app.ui import explore_data as data
from seqis import ESTIMATORS, SEED_ESTIMATORS
from seqis.diagnosis.advice import relevant_presets
from seqis.samplers.scenarios import SCENARIOS


def test_explores_advice_says_what_it_compared_beyond_the_shown_columns():
    src = data.Source("synthetic", "gaussian", SCENARIOS["gaussian"](n_rollouts=32, max_len=128, s=0.04), 0)
    tight = ESTIMATORS["mis_po"].config(geo_mask_low=0.99)  # a shown column at knobs the default lacks
    view = data.explore(src, tuple((n, ESTIMATORS[n].config()) for n in SEED_ESTIMATORS[:3]) + (("mis_po", tight),))
    a = view.advice()
    n_pre = len(relevant_presets(False))
    assert a.scope.startswith(f"compared the {len(ESTIMATORS)} registry estimators and {n_pre} presets")
    assert "the 1 shown with their knobs" in a.scope
    assert set(ESTIMATORS) <= set(a.compared) and len(a.compared) > len(ESTIMATORS) + n_pre
    listed = [(r.name, r.knobs) for r in a.readings if not r.fitted]
    assert ("mis_po", dict(tight.as_dict())) in listed
    assert ("seq_tis", dict(ESTIMATORS["seq_tis"].config().as_dict())) in listed
    assert any((r.name, r.knobs) == (a.suggestion, a.knobs) for r in a.readings)

