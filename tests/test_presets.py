"""PRESETS: every key of the design, each runs and keeps the output contract, and each framework's preset computes
what that framework's code computes, on small batches worked out by hand from the code (arithmetic in comments;
the code each case follows is named in the preset's .source and module docstring). verl's presets are also run
against verl's own helper in test_presets_verl.py.
"""

from __future__ import annotations

import math

import pytest
import torch

from seqis import ESTIMATORS, PRESETS, Batch, run, run_many
from seqis.evaluators.plain import evaluate
from seqis.presets import FRAMEWORKS, presets_of
from seqis.registry import About, about, resolve

DESIGN_KEYS = [
    *(f"verl/{k}" for k in (
        "decoupled_token_is", "decoupled_seq_is", "decoupled_seq_is_rs", "decoupled_geo_rs",
        "decoupled_geo_rs_seq_tis", "decoupled_geo_rs_token_tis", "decoupled_k3_rs", "decoupled_k3_rs_seq_tis",
        "decoupled_k3_rs_token_tis", "decoupled_token_icepop", "bypass_ppo_clip", "bypass_ppo_clip_geo_rs",
        "bypass_ppo_clip_k3_rs", "bypass_pg_is", "bypass_pg_token_icepop", "bypass_pg_geo_rs",
        "bypass_pg_geo_rs_seq_tis", "bypass_pg_geo_rs_token_tis", "disabled")),
    "trl/token_truncate", "trl/token_mask", "trl/sequence_truncate", "trl/sequence_mask", "trl/opsm",
    "nemo-rl/tis", "nemo-rl/icepop", "nemo-rl/seq-mask-tis",
    "prime-rl/default", "prime-rl/ipo", "prime-rl/seq_tis", "prime-rl/seq_mis", "prime-rl/geo_mask",
    "prime-rl/mis_po",
    # the third wave ("Presets: the field as it ships today")
    "prime-rl/dppo", "prime-rl/icepop", "nemo-rl/seq-tis", "nemo-rl/seq-icepop", "skyrl/dppo_tv",
    "skyrl/cispo_rollout", "areal/default", "areal/icepop", "openrlhf/gspo-is",
    "miles/tis", "miles/icepop", "miles/mis", "miles/opsm",
    # the fourth wave (issue 42: prime-rl as it ships now; the IPO before its ratio cap kept under its own key)
    "prime-rl/ppo", "prime-rl/cispo", "prime-rl/ipo_2026_09",
]
LOG_MU = math.log(0.5)  # every token's sampler probability is 1/2 in the hand-made batches


def batch_of(rows: list[list[float]], adv: list[float]) -> Batch:
    """Rollouts with the given log-ratios l (ragged: rows padded with NaN), mu = 1/2 on every token."""
    T = max(len(r) for r in rows)
    l = torch.tensor([r + [math.nan] * (T - len(r)) for r in rows], dtype=torch.float64)
    mask = ~torch.isnan(l)
    mu = torch.full_like(l, LOG_MU)
    return Batch(trainer_logprobs=(mu + l.nan_to_num(0.0)).requires_grad_(True), inference_logprobs=mu,
                 advantages=torch.tensor(adv, dtype=torch.float64), loss_mask=mask)


def check(key: str, rows, adv, weights, kept, cfg=None):
    out = run(key, batch_of(rows, adv), cfg)
    T = max(len(r) for r in rows)
    want_w = torch.tensor([w + [0.0] * (T - len(w)) for w in weights], dtype=torch.float64)
    want_k = torch.tensor([k + [False] * (T - len(k)) for k in kept])
    torch.testing.assert_close(out.weights.to(torch.float64), want_w, rtol=1e-9, atol=1e-12)
    assert torch.equal(out.masks["kept"].cpu(), want_k)
    return out


# ---------------------------------------------------------------------------------------------------------
# the registry


def test_every_design_key_is_a_preset_and_every_framework_has_presets():
    assert set(DESIGN_KEYS) <= set(PRESETS)
    for framework in ("verl", "trl", "nemo-rl", "prime-rl", "slime", "miles", "skyrl", "areal", "openrlhf", "custom"):
        assert presets_of(framework), framework
    assert list(FRAMEWORKS) == sorted({p.framework for p in PRESETS.values()}, key=list(FRAMEWORKS).index)


