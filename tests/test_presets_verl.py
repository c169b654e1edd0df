"""verl's presets against verl's own code, on random ragged batches.

verl (pip `verl==0.9.1`, installed with --no-deps: `make test` does it) is imported without its heavy
dependencies: its package __init__ files are skipped (each package is a bare module with the installed path) and
the modules the helper and the loss touch only by name (DataProto, tensordict, transformers, omegaconf, the device
helpers, a few verl.utils names) are stubs. The maths run is verl's: `compute_rollout_correction_and_rejection_mask`
(rollout_corr_helper.py) and `compute_policy_loss_bypass_mode` / `compute_policy_loss_vanilla` (core_algos.py).

The comparison is the gradient of the loss in trainer_logprobs at the first minibatch (pi_theta = pi_old = the
trainer), with verl's token-mean normalised by every loss token (`global_batch_info.batch_num_tokens`), which is
seqis's agg="token-mean": d loss / d trainer_logprobs = -weights * A / N. The batches hold tokens with |l| > 20 so
verl's +-20 clamp is exercised.
"""

from __future__ import annotations

import importlib.util
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import yaml

from seqis import Batch, run
from seqis.export import export
from seqis.presets import PRESETS, presets_of
from seqis.presets.check import MissingCode
from seqis.presets.check import verl as check_verl
from seqis.presets.check.verl import rollout_correction
from seqis.registry import needs_head

verl_gradient = check_verl.gradient

VERL = sorted(k for k in presets_of("verl") if not needs_head(k))  # verl 0.9.1 here predates #8010 (SC)
# bypass ppo_clip: verl's +-20 clamp stops the gradient of a token with l < -20; seqis keeps weight e^-20 * A / N
# there (documented in the preset's summary), below 1e-10 on these batches
ATOL = 1e-10


@pytest.fixture(scope="module")
def verl():
    """(rollout_corr_helper, core_algos, algorithm) loaded from the installed verl with stubbed heavy imports (the
    maintainer's check does the same: seqis/presets/check/verl.py); sys.modules is restored afterwards."""
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("verl is not installed (pip install --no-deps verl==0.9.1; make test does it)")
    try:
        with check_verl.stubbed(Path(spec.submodule_search_locations[0]).parent) as modules:
            yield modules
    except MissingCode as why:  # a verl release whose imports moved: say so rather than fail
        pytest.skip(str(why))


