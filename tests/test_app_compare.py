"""The Compare page through AppTest: presets of three frameworks side by side on Explore's batch, each column with
its own framework's knobs and exported config; the disagreement tables count, for each ordered pair, the tokens
one keeps and the other drops (checked against the corrections' own kept masks); a knob move reaches its column's
config and the tables; the picker lists every preset grouped by framework, then the registry's estimators."""

import re

import pytest
import torch

from seqis import ESTIMATORS, PRESETS, run_many
from seqis.diagnosis.summaries import effectively_kept  # noqa: E402
from seqis.presets import FRAMEWORKS
from seqis.samplers.scenarios import make_batch

pytest.importorskip("streamlit")
from pages import SMALL, bound_to_url, open_view  # noqa: E402

KEYS = ["verl/decoupled_token_is", "trl/sequence_mask", "prime-rl/default"]


def compare(**params):
    return open_view("views/compare.py", timeout=120, **{**SMALL, **params})


def count(cell: str) -> int:
    """'11,417 (5.9%)' -> 11417."""
    return int(re.match(r"([\d,]+)", cell).group(1).replace(",", ""))


def kept_masks(pairs, **batch):
    b = make_batch("gaussian", n_rollouts=64, max_len=256, seed=0, **batch)
    out = run_many(pairs, b)
    # "kept" is what keeps a gradient: the rules' kept tokens less those of negligible weight (effectively_kept)
    return {k: effectively_kept(o)[b.loss_mask.bool()] for k, o in out.items()}, b


def test_three_frameworks_presets_side_by_side():
    at = compare(**{"cmp.picks": ",".join(KEYS), "ex.sc.gaussian.s": "0.3"})
    assert not at.error
    # each column: its framework's own knob names, and its config in its framework's language
    assert at.select_slider(key="cmp.trl/sequence_mask.vllm_importance_sampling_clip_max").value == 3.0
    assert at.selectbox(key="cmp.verl/decoupled_token_is.rollout_is").value == "token"
    assert at.select_slider(key="cmp.prime-rl/default.eps").value == 0.3  # IPO: |pi_t - mu_t| <= eps
    codes = [c.value for c in at.code]
    assert any("rollout_correction:" in c and "verl/decoupled_token_is" in c for c in codes)
    assert any("GRPOConfig(" in c for c in codes) and any("[trainer.loss]" in c for c in codes)
    # the tokens the row keeps and the column drops, against the corrections' own masks
    kept, _ = kept_masks(KEYS, s=0.3)
    tokens = at.table[0].value
    for a in KEYS:
        for b in KEYS:
            if a != b:
                assert count(tokens.loc[a, b]) == int((kept[a] & ~kept[b]).sum()), (a, b)
    assert any(count(tokens.loc[a, b]) > 0 for a in KEYS for b in KEYS if a != b)  # they do disagree here
    # who keeps which tokens: the patterns cover every loss token once
    patterns = at.table[3].value
    assert sum(int(str(v).replace(",", "")) for v in patterns["tokens"]) == int(kept[KEYS[0]].numel())


def test_a_knob_move_reaches_its_config_and_the_disagreement():
    key = "trl/sequence_mask"
    at = compare(**{"cmp.picks": ",".join(KEYS), "ex.sc.gaussian.s": "0.3"})
    before = count(at.table[0].value.loc["verl/decoupled_token_is", key])
    at.select_slider(key=f"cmp.{key}.vllm_importance_sampling_clip_max").set_value(1.5).run()
    assert not at.exception and not at.error
    assert any("vllm_importance_sampling_clip_max=1.5," in c.value for c in at.code)
    cfg = PRESETS[key].config.replace(vllm_importance_sampling_clip_max=1.5)
    kept, _ = kept_masks([KEYS[0], (key, cfg)], s=0.3)
    after = count(at.table[0].value.loc["verl/decoupled_token_is", key])
    assert after == int((kept[KEYS[0]] & ~kept[key]).sum()) and after > before  # a tighter C_max drops more
    slider = at.select_slider(key=f"cmp.{key}.vllm_importance_sampling_clip_max")
    assert slider.value == 1.5 and bound_to_url(slider)  # the URL follows