@pytest.mark.parametrize("key", list(PRESETS))
def test_a_preset_describes_itself(key):
    p = PRESETS[key]
    assert p.key == key == f"{p.framework}/{p.name}"
    assert p.summary and "\n" not in p.summary
    repo, _, path = p.source.partition(": ")
    own = repo.split("@")[0] == "seqis"  # seqis's own corrections: the seed's four, the custom builder
    assert own or ("/" in repo and ("@" in repo or "#" in repo)), f"repository@commit-or-release, or #PR: {p.source}"
    assert ".py" in path, p.source
    assert p.versions and "\n" not in p.versions, f"{key}: .versions says when the framework shipped it"
    assert own or any(ch.isdigit() for ch in p.versions), p.versions  # a date or a release
    assert isinstance(p.config, p.estimator.config)


def test_about_serves_registry_names_and_preset_keys_alike():
    for name, spec in ESTIMATORS.items():
        a = about(name)
        assert (a.summary, a.export_framework) == (spec.summary, None)
        assert a.source == spec.section("Source") and a.source, name
    for key, p in PRESETS.items():
        assert about(key) == About(p.summary, p.source, p.export_framework)
    assert about("verl/bypass_pg_is").export_framework == "verl"
    assert about("prime-rl/seq_tis").export_framework == "prime-rl-legacy"  # written by the older table's exporter
    with pytest.raises(ValueError, match="unknown estimator 'seq_tiss'"):
        about("seq_tiss")


@pytest.mark.parametrize("key", list(PRESETS))
def test_every_preset_runs_and_keeps_the_output_contract(key):
    g = torch.Generator().manual_seed(0)
    B, T = 5, 7
    mu = -torch.rand(B, T, generator=g, dtype=torch.float64) - 0.1
    mask = torch.arange(T)[None] < torch.tensor([7, 3, 1, 5, 0])[:, None]
    K = 3  # a head of 3 of 6 tokens, the replayed support every slot (score centering reads it; the rest do not)
    log_q = torch.randn(B, T, 6, generator=g, dtype=torch.float64).log_softmax(-1)[..., :K]
    log_p = (log_q + 0.05 * torch.randn(B, T, K, generator=g, dtype=torch.float64)).clamp(max=-1e-3)
    batch = Batch(trainer_logprobs=(mu + 0.05 * torch.randn(B, T, generator=g, dtype=torch.float64))
                  .requires_grad_(True), inference_logprobs=mu, advantages=torch.randn(B, generator=g,
                  dtype=torch.float64), loss_mask=mask, topk_ids=torch.arange(K).expand(B, T, K),
                  topk_inference_logprobs=log_q, topk_trainer_logprobs=log_p,
                  topk_support=torch.ones(B, T, K, dtype=torch.bool))
    out = run(key, batch)
    assert out.weights.shape == (B, T) and not out.weights.requires_grad
    assert out.masks["kept"].shape == (B, T) and not (out.masks["kept"] & ~mask).any()
    for name in ("mismatch_kl", "is_masked", "masked_mismatch_kl", "unmasked_mismatch_kl"):
        assert math.isfinite(float(out.metrics[name])), name
    out.loss.backward()
    assert torch.isfinite(batch.trainer_logprobs.grad).all()


def test_a_preset_runs_like_its_composition_and_cfg_overrides_its_knobs():
    batch = batch_of([[0.1, 0.2], [-0.3]], [1.0, -1.0])
    comp = PRESETS["trl/token_truncate"].compose()
    torch.testing.assert_close(run("trl/token_truncate", batch).weights, run(comp, batch).weights)
    cfg = PRESETS["trl/token_truncate"].config.replace(vllm_importance_sampling_clip_max=1.15)
    w = run("trl/token_truncate", batch, cfg).weights  # min(rho, 1.15): e^0.1 = 1.105 stays, e^0.2 = 1.221 -> 1.15
    torch.testing.assert_close(w[0], torch.tensor([math.exp(0.1), 1.15], dtype=torch.float64))
    with pytest.raises(ValueError, match="SeqTISConfig|TRLConfig"):
        run("trl/token_truncate", batch, ESTIMATORS["seq_tis"].config())
    many = run_many(["trl/sequence_mask", "seq_tis", "verl/disabled"], batch)
    assert set(many) == {"trl/sequence_mask", "seq_tis", "verl/disabled"}


def test_prime_rl_seed_presets_are_the_registry_estimators():
    for name in ("seq_tis", "seq_mis", "geo_mask", "mis_po"):
        p = PRESETS[f"prime-rl/{name}"]
        assert p.estimator is ESTIMATORS[name] and p.config == ESTIMATORS[name].config()