def ragged_batch(seed: int, B: int = 8, T: int = 14, scale: float = 0.05) -> Batch:
    """Ragged rollouts (lengths 1..T, one empty), l ~ N(0, scale^2) around a per-rollout drift, a few tokens
    with |l| > 20, per-rollout advantages of both signs; padding holds finite junk (verl multiplies by the mask)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[0] = 0
    mask = torch.arange(T)[None, :] < lengths[:, None]
    inference = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3 - 0.05
    drift = torch.randn(B, 1, generator=g, dtype=torch.float64) * scale
    l = drift + torch.randn(B, T, generator=g, dtype=torch.float64) * scale
    l[2, 0], l[3, 1] = 25.0, -30.0  # beyond verl's +-20 clamp
    trainer = inference + l
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    return Batch(trainer_logprobs=trainer, inference_logprobs=inference, advantages=adv, loss_mask=mask)


def seqis_gradient(x, batch: Batch, cfg=None) -> torch.Tensor:
    b = Batch(trainer_logprobs=batch.trainer_logprobs.detach().clone().requires_grad_(True),
              inference_logprobs=batch.inference_logprobs, advantages=batch.advantages, loss_mask=batch.loss_mask)
    run(x, b, cfg).loss.backward()
    return b.trainer_logprobs.grad


def test_the_factories_give_the_presets_configs(verl):
    """Each preset's config is what verl's factory of the same name returns (at the factory's defaults)."""
    for key in VERL:
        factory = getattr(verl.algorithm.RolloutCorrectionConfig, PRESETS[key].name)()
        mine = rollout_correction(PRESETS[key].config)
        for field in ("rollout_is", "rollout_is_batch_normalize", "rollout_rs", "bypass_mode", "loss_type"):
            assert getattr(factory, field) == mine[field], (key, field)
        for field in ("rollout_is_threshold", "rollout_rs_threshold"):  # "0.5_5.0" == "0.5_5.0", 2.0 == 2.0
            theirs, ours = getattr(factory, field), mine[field]
            if isinstance(theirs, str) or isinstance(ours, str):
                assert [float(x) for x in str(theirs).split("_")] == [float(x) for x in str(ours).split("_")], key
            elif factory.rollout_rs is not None or field == "rollout_is_threshold":
                assert theirs == ours, (key, field)


@pytest.mark.parametrize("key", VERL)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_preset_gradient_equals_verls(verl, key, seed):
    cfg = PRESETS[key].config
    batch = ragged_batch(seed, scale=0.05 if cfg.rollout_rs is None else 0.002)  # rejections near their edges
    expected = verl_gradient(verl, rollout_correction(cfg), batch)
    torch.testing.assert_close(seqis_gradient(key, batch), expected, rtol=1e-9, atol=ATOL)


@pytest.mark.parametrize("key", VERL)
def test_a_preset_with_changed_knobs_still_equals_verl(verl, key):
    """cfg overrides a preset's knobs: a wider IS threshold and a tighter rejection, against verl."""
    cfg = PRESETS[key].config
    changes = dict(rollout_is_threshold=3.0 if cfg.rollout_is_threshold_lower is None else 4.0, clip_ratio=0.3)
    if cfg.rollout_rs is not None and cfg.rollout_rs.endswith("k1"):  # asymmetric: keeps pi/mu in [1/1.001, 1/0.995]
        changes.update(rollout_rs_threshold=1.001, rollout_rs_threshold_lower=0.995)
    elif cfg.rollout_rs is not None:
        changes.update(rollout_rs_threshold=cfg.rollout_rs_threshold * 2)
    cfg = cfg.replace(**changes)
    batch = ragged_batch(7, scale=0.002)
    torch.testing.assert_close(seqis_gradient(key, batch, cfg), verl_gradient(verl, rollout_correction(cfg), batch),
                               rtol=1e-9, atol=ATOL)


@pytest.mark.parametrize("key", [k for k in VERL if not PRESETS[k].config.bypass_mode
                                 or PRESETS[k].config.loss_type == "reinforce"])
def test_verl_clamps_each_token_then_aggregates_and_clamps_a_rollouts_sum(verl, key):
    """Thresholds wide enough that the +-20 clamp decides: a sequence weight exp(clamp(S)) = e^20 (not e^25), a
    token at l = -30 counting as -20 in a rollout's mean k1 or k3. One rollout is 10 tokens with l = -30 once and
    0 elsewhere: its mean k1 is 2.0 clamped (3.0 raw), kept under the band's upper edge e^2.5."""
    cfg = PRESETS[key].config.replace(rollout_is_threshold=1e12)
    if cfg.rollout_rs is not None and cfg.rollout_rs.endswith("k1"):
        cfg = cfg.replace(rollout_rs_threshold=math.exp(2.5), rollout_rs_threshold_lower=1e-12)
    elif cfg.rollout_rs is not None:
        cfg = cfg.replace(rollout_rs_threshold=math.exp(19))
    batch = ragged_batch(5, scale=0.05)
    batch.trainer_logprobs[1, :10] = batch.inference_logprobs[1, :10]
    batch.trainer_logprobs[1, 3] -= 30.0
    batch.loss_mask[1] = torch.arange(batch.loss_mask.shape[1]) < 10
    torch.testing.assert_close(seqis_gradient(key, batch, cfg), verl_gradient(verl, rollout_correction(cfg), batch),
                               rtol=1e-9, atol=ATOL)


def _verl_keys(snippet_text: str) -> dict:
    """algorithm.rollout_correction and the actor's clip keys of an exported verl YAML (flat, two-space)."""
    out: dict = {}
    for line in snippet_text.splitlines():
        key, sep, value = line.strip().partition(": ")
        if not sep or line.startswith("#"):
            continue
        value = value.strip('"')
        out[key] = {"null": None, "true": True, "false": False, ".inf": math.inf}.get(value, value)
        if isinstance(out[key], str):
            try:
                out[key] = float(out[key])
            except ValueError:
                pass
    return out


@pytest.mark.parametrize("key", [k for k in PRESETS if export(k, "verl").expressible and not needs_head(k)])
def test_what_exports_to_verl_computes_the_same_gradient_in_verl(verl, key):
    """Export derived from the composition: any preset verl can express (TRL's, SkyRL's, ...) exported to verl
    YAML and run by verl's own code gives seqis's gradient (up to verl's +-20 clamp, kept out of this batch)."""
    batch = ragged_batch(3, scale=0.002)
    batch.trainer_logprobs[2, 0] = batch.inference_logprobs[2, 0]  # no |l| > 20: exporters note the clamp
    batch.trainer_logprobs[3, 1] = batch.inference_logprobs[3, 1]
    keys = _verl_keys(export(key, "verl").text)
    torch.testing.assert_close(seqis_gradient(key, batch), verl_gradient(verl, keys, batch), rtol=1e-9, atol=ATOL)


def test_icepop_with_every_weight_zero_raises_in_verl_and_gives_zeros_in_seqis(verl):
    """verl's IcePop divides by the mean squared weight for its ESS metric: all-zero weights crash it."""
    batch = ragged_batch(0)
    batch = Batch(trainer_logprobs=batch.inference_logprobs + 3.0, inference_logprobs=batch.inference_logprobs,
                  advantages=batch.advantages, loss_mask=batch.loss_mask)  # every rho = e^3 > 5
    mask = batch.loss_mask.to(torch.float64)
    with pytest.raises(ZeroDivisionError):
        verl.helper.compute_rollout_correction_and_rejection_mask(
            batch.trainer_logprobs, batch.inference_logprobs, mask, rollout_is="token",
            rollout_is_threshold="0.5_5.0")
    out = run("verl/decoupled_token_icepop", batch)
    assert torch.all(out.weights == 0) and not out.masks["kept"].any()


def _same(theirs, ours) -> bool:
    """One setting read back: 'lower_upper' thresholds by their numbers ("0.5_5.0" == "0.5_5"), anything else (a
    name such as "seq_mean_k1") as it is."""
    numbers = lambda v: [float(x) for x in str(v).split("_")]
    try:
        return numbers(theirs) == numbers(ours)
    except ValueError:
        return theirs == ours


def _read_back(key: str, cfg=None) -> tuple[dict, dict]:
    """(algorithm.rollout_correction, actor) of `key` exported to verl, read with the YAML library."""
    doc = yaml.safe_load(export(key, "verl", cfg).text)
    return doc["algorithm"]["rollout_correction"], doc["actor_rollout_ref"]["actor"]


@pytest.mark.parametrize("key", VERL)
def test_a_verl_preset_exported_to_verl_is_its_own_config_key_by_key(key):
    """verl's own preset exported to verl writes the preset's settings (decoupled stays decoupled, the loss type
    and the actor's clip are carried), read back with the YAML library: never bypass REINFORCE in its place."""
    rc, actor = _read_back(key)
    want = rollout_correction(PRESETS[key].config)
    assert set(rc) == {"rollout_is", "rollout_is_threshold", "rollout_is_batch_normalize", "rollout_rs",
                       "rollout_rs_threshold", "bypass_mode", "loss_type"}, key
    for field, value in rc.items():
        assert _same(value, want[field]), (key, field, value, want[field])
    assert actor == {"clip_ratio": want["clip_ratio_low"], "clip_ratio_c": want["clip_ratio_c"]}, key
    snip = export(key, "verl")
    assert snip.exact and snip.uncarried == (), key


def test_verls_own_factories_read_back_equal_the_export(verl):
    """Each exported verl preset against the factory of the same name in verl's own code, field by field."""
    for key in VERL:
        factory = getattr(verl.algorithm.RolloutCorrectionConfig, PRESETS[key].name)()
        rc, _ = _read_back(key)
        for field, value in rc.items():
            assert _same(getattr(factory, field), value), (key, field)


def test_what_a_verl_preset_cannot_carry_is_named_in_the_text_and_the_snippet():
    cfg = PRESETS["verl/decoupled_token_is"].config
    snip = export("verl/decoupled_token_is", "verl", replace(cfg, adv_tau=0.5))
    assert not snip.exact and len(snip.uncarried) == 1 and snip.uncarried[0].startswith("adv_tau=0.5")
    assert f"# NOTE: {snip.uncarried[0]}" in snip.text
    rc, _ = _read_back("verl/decoupled_token_is", replace(cfg, adv_tau=0.5))
    assert rc["bypass_mode"] is False  # the rest still carried
