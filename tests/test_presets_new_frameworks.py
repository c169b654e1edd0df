"""The presets of ms-swift, open-instruct, ROLL, Tinker, ART, torchforge and Tunix: every key, small batches worked
out by hand from each framework's code (the file and line of the arithmetic in each case's comment), and every
export read back into the framework's settings it was made from.

ms-swift and ART also run against their own installed code (test_presets_own_code.py). The others cannot load
here: open-instruct and ROLL are not on PyPI, torchforge's PyPI package is a placeholder, Tunix is JAX, and
Tinker's losses run on its servers (their code is the one in Tinker's loss docs). Lines cited: ms-swift 4.6.0;
open-instruct e6c3044a; ROLL 8eb27cc2; torchforge 6e77f0b3; Tunix c7d8950f; ART 0.5.23.
"""

from __future__ import annotations

import ast
import math

import pytest
import torch

from seqis import PRESETS, Batch, run
from seqis.export import EXPORTERS, export
from seqis.presets import FRAMEWORKS, presets_of

NEW = ("ms-swift", "open-instruct", "roll", "tinker", "art", "torchforge", "tunix")
DESIGN_KEYS = ["ms-swift/token_truncate", "ms-swift/token_mask", "ms-swift/sequence_truncate",
               "ms-swift/sequence_mask", "open-instruct/default", "tinker/importance_sampling", "tinker/ppo",
               "tinker/cispo", "art/default", "torchforge/reinforce", "tunix/sampler_is"]
MINE = [k for k in PRESETS if PRESETS[k].framework in NEW]
E = math.exp


def batch_of(rows, adv, mu=0.5, dtype=torch.float64) -> Batch:
    """Rollouts with the given log-ratios l (ragged: rows padded; [] is an empty rollout), the sampler's
    probability `mu` on every token (a negative mu is its log-prob, for edges that must hold to the last bit)."""
    T = max(1, max(len(r) for r in rows))
    l = torch.tensor([r + [0.0] * (T - len(r)) for r in rows], dtype=torch.float64)
    mask = torch.tensor([[t < len(r) for t in range(T)] for r in rows])
    log_mu = torch.full_like(l, mu if mu < 0 else math.log(mu))
    return Batch(trainer_logprobs=(log_mu + l).to(dtype), inference_logprobs=log_mu.to(dtype),
                 advantages=torch.tensor(adv, dtype=dtype), loss_mask=mask)


def check(key, rows, adv, weights, kept=None, cfg=None, mu=0.5, dtype=torch.float64, rtol=1e-12):
    out = run(key, batch_of(rows, adv, mu, dtype), cfg)
    T = max(1, max(len(r) for r in rows))
    want = torch.tensor([w + [0.0] * (T - len(w)) for w in weights], dtype=torch.float64)
    torch.testing.assert_close(out.weights.to(torch.float64), want, rtol=rtol, atol=0.0)
    if kept is not None:
        want_kept = torch.tensor([k + [False] * (T - len(k)) for k in kept])
        assert torch.equal(out.masks["kept"].cpu(), want_kept)
    return out


def test_every_key_exists_and_every_framework_lists_its_presets():
    assert set(DESIGN_KEYS) <= set(PRESETS)
    assert {k.split("/")[0] for k in PRESETS if k.startswith("roll/")} == {"roll"} and len(presets_of("roll")) >= 4
    for framework in NEW:
        assert framework in FRAMEWORKS and framework in EXPORTERS and presets_of(framework)


# ---------------------------------------------------------------------------------------------------------
# ms-swift (swift/rlhf_trainers/grpo_trainer.py)


def test_ms_swift_sequence_mask_gates_the_token_ratio_by_the_clamped_geometric_mean():
    # :2362 clamps each l at +-20, :2339 takes the mean of the clamped l, :2386 keeps g <= 2, :2390 the weight is
    # the token ratio. l = (+25, -20): clamped (20, -20), g = 1, kept, weights e^20 and e^-20.
    # l = (log 3, log 1.2): g = sqrt(3.6) = 1.897 <= 2, kept with weights 3 and 1.2; (log 3, log 1.5): g = 2.12,
    # dropped; an empty rollout and a zero advantage change nothing
    rows = [[25.0, -20.0], [math.log(3.0), math.log(1.2)], [math.log(3.0), math.log(1.5)], []]
    check("ms-swift/sequence_mask", rows, [1.0, 0.0, -1.0, 1.0], [[E(20), E(-20)], [3.0, 1.2], [0.0, 0.0], []],
          [[True, True], [True, True], [False, False], []])