def test_invalid_framework_settings_are_refused_naming_the_knob():
    with pytest.raises(ValueError, match="rollout_rs_threshold"):
        PRESETS["verl/decoupled_geo_rs"].config.replace(rollout_rs_threshold=None)
    with pytest.raises(ValueError, match="vllm_importance_sampling_clip_min"):
        PRESETS["trl/token_mask"].config.replace(vllm_importance_sampling_clip_min=4.0)
    with pytest.raises(ValueError, match="truncated_importance_sampling_ratio_min"):
        PRESETS["nemo-rl/icepop"].config.replace(truncated_importance_sampling_ratio_min=None)
    with pytest.raises(ValueError, match="tis_batch_normalize"):
        PRESETS["slime/mis"].config.replace(tis_level="geometric")
    with pytest.raises(ValueError, match="clamp"):
        PRESETS["areal/sequence_truncate"].config.replace(agg="max")


# ---------------------------------------------------------------------------------------------------------
# verl (rollout_corr_helper.py): the +-20 clamp and k1 on -l


def test_verl_geo_rs_is_a_band_on_minus_s_over_t():
    # k1 = -S/T kept in [log 0.999, log 1.001] = [-0.0010005, 0.0009995]:
    #   geo 1.0010005: -S/T = -0.00099950 >= -0.0010005 -> kept (the docs' [0.999, 1.001] would drop it)
    #   geo 0.9990005: -S/T = +0.00100000 >  0.0009995  -> dropped (the docs' band would keep it)
    a, b = math.log(1.0010005), math.log(0.9990005)
    check("verl/decoupled_geo_rs", [[a, a], [b, b, b]], [1.0, 1.0], [[1.0, 1.0], [0.0] * 3],
          [[True, True], [False] * 3])


def test_verl_k1_string_0p5_1p5_keeps_rho_in_two_thirds_to_two():
    # seq_sum_k1 "0.5_1.5": log 0.5 <= -S <= log 1.5  <=>  exp(S) in [1/1.5, 2] = [0.667, 2]
    cfg = PRESETS["verl/decoupled_seq_is_rs"].config.replace(rollout_rs_threshold=1.5, rollout_rs_threshold_lower=0.5)
    rows = [[math.log(1.9)], [math.log(0.6)], [math.log(0.7)]]  # 1.9 kept (weight min(1.9, 2)); 0.6 < 0.667 dropped
    check("verl/decoupled_seq_is_rs", rows, [1.0] * 3, [[1.9], [0.0], [0.7]], [[True], [False], [True]], cfg)


def test_verl_sequence_weight_clamps_the_summed_log_ratio_at_20():
    # S = 25 (raw sum): exp(clamp(25, -20, 20)) = e^20, then min(e^20, 1e12) = e^20 = 4.85e8 (not e^25)
    cfg = PRESETS["verl/decoupled_seq_is"].config.replace(rollout_is_threshold=1e12)
    check("verl/decoupled_seq_is", [[12.0, 13.0]], [1.0], [[math.exp(20)] * 2], [[True, True]], cfg)


def test_verl_bypass_ppo_clip_keeps_the_unclipped_side_only():
    # r = pi/mu; A > 0 keeps r <= 1.2 (1.3 dropped, 0.5 kept: weight 0.5); A < 0 keeps 0.8 <= r <= 3
    # (0.7 dropped, 3.5 dropped by the dual clip, 2.0 kept: weight 2)
    rows = [[math.log(1.3), math.log(0.5)], [math.log(0.7), math.log(3.5), math.log(2.0)]]
    check("verl/bypass_ppo_clip", rows, [1.0, -1.0], [[0.0, 0.5], [0.0, 0.0, 2.0]],
          [[False, True], [False, False, True]])


# ---------------------------------------------------------------------------------------------------------
# TRL (grpo_trainer.py)


def test_trl_sequence_mask_is_one_sided_at_three():
    # exp(S) masked outside [-inf, 3]: 2.9 kept, 3.1 zeroed, 0.01 kept (clip_min None: no lower side)
    rows = [[math.log(2.9)], [math.log(3.1)], [math.log(0.1), math.log(0.1)]]
    check("trl/sequence_mask", rows, [1.0] * 3, [[2.9], [0.0], [0.01, 0.01]], [[True], [False], [True, True]])