def test_the_picker_groups_presets_by_framework_then_the_estimators():
    at = compare()
    picker = at.multiselect(key="cmp.picks")
    assert picker.value == [*KEYS, "verl/bypass_pg_sc"]  # three frameworks' defaults, and SC: the batch has a head
    frameworks = [k.split(" · ")[0] for k in picker.options]
    order = [f for f in FRAMEWORKS if f in frameworks] + ["seqis"]
    assert list(dict.fromkeys(frameworks)) == order  # grouped, in Learn's order, estimators last
    assert len(picker.options) == len(PRESETS) + len(ESTIMATORS)


def test_one_correction_draws_its_column_and_no_disagreement():
    at = compare(**{"cmp.picks": "seq_tis"})
    assert not at.error and "Where they disagree on this batch" not in [s.value for s in at.subheader]
    assert at.select_slider(key="cmp.seq_tis.seq_clip").value == 2.0


def test_a_registry_estimator_beside_a_preset():
    at = compare(**{"cmp.picks": "seq_tis,verl/bypass_pg_is"})
    assert not at.error
    kept, b = kept_masks(["seq_tis", "verl/bypass_pg_is"])
    assert count(at.table[0].value.loc["seq_tis", "verl/bypass_pg_is"]) == int(
        (kept["seq_tis"] & ~kept["verl/bypass_pg_is"]).sum())
    assert torch.equal(kept["seq_tis"], kept["verl/bypass_pg_is"])  # both seq TIS at 2: they agree everywhere


def test_a_columns_export_is_seqis_exports_own_config_read_back():
    """Compare and seqis.export share the exporter (issue 43): SkyRL's CISPO on the rollout is exported as its own
    policy_loss_type cispo, not as token TIS at 5 (the composition's reading, the same first gradient), and verl's
    decoupled preset stays decoupled; the page's code is seqis.export's text."""
    import yaml

    from seqis.export import export

    keys = ["skyrl/cispo_rollout", "verl/decoupled_token_is"]
    at = compare(**{"cmp.picks": ",".join(keys)})
    assert not at.error
    codes = {c.value.splitlines()[0].split(":")[0].removeprefix("# seqis "): c.value for c in at.code
             if c.value.startswith("# seqis ")}
    for key in keys:
        want = export(key, PRESETS[key].export_framework).text
        assert codes[key] == want.rstrip("\n"), key  # st.code drops the last newline
    skyrl = yaml.safe_load(codes["skyrl/cispo_rollout"])["trainer"]["algorithm"]
    assert skyrl["policy_loss_type"] == "cispo" and skyrl["off_policy_correction"]["tis_ratio_type"] is None
    verl = yaml.safe_load(codes["verl/decoupled_token_is"])["algorithm"]["rollout_correction"]
    assert verl["bypass_mode"] is False


def test_a_head_correction_is_a_column_beside_the_others_on_a_batch_with_a_head():
    """Score centering as a column (its rollout map, knobs, config and its own numbers), its metrics in the side by
    side table beside the others' (blank for those that do not report them)."""
    at = compare(**{"cmp.picks": "verl/decoupled_token_is,verl/bypass_pg_sc"})
    assert not at.error and not at.warning
    assert any("score centering: sc_correction" in m.value for m in at.markdown)
    metrics = next(t.value for t in at.table if "sc_correction" in t.value.index)
    assert list(metrics.columns) == ["verl/decoupled_token_is", "verl/bypass_pg_sc"]
    assert "Where they disagree on this batch" in [s.value for s in at.subheader]


def test_a_head_correction_on_a_batch_without_a_head_is_named_and_skipped():
    at = compare(**{"cmp.picks": "verl/decoupled_token_is,verl/bypass_pg_sc,trl/sequence_mask",
                    "ex.sc.gaussian.head_k": "0"})
    assert not at.exception and not at.error
    assert any("Not run (this batch has no topk_ids" in w.value and "verl/bypass_pg_sc" in w.value
               for w in at.warning)
    assert any("has no sampler head" in i.value and "`verl/bypass_pg_sc`" in i.value for i in at.info)
    assert "Where they disagree on this batch" in [s.value for s in at.subheader]  # the other two still compared