def test_ms_swift_token_modes_at_the_threshold():
    # :2370 min(rho, 2); :2374 rho where rho <= 2 (2 itself kept), else 0; l = 30 clamped to 20 first
    rows = [[math.log(2.0), math.log(2.5), 30.0, -30.0]]
    check("ms-swift/token_truncate", rows, [1.0], [[2.0, 2.0, 2.0, E(-20)]])
    check("ms-swift/token_mask", rows, [1.0], [[2.0, 0.0, 0.0, E(-20)]], [[True, False, False, True]])


def test_ms_swift_sequence_truncate_is_the_geometric_mean_not_the_product():
    # :2379 min(g, 2), g = exp(mean l): (log 2, log 8) -> g = 4 -> 2; (log 0.5, log 2) -> g = 1 (TRL's product
    # would be 1 too); (log 1.5, log 1.5) -> g = 1.5, where the product 2.25 would be capped at 2
    rows = [[math.log(2.0), math.log(8.0)], [math.log(0.5), math.log(2.0)], [math.log(1.5)] * 2]
    check("ms-swift/sequence_truncate", rows, [1.0] * 3, [[2.0, 2.0], [1.0, 1.0], [1.5, 1.5]])


def test_ms_swift_opsm_drops_negative_advantage_rollouts_far_from_the_sampler():
    # :2430 drop when mean(mu - pi) in log space > delta and A < 0; mode None: no weight
    cfg = PRESETS["ms-swift/token_mask"].config.replace(rollout_importance_sampling_mode=None,
                                                         off_policy_sequence_mask_delta=0.5)
    rows = [[-0.6, -0.6], [-0.6, -0.6], [-0.5, -0.5]]  # mean(-l) 0.6, 0.6, 0.5 (0.5 is not > 0.5: kept)
    check("ms-swift/token_mask", rows, [1.0, -1.0, -1.0], [[1.0, 1.0], [0.0, 0.0], [1.0, 1.0]],
          [[True, True], [False, False], [True, True]], cfg, mu=-1.0)  # log mu = -1: l = -0.5 to the last bit


# ---------------------------------------------------------------------------------------------------------
# open-instruct (open_instruct/grpo_utils.py)


def test_open_instruct_default_clamps_l_at_ten_then_rho_at_two():
    # :419 clamp(l, -10, 10); :453 min(rho, 2): l = 15 -> 2, l = -15 -> e^-10 (not e^-15), 3 -> 2, 0.5 stays
    rows = [[15.0, -15.0, math.log(3.0), math.log(0.5)], []]
    check("open-instruct/default", rows, [1.0, 1.0], [[2.0, E(-10), 2.0, 0.5], []])


def test_open_instruct_masks_keep_their_edges():
    # :375-376 drop rho < lower and rho > upper: 0.5 and 2 kept, 0.45 and 2.2 dropped; the weight of a kept
    # token is clamp(rho, 0, 2) (:453, :455)
    cfg = PRESETS["open-instruct/default"].config.replace(rho_mask_lower_bound=0.5, rho_mask_upper_bound=2.0)
    rows = [[math.log(0.5), math.log(2.0), math.log(0.45), math.log(2.2), 0.0]]
    check("open-instruct/default", rows, [-1.0], [[0.5, 2.0, 0.0, 0.0, 1.0]], [[True, True, False, False, True]],
          cfg)


def test_open_instruct_sequence_level_weighs_and_masks_by_the_geometric_mean():
    # :427 rho_effective = exp(mean of the clamped l) for the mask and the weight: (log 2, log 8) -> g = 4,
    # above the mask's 3: dropped; (log 1.5, log 2) -> g = 1.732: weight min(1.732, 2) on both tokens;
    # (12, -12) -> clamped (10, -10), g = 1
    cfg = PRESETS["open-instruct/default"].config.replace(rho_mask_sequence_level=True, rho_mask_upper_bound=3.0)
    g = math.sqrt(3.0)
    rows = [[math.log(2.0), math.log(8.0)], [math.log(1.5), math.log(2.0)], [12.0, -12.0]]
    check("open-instruct/default", rows, [1.0, 0.0, -1.0], [[0.0, 0.0], [g, g], [1.0, 1.0]],
          [[False, False], [True, True], [True, True]], cfg)