def test_trl_opsm_drops_negative_advantage_rollouts_far_from_the_sampler():
    # l = -0.6 on both tokens: mean(-l) = 0.6 > 0.5; exp(S) = e^-1.2 = 0.301 <= 3 (sequence_mask keeps it)
    # A = +1 keeps it (A >= 0), A = -1 drops it; A = -1 with l = -0.4 (mean 0.4 <= 0.5) keeps it: e^-0.8
    rows = [[-0.6, -0.6], [-0.6, -0.6], [-0.4, -0.4]]
    w = math.exp(-1.2)
    check("trl/opsm", rows, [1.0, -1.0, -1.0], [[w, w], [0.0, 0.0], [math.exp(-0.8)] * 2],
          [[True, True], [False, False], [True, True]])


# ---------------------------------------------------------------------------------------------------------
# NeMo-RL (loss_functions.py)


def test_nemo_rl_seq_mask_tis_keeps_raw_token_ratios_inside_the_geometric_band():
    # rollout 1: S/T = (0.001 - 0.0005)/2 = 0.00025, exp = 1.00025 in [0.999, 1.002]: weights e^0.001, e^-0.0005
    # rollout 2: S/T = 0.005, exp = 1.005 > 1.002: dropped
    check("nemo-rl/seq-mask-tis", [[0.001, -0.0005], [0.01, 0.0]], [1.0, 1.0],
          [[math.exp(0.001), math.exp(-0.0005)], [0.0, 0.0]], [[True, True], [False, False]])


def test_nemo_rl_tis_clamps_at_two():
    check("nemo-rl/tis", [[math.log(3.0), math.log(0.3)]], [1.0], [[2.0, 0.3]], [[True, True]])


# ---------------------------------------------------------------------------------------------------------
# prime-rl (loss.py)


def test_prime_rl_dppo_masks_by_probability_difference_on_the_advantage_side_and_adds_kl():
    # mu = 0.5. pi = 0.75 (pd = +0.25, rho = 1.5): A > 0 -> pd > 0.2 dropped; A < 0 -> low test (pd < -0.2?) no,
    # kept, weight 1.5. pi = 0.25 (pd = -0.25, rho = 0.5): A < 0 dropped; A = 0 takes the low test: dropped;
    # A > 0 kept, weight 0.5.
    up, down = math.log(1.5), math.log(0.5)
    rows = [[up], [up], [down], [down], [down]]
    out = check("prime-rl/dppo", rows, [1.0, -1.0, -1.0, 0.0, 1.0], [[0.0], [1.5], [0.0], [0.0], [0.5]],
                [[False], [True], [False], [False], [True]])
    # the gradient: -w A / N + 2 kl_tau l / N on every loss token, N = 5
    b = batch_of(rows, [1.0, -1.0, -1.0, 0.0, 1.0])
    run("prime-rl/dppo", b).loss.backward()
    A = torch.tensor([1.0, -1.0, -1.0, 0.0, 1.0], dtype=torch.float64)
    l = torch.tensor([up, up, down, down, down], dtype=torch.float64)
    w = torch.tensor([0.0, 1.5, 0.0, 0.0, 0.5], dtype=torch.float64)
    torch.testing.assert_close(b.trainer_logprobs.grad[:, 0], (-w * A + 2e-3 * l) / 5)
    assert float(out.metrics["is_masked"]) == pytest.approx(3 / 5)


def test_prime_rl_ipo_of_august_2026_drops_tokens_whose_probability_moved_more_than_a_tenth():
    # mu = 0.5: pi = 0.58 (pd 0.08, kept, rho 1.16), pi = 0.62 (pd 0.12, dropped), pi = 0.45 (pd -0.05, rho 0.9)
    rows = [[math.log(1.16), math.log(1.24), math.log(0.9)]]
    check("prime-rl/ipo_2026_08", rows, [1.0], [[1.16, 0.0, 0.9]], [[True, False, True]])


