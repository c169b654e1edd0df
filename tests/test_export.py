"""seqis.export: each framework's settings derived from a composition, and a clear refusal where it has none.

A preset exported to its own framework gives back the knob values it was made from (TRL, NeMo-RL, SkyRL, AReaL,
prime-rl: the same key names), exactly. verl's snippets are also run through verl's own code in
test_presets_verl.py. Compositions the framework cannot express say why.
"""

from __future__ import annotations

import math

import pytest
import yaml

try:
    import tomllib  # Python 3.11+
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

from seqis import ESTIMATORS, PRESETS
from seqis.core.compose import Composition, Criterion, Penalty, Weight
from seqis.export import EXPORTERS, export, export_all, is_own
from seqis.export._format import fmt
from seqis.registry import needs_head

SAME_NAMES = ("trl", "nemo-rl", "skyrl", "areal", "prime-rl")  # frameworks whose config keys the presets mirror


def _settings(key: str):
    comp = PRESETS[key].compose()
    return EXPORTERS[PRESETS[key].export_framework].settings(comp)


def _writes_its_parts(key: str) -> bool:
    """Whether the preset's exporter writes every part it has: a framework's own preset is written knob by knob
    (score centering too, issue 42: tests/test_export_own_framework.py); through a composition, score centering is
    verl's alone so far (vime's presets, written as Miles flags, are refused naming it)."""
    fw = PRESETS[key].export_framework
    return is_own(key, fw) or not needs_head(key) or "centering" in getattr(EXPORTERS[fw], "PARTS", ())


OWN_EXPORT = [k for k in PRESETS if PRESETS[k].export_framework in EXPORTERS]


@pytest.mark.parametrize("key,framework", [(k, fw) for k in PRESETS if needs_head(k) for fw in EXPORTERS
                                           if not is_own(k, fw) and "centering" not in getattr(EXPORTERS[fw], "PARTS",
                                                                                               ())])
def test_a_score_centered_preset_in_an_exporter_without_centering_is_refused_naming_it(key, framework):
    snip = export(key, framework)
    assert not snip.expressible and "centering" in snip.text, snip.text


@pytest.mark.parametrize("key", [k for k in OWN_EXPORT if _writes_its_parts(k)])
def test_a_preset_exports_exactly_to_its_own_framework(key):
    """Exactly, except the seed's ablations in pre-March-2026 prime-rl, which weighed every kept token by rho_t
    (geo_mask, mis_po weigh 1) and capped log w at 10 (seq_mis's weight is untruncated), and vime's presets as Miles
    flags (Miles floors the sampler's tail at 0, vime at 1e-6): a NOTE says so."""
    p = PRESETS[key]
    snip = export(key, p.export_framework)
    assert snip.expressible, snip.text
    assert snip.text.startswith(f"# seqis {key}") and snip.filename.startswith(key.replace("/", "_"))
    if is_own(key, p.export_framework):  # knob by knob: tests/test_export_own_framework.py
        # exact, but for a knob the framework has no key for (Miles's exact centering: the run's sampling decides)
        assert snip.exact == (snip.uncarried == ()) and len(snip.uncarried) <= 1, snip.text
    else:
        assert snip.exact == ("NOTE" not in snip.text)


# presets whose own framework writes an equivalent setting under other keys
EQUIVALENT = {"skyrl/cispo_rollout": "clamp(rho, 0, 5) = min(rho, 5): token TIS at 5, SkyRL's own form"}


@pytest.mark.parametrize("key", [k for k in PRESETS if PRESETS[k].export_framework in SAME_NAMES
                                 and k not in EQUIVALENT])
def test_the_exported_keys_are_the_presets_knob_values(key):
    cfg = PRESETS[key].config.as_dict()
    for dotted, value in _settings(key).keys.items():
        name = dotted.rsplit(".", 1)[-1]
        if name in cfg and cfg[name] is not None:
            assert value == pytest.approx(cfg[name]) if isinstance(value, float) else value == cfg[name], name


@pytest.mark.parametrize("x", [*ESTIMATORS, *PRESETS])
def test_every_snippet_is_text_that_says_what_it_is(x):
    for framework, snip in export_all(x).items():
        assert snip.text.startswith(f"# seqis {x}")
        assert snip.exact <= snip.expressible
        if not snip.expressible:
            assert f"# cannot express in {framework}: " in snip.text
        if snip.exact:
            assert "NOTE:" not in snip.text


def test_legacy_prime_rl_writes_the_seed_estimators_bands():
    table = tomllib.loads(export("mis_po", "prime-rl-legacy").text)["loss"]
    assert table["token_mask_low"] == 0.5 and table["token_mask_high"] == 2.0
    assert table["geo_mask_low"] == 0.996 and table["geo_mask_high"] == 1.001 and table["ratio_type"] == "token"
    seq = tomllib.loads(export("seq_tis", "prime-rl-legacy").text)["loss"]
    assert seq["ratio_type"] == "sequence" and seq["sequence_clip_high"] == 2.0 and seq["geo_mask_high"] == math.inf
    assert export("seq_tis", "prime-rl-legacy").exact