def test_open_instruct_sequence_level_clamps_each_token_first():
    # (30, -10): open-instruct's mean of the clamped l is 0 -> weight 1; the composition's clamped mean is 10
    cfg = PRESETS["open-instruct/default"].config.replace(rho_mask_sequence_level=True, rho_clamp_upper_bound=0.0)
    check("open-instruct/default", [[30.0, -10.0]], [1.0], [[1.0, 1.0]], cfg=cfg)


def test_open_instruct_switches_and_refusals():
    cfg = PRESETS["open-instruct/default"].config
    check("open-instruct/default", [[5.0]], [1.0], [[1.0]], cfg=cfg.replace(use_rho_correction=False))
    with pytest.raises(ValueError, match="rho_mask_tv_divergence"):
        cfg.replace(rho_mask_tv_divergence=True)
    with pytest.raises(ValueError, match="rho_mask_upper_bound must be > 1"):
        cfg.replace(rho_mask_upper_bound=0.9)


# ---------------------------------------------------------------------------------------------------------
# ROLL (roll/utils/train_infer_corrections.py, roll/utils/functionals.py)


def test_roll_is_weight_clamps_each_level_at_1p2_without_a_log_clamp():
    # :124 clamp(ratio, 0, 1.2); :17 no clamp of l: e^30 -> 1.2, e^-30 stays
    check("roll/is_weight", [[math.log(1.5), math.log(0.5), 30.0, -30.0]], [1.0], [[1.2, 0.5, 1.2, E(-30)]])
    # :23 geometric exp(mean l) = sqrt(1.1 * 0.9) = 0.995; :28 sequence exp(sum l) = 0.99 and 1.21 -> 1.2
    rows = [[math.log(1.1), math.log(0.9)], [math.log(1.1)] * 2]
    check("roll/is_weight_geometric", rows, [1.0, 1.0], [[math.sqrt(0.99)] * 2, [1.1, 1.1]])
    check("roll/is_weight_sequence", rows, [1.0, 1.0], [[0.99] * 2, [1.2, 1.2]])


def test_roll_sequence_weight_past_fp32_overflow_is_the_bound():
    # fp32: exp(100) is inf in ROLL, clamp(inf, 0, 1.2) = 1.2 (:124); seqis caps the weight at the bound too
    check("roll/is_weight_sequence", [[50.0, 50.0], [-40.0, -40.0]], [1.0, 1.0], [[1.2, 1.2], [E(-80)] * 2],
          dtype=torch.float32, rtol=1e-6)


def test_roll_filters_keep_their_edges_at_each_level():
    # :141 keep ratio >= 0.8 and <= 1.2. geometric (:23, functionals.py:288 divides by T + 1e-8): three tokens of
    # log 1.2 -> exp(3 log 1.2 / (3 + 1e-8)) just under 1.2: kept; 1.2 * (1 + 1e-6): dropped
    edge, over = math.log(1.2), math.log(1.2 * (1 + 1e-6))
    check("roll/filter_geometric", [[edge] * 3, [over] * 3, []], [1.0, 1.0, 1.0], [[1.0] * 3, [0.0] * 3, []],
          [[True] * 3, [False] * 3, []])
    # sequence (:28): exp(log 2 + log 0.55) = 1.1 kept, exp(log 2 + log 0.65) = 1.3 dropped, mixed signs
    rows = [[math.log(2.0), math.log(0.55)], [math.log(2.0), math.log(0.65)]]
    check("roll/filter_sequence", rows, [1.0, -1.0], [[1.0, 1.0], [0.0, 0.0]], [[True, True], [False, False]])
    # token: 0.8 and 1.2 kept, 0.79 dropped; a zero advantage changes nothing
    check("roll/filter_token", [[math.log(0.8), math.log(1.2), math.log(0.79)]], [0.0], [[1.0, 1.0, 0.0]],
          [[True, True, False]])


def test_roll_diff_filter_bands_pi_old_minus_mu():
    # :20 diff = exp(old) - exp(infer), :155 kept in [diff_low, diff_high]; mu = 0.8: rho 1.1 -> diff 0.08,
    # rho 1.05 -> 0.04 (inside [-0.05, 0.05]); rho 0.9 -> -0.08. At the default bands the diff test never binds
    # on its own at token level: |pi - mu| = mu |rho - 1| <= 0.2 whenever rho is in [0.8, 1.2]
    cfg = PRESETS["roll/filter_token_diff"].config.replace(filter_diff_low=-0.05, filter_diff_high=0.05)
    rows = [[math.log(1.1), math.log(1.05), math.log(0.9)]]
    check("roll/filter_token_diff", rows, [1.0], [[0.0, 1.0, 0.0]], [[False, True, False]], cfg, mu=0.8)
    # geometric: the rollout MEAN of the diffs, 0.8 * (0.1 - 0.05) / 2 = 0.02: kept
    geo = cfg.replace(filter_agg_type="geometric")
    check("roll/filter_token_diff", [[math.log(1.1), math.log(0.95)]], [1.0], [[1.0, 1.0]], [[True, True]], geo,
          mu=0.8)