def test_prime_rl_default_is_ipo_at_three_tenths_without_kl():
    # mu = 0.5 (loss.py ipo_loss_fn: |exp(trainer) - exp(inference)| > eps drops): pi = 0.75 (pd 0.25, kept, rho 1.5),
    # pi = 0.85 (pd 0.35, dropped), pi = 0.1 (pd -0.4, dropped), pi = 0.25 (pd -0.25, kept, rho 0.5); kl_tau 0 (#3586):
    # the gradient is -w A / N and nothing else
    rows = [[math.log(1.5), math.log(1.7), math.log(0.2), math.log(0.5)]]
    for key in ("prime-rl/default", "prime-rl/ipo"):
        out = check(key, rows, [2.0], [[1.5, 0.0, 0.0, 0.5]], [[True, False, False, True]])
        assert float(out.metrics["is_masked"]) == pytest.approx(0.5)
    b = batch_of(rows, [2.0])
    run("prime-rl/default", b).loss.backward()
    torch.testing.assert_close(b.trainer_logprobs.grad[0], -2.0 * torch.tensor([1.5, 0.0, 0.0, 0.5],
                                                                                dtype=torch.float64) / 4)


def test_prime_rl_icepop_keeps_the_inclusive_ratio_band_a_fifth_to_five():
    # loss.py IcePopLoss (#3526): log(0.2) <= l <= log(5) kept with weight rho; no KL term
    rows = [[math.log(0.2), math.log(5.0), math.log(0.19), math.log(5.1), 0.3]]
    check("prime-rl/icepop", rows, [1.0], [[0.2, 5.0, 0.0, 0.0, math.exp(0.3)]], [[True, True, False, False, True]])


def test_prime_rl_earlier_defaults():
    # v0.5.0 (March 2026): pd outside [-0.2, 0.2] dropped whatever A's sign, plus 1e-3 * l^2 (a penalty)
    rows = [[math.log(1.5)], [math.log(1.3)]]  # mu = 0.5: pi = 0.75 (pd 0.25, dropped), 0.65 (pd 0.15, kept)
    check("prime-rl/ipo_2026_03", rows, [-1.0, -1.0], [[0.0], [1.3]], [[False], [True]])
    assert PRESETS["prime-rl/ipo_2026_03"].compose().penalty.coef == 1e-3
    # v0.2 - v0.4: token band [0.125, 8], geometric band [0.1, 10], any token ratio above 100 drops the rollout
    rows = [[math.log(9.0), 0.0], [math.log(150.0), -math.log(150.0), 0.0], [math.log(0.05)] * 2, [0.5, 0.0]]
    check("prime-rl/masked_is_2025_12", rows, [1.0] * 4,
          [[0.0, 1.0], [0.0, 0.0, 0.0], [0.0, 0.0], [math.exp(0.5), 1.0]],
          [[False, True], [False, False, False], [False, False], [True, True]])


# ---------------------------------------------------------------------------------------------------------
# slime (loss.py, ppo_utils.py, the MIS example)


def test_slime_mis_truncates_normalises_over_every_loss_token_rejects_and_vetoes():
    # rollout 1: rho = 1.5, 3, 0.4 -> truncated at 2: 1.5, 2, 0.4; RS band [0.5, 2] keeps the first only
    # rollout 2: rho = 1, 5e-5 -> truncated 1, 5e-5; 5e-5 < 1e-4 vetoes the whole rollout
    # batch mean over all 5 loss tokens of the truncated weights: (1.5 + 2 + 0.4 + 1 + 5e-5) / 5 = 0.98001
    rows = [[math.log(1.5), math.log(3.0), math.log(0.4)], [0.0, math.log(5e-5)]]
    mean = (1.5 + 2 + 0.4 + 1 + 5e-5) / 5
    check("slime/mis", rows, [1.0, 1.0], [[1.5 / mean, 0.0, 0.0], [0.0, 0.0]], [[True, False, False], [False, False]])


def test_slime_opsm_drops_negative_advantage_rollouts_past_delta_and_clips_the_ppo_ratio():
    # rollout 1, A > 0: r = 1.3 > 1.2 clipped (dropped), r = 0.9 kept (weight 0.9)
    # rollout 2, A < 0: mean(-l) = -(log 1.1 + log 1.0)/2 = -0.048 <= 1e-4 kept; r = 1.1 >= 0.8: weight 1.1, 1.0
    # rollout 3, A < 0: mean(-l) = (0.10536 + 0.0010005) / 2 = 0.0532 > 1e-4: dropped
    rows = [[math.log(1.3), math.log(0.9)], [math.log(1.1), 0.0], [math.log(0.9), math.log(0.999)]]
    check("slime/opsm", rows, [1.0, -1.0, -1.0], [[0.0, 0.9], [1.1, 1.0], [0.0, 0.0]],
          [[False, True], [True, True], [False, False]])