def test_prime_rl_toml_parses_and_round_trips_the_default_loss():
    table = tomllib.loads(export("prime-rl/default", "prime-rl").text)["trainer"]["loss"]
    assert table == dict(type="ipo", eps=0.3, max_importance_ratio=1e4, adv_tau=1.0)  # issue 42: capped, no kl_tau
    dppo = export("prime-rl/dppo", "prime-rl").text
    assert tomllib.loads(dppo)["trainer"]["loss"] == dict(type="default", dppo_mask_low=0.2, dppo_mask_high=0.2,
                                                          adv_tau=1.0, kl_tau=0.001)
    assert "v0.6.0 - v0.8.0" in dppo and "#3418" in dppo  # the removed type says which releases run it
    ice = tomllib.loads(export("prime-rl/icepop", "prime-rl").text)["trainer"]["loss"]
    assert ice == dict(type="icepop", ratio_low=0.2, ratio_high=5.0, adv_tau=1.0)


def test_verl_k1_band_is_written_on_mu_over_pi():
    # a band [0.5, 2] on the geometric ratio pi/mu is verl's seq_mean_k1 band [1/2, 1/0.5] on mu/pi
    comp = Composition(Weight("none"), (Criterion("ratio", "mean", low=0.5, high=4.0),))
    text = export(comp, "verl").text
    block = yaml.safe_load(text)["algorithm"]["rollout_correction"]
    assert block["rollout_rs"] == "seq_mean_k1" and block["rollout_rs_threshold"] == "0.25_2.0"  # a string
    assert "NOTE: verl clamps log-ratios at +-20" in text  # expressible, not exact


def test_verl_max_mask_is_seq_max_k2_when_the_band_is_symmetric_in_log_space():
    sym = export("max_mask", "verl", ESTIMATORS["max_mask"].config(token_mask_low=0.5, token_mask_high=2.0))
    assert sym.expressible and "seq_max_k2" in sym.text
    assert f"rollout_rs_threshold: {fmt(0.5 * math.log(2.0) ** 2)}" in sym.text  # |l| <= log 2
    asym = export("max_mask", "verl", ESTIMATORS["max_mask"].config(token_mask_low=0.5, token_mask_high=3.0))
    assert not asym.expressible and "symmetric" in asym.text


@pytest.mark.parametrize("framework,reason", [
    ("verl", "penalty"), ("trl", "reference model"), ("skyrl", "reference model"), ("nemo-rl", "reference"),
    ("areal", "reference"), ("openrlhf", "reference"), ("slime", "reference")])
def test_a_penalty_against_the_sampler_is_refused_with_its_reason(framework, reason):
    snip = export("prime-rl/dppo", framework)
    assert not snip.expressible and reason in snip.text


def test_what_prime_rl_cannot_express_points_to_its_custom_loss():
    snip = export("seq_tis", "prime-rl")
    assert not snip.expressible and 'type = "custom"' in snip.text


def test_sign_conditioned_rejection_is_refused_where_a_framework_has_none():
    opsm = Composition(Weight("token", clip=2.0), (Criterion("k1", "mean", high=0.5, advantage="negative"),))
    assert not export(opsm, "verl").expressible and "advantage" in export(opsm, "verl").text
    assert export(opsm, "trl").expressible  # TRL's OPSM
    assert not export(Composition(Weight("token"), penalty=Penalty(0.1, "k3")), "prime-rl").expressible


def test_openrlhf_two_sided_clamp_has_no_verl_key_and_is_skyrls_cispo_on_the_rollout():
    snip = export("openrlhf/tis", "verl")
    assert not snip.expressible and "above only" in snip.text
    snip = export("openrlhf/tis", "skyrl")  # clamp(rho, 0.5, 5): 1 - 0.5, 1 + 4
    assert snip.expressible and "cispo_anchor: rollout" in snip.text and "cispo_eps_clip_low: 0.5" in snip.text


def test_adv_tau_has_no_key_outside_prime_rl():
    cfg = PRESETS["trl/token_truncate"].config.replace(adv_tau=0.5)
    snip = export("trl/token_truncate", "trl", cfg)
    assert snip.expressible and not snip.exact and "adv_tau=0.5 has no key" in snip.text
    assert export("prime-rl/default", "prime-rl", PRESETS["prime-rl/default"].config.replace(adv_tau=0.5)).exact


def test_a_band_decided_in_the_other_space_carries_a_note():
    # TRL decides exp(l) > 3 on the ratio (grpo_trainer.py:2698), verl l > log 3 (rollout_corr_helper.py:316): the
    # same band, a different verdict within an ulp of its edge, so the export says so and is not exact
    snip = export("trl/token_mask", "verl")
    assert snip.expressible and not snip.exact and "verl compares l against log C" in snip.text, snip.text
    assert export("trl/token_mask", "trl").exact
    snip = export("icepop", "trl")  # seqis's own icepop decides in log space
    assert snip.expressible and not snip.exact and "trl compares exp(l) against C" in snip.text, snip.text
    assert "an ulp" not in export("icepop", "verl").text  # log space in both: no note on the edges


def test_the_weights_clamp_order_exports_where_the_framework_has_it():
    # a geometric weight of the clamped l_t: ms-swift's sequence_truncate exactly; a framework that clamps the
    # aggregate has no setting for it; ms-swift's own order noted for a weight that clamps the mean
    each = Composition(Weight("geometric", clip=2.0), log_ratio_clamp=20.0, weight_clamp_order="token")
    assert export(each, "ms-swift").exact
    snip = export(each, "slime")
    assert not snip.expressible and "slime has no setting for weight_clamp_order" in snip.text, snip.text
    snip = export(Composition(each.weight, log_ratio_clamp=20.0), "ms-swift")
    assert snip.expressible and not snip.exact and "clamps each l_t before the geometric mean" in snip.text
    token = Composition(Weight("token", clip=2.0), log_ratio_clamp=20.0, weight_clamp_order="token")
    assert export(token, "verl").expressible  # a token weight: clamping l_t first is clamping its exponent