def test_roll_default_applies_nothing_and_segment_is_refused():
    check("roll/default", [[5.0, -5.0]], [1.0], [[1.0, 1.0]])
    with pytest.raises(ValueError, match="segment"):
        PRESETS["roll/is_weight"].config.replace(is_weight_weight_type="segment")


# ---------------------------------------------------------------------------------------------------------
# Tinker (its loss docs: importance_sampling, ppo, cispo)


def test_tinker_importance_sampling_is_unbounded():
    check("tinker/importance_sampling", [[3.0, -2.0], []], [1.0, -1.0], [[E(3), E(-2)], []])


def test_tinker_ppo_keeps_its_clip_edges_and_has_no_dual_clip():
    # A > 0: rho 1.2 kept (the min's tie splits the gradient, both halves pass; clamp passes at its edge), 1.3
    # dropped; A < 0: 0.8 kept, 0.7 dropped, 5 kept (no dual clip); A = 0: nothing to drop
    rows = [[math.log(1.2), math.log(1.3), math.log(0.5)], [math.log(0.8), math.log(0.7), math.log(5.0)],
            [math.log(3.0)]]
    check("tinker/ppo", rows, [1.0, -1.0, 0.0], [[1.2, 0.0, 0.5], [0.8, 0.0, 5.0], [3.0]],
          [[True, False, True], [True, False, True], [True]])


def test_tinker_cispo_caps_at_four_and_survives_fp32_overflow():
    check("tinker/cispo", [[math.log(5.0), math.log(0.01)]], [1.0], [[4.0, 0.01]])
    check("tinker/cispo_two_sided", [[math.log(5.0), math.log(0.01), 0.0]], [1.0], [[1.2, 0.8, 1.0]])
    # fp32: exp(100) is inf on Tinker's side, clamp(inf, 0, 4) = 4
    check("tinker/cispo", [[100.0]], [1.0], [[4.0]], dtype=torch.float32)


# ---------------------------------------------------------------------------------------------------------
# ART (src/art/loss.py): the preset is also run against ART's own loss_fn


def test_art_default_is_cispo_clip_zero_to_five_after_the_clamp():
    # :301-302 clamp l at +-20 then exp; :323 epsilon 1, epsilon_high 4; :374 clip(ratio, 0, 5)
    check("art/default", [[math.log(6.0), math.log(0.1), 25.0, -25.0]], [1.0], [[5.0, 0.1, 5.0, E(-20)]])


def test_art_refuses_what_the_composition_cannot_do():
    cfg = PRESETS["art/default"].config
    for change, match in ((dict(mask_prob_ratio=True), "open edges"), (dict(importance_sampling_level="average"),
                          "mixes"), (dict(ppo=True, importance_sampling_level="sequence"), "1/T")):
        with pytest.raises(ValueError, match=match):
            cfg.replace(**change)


# ---------------------------------------------------------------------------------------------------------
# torchforge (src/forge/losses/reinforce_loss.py) and Tunix (tunix/rl/grpo/grpo_learner.py)


def test_torchforge_reinforce_clamps_rho_to_a_tenth_and_ten():
    # :43-44 clamp(exp(l), 0.1, 10), no log clamp: e^5 -> 10, e^-5 -> 0.1
    check("torchforge/reinforce", [[5.0, -5.0, 0.0], []], [1.0, 1.0], [[10.0, 0.1, 1.0], []])
    # fp32: exp(200) is inf and exp(-200) is 0 there; the clamp makes them 10 and 0.1
    check("torchforge/reinforce", [[200.0, -200.0]], [-1.0], [[10.0, 0.1]], dtype=torch.float32, rtol=1e-6)
    check("torchforge/grpo", [[5.0, -5.0]], [1.0], [[1.0, 1.0]])