def test_slime_tis_and_icepop():
    rows = [[math.log(3.0), math.log(0.3)]]
    check("slime/tis", rows, [1.0], [[2.0, 0.3]], [[True, True]])  # clamp(rho, 0, 2)
    check("slime/icepop", rows, [1.0], [[0.0, 0.3]], [[False, True]])  # rho * 1[0 <= rho <= 2]


# ---------------------------------------------------------------------------------------------------------
# SkyRL, AReaL, OpenRLHF


def test_skyrl_outlier_mask_drops_a_rollout_with_any_token_ratio_above_100():
    check("skyrl/outlier_token_mask", [[math.log(200.0), 0.0], [math.log(50.0), math.log(2e-4)]], [1.0, 1.0],
          [[0.0, 0.0], [1.0, 1.0]], [[False, False], [True, True]])


def test_skyrl_sequence_tis_caps_the_product_at_five():
    check("skyrl/sequence_tis", [[math.log(2.0), math.log(3.0)], [math.log(2.0)]], [1.0, 1.0],
          [[5.0, 5.0], [2.0]], [[True, True], [True]])  # min(6, 5) = 5; min(2, 5) = 2


def test_areal_sequence_mask_weighs_every_token_by_the_geometric_mean():
    # geo = sqrt(2 * 8) = 4 <= 5: both tokens weigh 4; geo = 6 > 5: dropped
    check("areal/sequence_mask", [[math.log(2.0), math.log(8.0)], [math.log(6.0), math.log(6.0)]], [1.0, 1.0],
          [[4.0, 4.0], [0.0, 0.0]], [[True, True], [False, False]])


def test_openrlhf_tis_clamps_both_sides():
    check("openrlhf/tis", [[math.log(0.1), math.log(7.0), 0.0]], [1.0], [[0.5, 5.0, 1.0]], [[True] * 3])


def test_openrlhf_seq_mask_tis_keeps_raw_ratios():
    # geo = sqrt(6 * 0.5) = 1.73 in [0.5, 5]: raw 6 and 0.5 (not clamped at 5 as the code comment says)
    check("openrlhf/seq-mask-tis", [[math.log(6.0), math.log(0.5)]], [1.0], [[6.0, 0.5]], [[True, True]])


# ---------------------------------------------------------------------------------------------------------
# the third wave's keys (each also against its framework's code where a wheel has it: test_presets_frameworks.py)


def test_nemo_rl_sequence_level_weights_clamp_or_band_the_product():
    # loss_functions.py (sequence_level_importance_ratios): w_j = exp(sum_t l_t) on every token, then tis clamps
    # it to [0, 2] and icepop keeps it only inside [0.5, 5]
    rows = [[math.log(1.5), math.log(2.0)], [math.log(0.5)], [math.log(2.0), math.log(0.2)], [math.log(1.5)]]
    check("nemo-rl/seq-tis", rows, [1.0] * 4, [[2.0, 2.0], [0.5], [0.4, 0.4], [1.5]], [[True] * 2, [True]] * 2)
    check("nemo-rl/seq-icepop", rows, [1.0] * 4, [[3.0, 3.0], [0.5], [0.0, 0.0], [1.5]],
          [[True] * 2, [True], [False] * 2, [True]])  # 0.4 is outside [0.5, 5]; 0.5 on the edge is kept


def test_skyrl_cispo_on_the_rollout_clamps_every_tokens_ratio_into_zero_to_five():
    # ppo_utils.py compute_policy_loss_cispo (cispo_anchor rollout): clamp(exp(clamp(l, +-20)), 1 - 1.0, 1 + 4.0)
    rows = [[math.log(7.0), math.log(0.01), 25.0, 0.2]]
    check("skyrl/cispo_rollout", rows, [1.0], [[5.0, 0.01, 5.0, math.exp(0.2)]], [[True] * 4])


def test_skyrl_dppo_drops_the_probability_jumps_on_the_advantages_side_and_tokens_beyond_20():
    # ppo_utils.py dppo_policy_loss, mu = 0.5: pi = 0.75 (pd 0.25) dropped when A > 0, kept (weight 1.5) when A < 0;
    # pi = 0.25 (pd -0.25) dropped when A < 0; a token with l = -25 keeps pd in the band but its ratio's clamp has
    # no gradient: dropped
    up, down = math.log(1.5), math.log(0.5)
    check("skyrl/dppo_tv", [[up, down], [up, down, -25.0]], [1.0, -1.0], [[0.0, 0.5], [1.5, 0.0, 0.0]],
          [[False, True], [True, False, False]])