def test_tunix_sampler_is_caps_at_two_after_the_clamp():
    # :448 clip(l, -20, 20); :450 min(exp(l), 2): 25 -> 2, -25 -> e^-20, 3 -> 2, 0.5 stays
    check("tunix/sampler_is", [[25.0, -25.0, math.log(3.0), math.log(0.5)]], [-1.0], [[2.0, E(-20), 2.0, 0.5]])
    check("tunix/sampler_is", [[5.0]], [1.0], [[1.0]], cfg=PRESETS["tunix/sampler_is"].config.replace(
        sampler_is=None))


# ---------------------------------------------------------------------------------------------------------
# export: every preset's snippet read back into its framework's settings, and composed again


def _value(text: str):
    text = text.strip().strip('"')
    special = {"True": True, "False": False, "None": None, "true": True, "false": False, "null": None,
               "inf": math.inf, ".inf": math.inf, "-.inf": -math.inf, 'float("inf")': math.inf}
    if text in special:
        return special[text]
    try:
        return float(text)
    except ValueError:
        return text


def _flags(text: str) -> dict:
    """--name value pairs of a command line."""
    words = " ".join(line.rstrip("\\") for line in text.splitlines() if not line.startswith("#")).split()
    return {w[2:]: _value(v) for w, v in zip(words, words[1:]) if w.startswith("--")}


def _literal(node: ast.expr):
    try:
        return ast.literal_eval(node)
    except ValueError:  # float("inf")
        return _value(ast.unparse(node))


def _call(text: str) -> dict:
    """The keyword arguments of the snippet's call (dict arguments merged in)."""
    node = next(n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Call) and n.keywords)
    out = {}
    for kw in node.keywords:
        if isinstance(kw.value, ast.Dict):
            out.update({ast.literal_eval(k): _literal(v) for k, v in zip(kw.value.keys, kw.value.values)})
        else:
            out[kw.arg] = _literal(kw.value)
    return out


def _roll(text: str) -> dict:
    """ROLL's YAML as the preset's flat knobs (is_weight_*, and filter_* of the first filter)."""
    out, section = {}, None
    for line in text.splitlines():
        if line.startswith("#") or ":" not in line:
            continue
        key, _, value = line.strip().lstrip("- ").partition(":")
        if key in ("is_weight", "filters"):
            section = "is_weight" if key == "is_weight" else "filter"
            continue
        if key != "detach" and section is not None and value.strip():
            out[f"{section}_{key}"] = _value(value)
    return out


def _torchforge(text: str) -> dict:
    return {"loss": text.rsplit("= ", 1)[1].strip().rstrip("()")}


READ_BACK = {"ms-swift": _flags, "open-instruct": _flags, "roll": _roll, "tinker": _call, "art": _call,
             "torchforge": _torchforge, "tunix": _call}


@pytest.mark.parametrize("key", MINE)
def test_a_preset_exports_to_its_framework_and_reads_back_to_its_composition(key):
    p = PRESETS[key]
    snip = export(key, p.framework)
    assert snip.expressible and snip.exact, snip.text
    keys = READ_BACK[p.framework](snip.text)
    keys.pop("rlhf_type", None)
    fields = {f for f in p.config.as_dict()}
    unknown = set(keys) - fields
    assert not unknown, (key, unknown)
    cfg = p.estimator.config(**{**{k: v for k, v in p.config.as_dict().items() if k in ("adv_tau",)}, **keys})
    assert p.estimator.compose(cfg) == p.compose(), (key, keys)


@pytest.mark.parametrize("key,framework,reason", [
    ("trl/sequence_truncate", "ms-swift", "geometric mean"),  # ms-swift's "sequence" is not TRL's product
    ("ms-swift/sequence_truncate", "trl", "not geometric"),
    ("verl/bypass_ppo_clip", "tunix", "rejects no token"),
    ("prime-rl/dppo", "tinker", "no penalty"),  # the DPPO + KL default of April-August 2026
    ("roll/default", "art", "always weighs"),
    ("tinker/ppo", "torchforge", "loss of your own"),
    ("tinker/ppo", "roll", "conditioned on the advantage"),
    ("skyrl/token_tis", "open-instruct", None),  # expressible: min(rho, 2), noting open-instruct's +-10 clamp
])
def test_across_frameworks_export_says_what_it_cannot_express(key, framework, reason):
    snip = export(key, framework)
    if reason is None:
        assert snip.expressible and not snip.exact and "clamps each log-ratio at +-10" in snip.text
    else:
        assert not snip.expressible and reason in snip.text, snip.text