def test_openrlhf_gspo_clips_the_geometric_ratio_on_the_advantages_side():
    # loss.py PolicyLoss (policy_loss_type gspo, correction on): r_j = exp(mean l) against the rollout; A > 0 keeps
    # r <= 1.2, A < 0 keeps r >= 0.8; the weight is r_j on every token
    g13, g11, g07 = math.log(1.3), math.log(1.1), math.log(0.7)
    rows = [[g13, g13], [g11, g11], [g07], [g13, g13]]
    check("openrlhf/gspo-is", rows, [1.0, 1.0, -1.0, -1.0], [[0.0, 0.0], [1.1, 1.1], [0.0], [1.3, 1.3]],
          [[False, False], [True, True], [False], [True, True]])


def test_miles_opsm_drops_tokens_beyond_20_where_slime_keeps_them():
    # Miles math_utils.py compute_policy_loss (#1363): exp(clamp(l, +-20)), no gradient beyond; slime's
    # compute_policy_loss has no clamp. A < 0 keeps r >= 0.8, so a token at l = 21 keeps weight e^21 in slime
    rows = [[21.0, 0.0]]  # mean(-l) = -10.5 <= 1e-4: OPSM keeps the rollout
    check("slime/opsm", rows, [-1.0], [[math.exp(21.0), 1.0]], [[True, True]])
    check("miles/opsm", rows, [-1.0], [[0.0, 1.0]], [[False, True]])
    for name in ("tis", "icepop", "mis"):  # the other three are slime's own compositions
        assert PRESETS[f"miles/{name}"].estimator is PRESETS[f"slime/{name}"].estimator


def test_areal_icepop_keeps_the_inclusive_band_and_the_decoupled_loss_alone_weighs_one():
    rows = [[math.log(0.5), math.log(5.0), math.log(0.49), math.log(5.1)]]
    check("areal/icepop", rows, [1.0], [[0.5, 5.0, 0.0, 0.0]], [[True, True, False, False]])
    cfg = PRESETS["areal/default"].config.replace(use_decoupled_loss=True)  # no rejection_sampling: weight 1
    check("areal/default", rows, [1.0], [[1.0] * 4], [[True] * 4], cfg)


# ---------------------------------------------------------------------------------------------------------
# the keys that need the later parts (strict edges, binary KLs, e^|l|, M2PO, VESPO, the clamp order)


def test_skyrl_rollout_is_drops_the_open_bands_edges():
    # ppo_utils.py rollout_is_policy_loss: in_range = (ratio > 1 - 0.2) & (ratio < 1 + 0.2): 0.8 itself is out
    # (an inclusive band would keep it), so is anything past 1.2
    rows = [[math.log(0.8), math.log(0.81), math.log(1.19), math.log(1.2) + 1e-9]]
    check("skyrl/rollout_is", rows, [1.0], [[0.0, 0.81, 1.19, 0.0]], [[False, True, True, False]])


def test_skyrl_dppo_kl_drops_only_on_the_side_the_probability_moved():
    # ppo_utils.py dppo_policy_loss (binary_kl), mu = 0.5: pi = 0.95 moved up, KL(mu || pi) = 0.5 log(0.5 / 0.95)
    # + 0.5 log(0.5 / 0.05) = 0.83 > 0.2: dropped when A > 0, kept (weight 1.9) when A < 0
    up = math.log(1.9)
    check("skyrl/dppo_kl", [[up], [up]], [1.0, -1.0], [[0.0], [1.9]], [[False], [True]])


def test_areal_kpop_bounds_the_larger_binary_kl_by_two():
    # functional.py compute_binary_kl_divergence, mu = 0.5: pi = 0.999 -> KL_B(pi || mu) = 0.999 log(1.998)
    # + 0.001 log(0.002) = 0.685, KL_B(mu || pi) = 0.5 log(0.5 / 0.999) + 0.5 log(0.5 / 0.001) = 2.76 > 2: dropped;
    # pi = 0.9: 0.368 and 0.511, both <= 2: kept with weight 1.8
    check("areal/kpop", [[math.log(1.998), math.log(1.8)]], [1.0], [[0.0, 1.8]], [[False, True]])


def test_areal_m2po_drops_the_largest_squares_and_divides_by_the_survivors():
    # actor.py _get_m2po_loss_mask: l^2 = 1, 0.01, 0.01, 0.09, 0: dropping the 1 leaves mean 0.0275 < 0.04; the
    # four survivors keep rho (all <= 5) and the loss divides by 4, so under token-mean (N = 5) they weigh 5/4 more
    l = [1.0, 0.1, -0.1, 0.3, 0.0]
    w = [0.0] + [math.exp(x) * 5 / 4 for x in l[1:]]
    check("areal/m2po", [l], [1.0], [w], [[False, True, True, True, True]])


def test_nemo_rl_seq_logprob_error_drops_the_rollout_and_its_tokens_from_the_count():
    # grpo.py compute_and_apply_seq_logprob_error_masking: mean e^|l| = (e^1.2 + e^0.6) / 2 = 2.57 > 2: the rollout
    # leaves sample_mask, so the loss divides by the other rollout's 2 tokens, not 4: its weights (TIS at 5) double
    rows = [[1.2, -0.6], [0.1, -0.2]]
    check("nemo-rl/seq-logprob-error", rows, [1.0, 1.0], [[0.0, 0.0], [2 * math.exp(0.1), 2 * math.exp(-0.2)]],
          [[False, False], [True, True]])


def test_trl_vespo_weighs_every_token_by_phi_of_the_truncated_product():
    # grpo_trainer.py get_gamma_weights: W = min(e^0.5, 3) * min(e^1.5, 3) = e^0.5 * 3; A >= 0: phi = e^3 W^2
    # e^(-3 W); A < 0: (k, lambda) = (3, 2)
    W = math.exp(0.5) * 3.0
    pos, neg = math.exp(3 + 2 * math.log(W) - 3 * W), math.exp(2 + 3 * math.log(W) - 2 * W)
    check("trl/vespo", [[0.5, 1.5], [0.5, 1.5]], [1.0, -1.0], [[pos, pos], [neg, neg]], [[True] * 2] * 2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_prime_rl_decides_a_band_edge_by_its_own_arithmetic(dtype):
    # prime-rl's IPO of #3586 (loss.py ipo_loss_fn) drops token t when |exp(trainer) - exp(inference)| > eps (0.3).
    # Tokens whose probability difference lies within a few ulps of 0.3: every keep decision is the one that
    # arithmetic takes, in the log-probs' dtype (it was exp(logp) - exp(logp - l) before, which rounds differently).
    # Today's IPO takes |p - q| through expm1: test_prime_rl_losses.py (a strict xfail there)
    g = torch.Generator().manual_seed(0)
    mu = torch.rand(4096, generator=g, dtype=torch.float64) * 0.6 + 0.05
    pi = (mu + 0.3 * torch.sign(torch.rand(4096, generator=g, dtype=torch.float64) - 0.5)).clamp(1e-6, 1)
    il = mu.log().to(dtype)
    tl = (pi.log() + torch.randn(4096, generator=g, dtype=torch.float64) * 1e-7).to(dtype)
    batch = Batch(tl[:, None].contiguous(), il[:, None].contiguous(), torch.ones(4096, dtype=dtype))
    want = ((torch.exp(tl) - torch.exp(il)).abs() <= 0.3)[:, None]
    assert 100 < int(want.sum()) < 4000, "both sides of the edge are drawn"
    for out in (run("prime-rl/ipo_2026_09", batch), evaluate(resolve("prime-rl/ipo_2026_09"), batch)):
        assert out.masks["kept"].equal(want)


def test_the_custom_builder_sets_the_edge_space_and_the_weights_clamp_order():
    cfg = PRESETS["custom/composition"].config.replace(
        weight_level="geometric", weight_band_low=0.5, weight_band_high=2.0, weight_band_space="ratio",
        rule1_edge_space="ratio", log_ratio_clamp=20.0, weight_clamp_order="token")
    comp = PRESETS["custom/composition"].compose(cfg)
    assert comp.weight.edge_space == "ratio" and comp.criteria[0].edge_space == "ratio"
    assert comp.weight_clamp_order == "token"
    assert "exp(x) compared with the edges" in comp.describe() and "each token's before" in comp.describe()
    with pytest.raises(ValueError, match="Criterion.edge_space 'ratio' takes the ratio statistic"):
        cfg.replace(rule1_statistic="k1", rule1_low=None, rule1_high=0.5)
    with pytest.raises(ValueError, match="Weight.edge_space 'ratio' takes a band"):
        cfg.replace(weight_band_low=None, weight_band_high=None)
