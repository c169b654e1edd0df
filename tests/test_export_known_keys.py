"""Every key an exporter writes is one its framework reads (issue 43, item 2; issue 42, item 2's last sentence).

KNOWN lists, per framework, the keys (flags, config paths, side-file keys) the exporters may write, each list
transcribed from the framework's own parser or config class at the commit its presets cite (the citation beside the
list). Every export of every registry estimator and preset to every framework is read back (the readers of
tests/test_export_own_framework.py) and each key it writes must be in its framework's list: a made-up or misspelt
key fails here. A list index in a config path ("filters.0.agg_type") is matched as "filters.*.agg_type".

slime's MIS example fills its rejection band from the TIS bounds when the band is unset (mis.py, below): the band
it would run is computed from the exported YAML the way slime computes it and compared with the composition's.
"""

from __future__ import annotations

import math
import re

import pytest
from test_export_own_framework import read_back

from seqis import ESTIMATORS, PRESETS
from seqis.core.compose import SAFETY_BOUND, Composition, Criterion, Weight
from seqis.export import EXPORTERS, export
from seqis.registry import resolve

_SLIME_MIS = ("mis.yaml:use_tis", "mis.yaml:use_rs", "mis.yaml:tis_level", "mis.yaml:rs_level", "mis.yaml:tis_mode",
              "mis.yaml:tis_lower_bound", "mis.yaml:tis_upper_bound", "mis.yaml:rs_lower_bound",
              "mis.yaml:rs_upper_bound", "mis.yaml:rs_veto_threshold", "mis.yaml:tis_batch_normalize")
_SLIME_FLAGS = ("--use-tis", "--tis-clip", "--tis-clip-low", "--custom-tis-function-path", "--custom-config-path",
                "--use-rollout-logprobs", "--use-opsm", "--opsm-delta", "--eps-clip", "--eps-clip-high", "--eps-clip-c")

# framework -> (where the keys were read, the keys)
KNOWN: dict[str, tuple[str, frozenset[str]]] = {
    "slime": ("THUDM/slime@624b824: slime/utils/arguments.py (add_argument); "
              "examples/train_infer_mismatch_helper/mis.yaml (the MIS example's keys)",
              frozenset(_SLIME_FLAGS + _SLIME_MIS)),
    "miles": ("radixark/miles@31f1ca9: miles/utils/arguments.py (slime's flags, --rollout-top-p / -top-k / "
              "-temperature, --use-miles-router), examples/infra_features/train_infer_mismatch_helper/mis.yaml; "
              "#3317's design at nanjiangwill/miles@52a21b0: miles/utils/arguments.py (add_algo_arguments: "
              "--use-score-centering, --score-centering-head-size)",
              frozenset(_SLIME_FLAGS + _SLIME_MIS + ("--rollout-top-p", "--rollout-top-k", "--rollout-temperature",
                                                     "--use-miles-router", "--use-score-centering",
                                                     "--score-centering-head-size"))),
    "openrlhf": ("OpenRLHF/OpenRLHF@0.11.2 (the pip wheel): openrlhf/cli/train_ppo_ray.py (add_argument)",
                 frozenset({"--algo.advantage.is_correction_level", "--algo.advantage.is_correction_mode",
                            "--algo.advantage.is_correction_gating", "--algo.advantage.is_correction_threshold",
                            "--actor.policy_loss_type", "--actor.loss_agg_mode", "--actor.eps_clip_low_high",
                            "--actor.dual_clip"})),
    "areal": ("areal-project/AReaL@cbff54d: areal/api/cli_args.py (PPOActorConfig, RejectionSamplingConfig)",
              frozenset({f"actor.{k}" for k in ("c_clip", "eps_clip", "eps_clip_higher", "m2_threshold",
                                                "recompute_logprob", "use_decoupled_loss", "rejection_sampling")}
                        | {f"actor.rejection_sampling.{k}" for k in ("level", "action", "metric", "agg", "upper",
                                                                     "lower")})),
    "skyrl": ("NovaSky-AI/SkyRL@a956457: skyrl/train/config/config.py (AlgorithmConfig, OffPolicyCorrectionConfig, "
              "CISPOConfig, DPPOConfig, SamplingParams); score_centering_topk: #2244 (open), its tests configure "
              "trainer.algorithm.score_centering_topk (the search index's copy 69204233923)",
              frozenset({"generator.sampling_params.logprobs", "trainer.algorithm.policy_loss_type",
                         "trainer.algorithm.eps_clip_low", "trainer.algorithm.eps_clip_high",
                         "trainer.algorithm.score_centering_topk"}
                        | {f"trainer.algorithm.cispo.{k}" for k in ("cispo_anchor", "cispo_eps_clip_low",
                                                                    "cispo_eps_clip_high")}
                        | {f"trainer.algorithm.dppo.{k}" for k in ("dppo_type", "delta_low", "delta_high")}
                        | {f"trainer.algorithm.off_policy_correction.{k}" for k in (
                            "tis_ratio_type", "token_tis_ratio_clip_high", "sequence_tis_ratio_clip_high",
                            "sequence_mask_metric", "geo_mask_low", "geo_mask_high", "product_mask_low",
                            "product_mask_high", "outlier_token_is_threshold_low", "outlier_token_is_threshold_high",
                            "token_mask_is_threshold_low", "token_mask_is_threshold_high")})),
    "nemo-rl": ("NVIDIA-NeMo/RL@7ea279a: nemo_rl/algorithms/loss/loss_functions.py (ClippedPGLossConfig), "
                "nemo_rl/algorithms/grpo.py (GRPOConfig.seq_logprob_error_threshold); loss_fn.score_centering: "
                "nightly, from its API page (the code is not in the search index)",
                frozenset({"grpo.seq_logprob_error_threshold"}
                          | {f"loss_fn.{k}" for k in ("use_importance_sampling_correction",
                                                      "truncated_importance_sampling_type",
                                                      "truncated_importance_sampling_ratio",
                                                      "truncated_importance_sampling_ratio_min",
                                                      "sequence_level_importance_ratios", "token_level_loss",
                                                      "score_centering")})),
    "roll": ("alibaba/ROLL@8eb27cc2: roll/configs/base_config.py (train_infer_correction: is_weight, filters)",
             frozenset({f"train_infer_correction.is_weight.{k}" for k in ("enabled", "weight_type", "upper_bound",
                                                                          "detach")}
                       | {f"train_infer_correction.filters.*.{k}" for k in (
                           "enabled", "agg_type", "ratio_enabled", "ratio_low", "ratio_high", "diff_enabled",
                           "diff_low", "diff_high")})),
    "prime-rl": ("PrimeIntellect-ai/prime-rl@559b447: packages/prime-rl-configs/src/prime_rl/configs/trainer.py "
                 "(loss configs: type, adv_tau, kl_tau, eps, dppo_mask_low/high; model.fused_lm_head_token_chunk_"
                 "size), configs/inference.py (VllmConfig, extra='allow': vLLM's max_logprobs and logprobs_mode); "
                 "@02bdca2: src/prime_rl/configs/trainer.py (ipo_mask_low/high); the newer loss.py / configs copies "
                 "in the search index "
                 "(max_importance_ratio, ratio_low/high, score_centering: 70316872618; score_centering_top_k: its "
                 "docs page 70285517586)",
                 frozenset({"loss.adv_tau", "loss.kl_tau", "loss.ipo_mask_low", "loss.ipo_mask_high",
                            "inference.vllm.max_logprobs", "inference.vllm.logprobs_mode",
                            "orchestrator.train.sampling.score_centering_top_k",
                            "trainer.model.fused_lm_head_token_chunk_size"}
                           | {f"trainer.loss.{k}" for k in ("type", "adv_tau", "kl_tau", "eps", "dppo_mask_low",
                                                            "dppo_mask_high", "max_importance_ratio", "ratio_low",
                                                            "ratio_high", "score_centering")})),
    "prime-rl-legacy": ("PrimeIntellect-ai/prime-rl@v0.4.0: src/prime_rl/trainer/rl/config.py (the loss config)",
                        frozenset({f"loss.{k}" for k in ("adv_tau", "kl_tau", "ratio_type", "token_mask_low",
                                                         "token_mask_high", "sequence_mask_low",
                                                         "sequence_mask_high", "sequence_clip_high", "geo_mask_low",
                                                         "geo_mask_high")})),
    "trl": ("huggingface/trl@1.16.0 (the pip wheel): trl/trainer/grpo_config.py (GRPOConfig)",
            frozenset({"loss_type", "off_policy_mask_threshold", "vespo_k_pos", "vespo_k_neg", "vespo_lambda_pos",
                       "vespo_lambda_neg", "vllm_importance_sampling_correction", "vllm_importance_sampling_mode",
                       "vllm_importance_sampling_clip_min", "vllm_importance_sampling_clip_max"})),
    "open-instruct": ("allenai/open-instruct@e6c3044a: open_instruct/grpo_utils.py (the rho-correction config fields)",
                      frozenset({"--use_rho_correction", "--rho_clamp_lower_bound", "--rho_clamp_upper_bound",
                                 "--rho_mask_lower_bound", "--rho_mask_upper_bound", "--rho_mask_sequence_level",
                                 "--rho_mask_tv_divergence"})),
    "ms-swift": ("modelscope/ms-swift@3602360a: swift/arguments/rlhf_args.py (rlhf_type), "
                 "swift/rlhf_trainers/args_mixin.py (rollout_importance_sampling_mode, _threshold)",
                 frozenset({"--rlhf_type", "--rollout_importance_sampling_mode",
                            "--rollout_importance_sampling_threshold"})),
    "tunix": ("google/tunix@c7d8950f: tunix/rl/grpo/grpo_learner.py (GRPOConfig)",
              frozenset({"sampler_is", "sampler_is_threshold"})),
    "tinker": ("thinking-machines-lab/tinker-cookbook@9dfcc3a2: tutorials/202_loss_functions.py "
               "(forward_backward_async's loss_fn and loss_fn_config)",
               frozenset({"loss_fn", "loss_fn_config.clip_low_threshold", "loss_fn_config.clip_high_threshold"})),
    "torchforge": ("meta-pytorch/torchforge@6e77f0b3: src/forge/losses/ (the snippet's loss_fn names a class there: "
                   "ReinforceLoss, SimpleGRPOLoss)", frozenset({"loss_fn"})),
    "art": ("OpenPipe/ART: src/art/dev/train.py (TrainConfig; the search index's copy 29288944323) and "
            "backend.train's keyword arguments",
            frozenset({"ppo", "epsilon", "epsilon_high", "importance_sampling_level",
                       "max_negative_advantage_importance_sampling_weight", "mask_prob_ratio"})),
    "verl": ("verl-project/verl@0.9.1 (the pip wheel): verl/trainer/config/_generated_ppo_trainer.yaml; score "
             "centering (#8010, read at c6236f5): algorithm.rollout_correction.score_centering, "
             "actor_rollout_ref.rollout.topk_log_probs and the actor's policy_loss.rollout_correction (its "
             "_validate_score_centering_config test: score_centering and the correction's keys, matched)",
             frozenset({f"algorithm.rollout_correction.{k}" for k in (
                 "rollout_is", "rollout_is_threshold", "rollout_is_batch_normalize", "rollout_rs",
                 "rollout_rs_threshold", "bypass_mode", "loss_type", "score_centering")}
                       | {f"actor_rollout_ref.actor.{k}" for k in ("clip_ratio", "clip_ratio_c", "clip_ratio_low",
                                                                  "clip_ratio_high", "policy_loss.loss_mode")}
                       | {f"actor_rollout_ref.actor.policy_loss.rollout_correction.{k}" for k in (
                           "score_centering", "rollout_is", "rollout_is_threshold", "bypass_mode", "loss_type")}
                       | {f"actor_rollout_ref.rollout.{k}" for k in ("calculate_log_probs", "topk_log_probs")})),
}

ALL = [*ESTIMATORS, *PRESETS]


def unknown(framework: str, keys) -> set[str]:
    """The keys its framework's list does not hold (a list index as *)."""
    return {k for k in keys if re.sub(r"\.\d+(?=\.|$)", ".*", k) not in KNOWN[framework][1]}


def test_every_exporter_has_a_list_of_its_frameworks_keys():
    assert set(KNOWN) == set(EXPORTERS), set(KNOWN) ^ set(EXPORTERS)


def test_a_made_up_key_is_caught():
    assert unknown("miles", ["--use-score-centering", "--score-centering-top-k"]) == {"--score-centering-top-k"}
    assert unknown("roll", ["train_infer_correction.filters.3.ratio_low"]) == set()
    assert unknown("nemo-rl", ["loss_fn.score_centering_head"]) == {"loss_fn.score_centering_head"}


@pytest.mark.parametrize("framework", sorted(EXPORTERS))
def test_every_key_an_exporter_writes_is_one_its_framework_reads(framework):
    bad = {}
    for x in ALL:
        snip = export(x, framework)
        if snip.expressible and (extra := unknown(framework, read_back(snip.text, snip.filename))):
            bad[x] = sorted(extra)
    assert not bad, bad


def _slime_rs_band(side: dict) -> tuple[float, float]:
    """The rejection band slime's compute_mis_weights runs (THUDM/slime@624b824,
    examples/train_infer_mismatch_helper/mis.py lines 174-176; Miles's copy at 31f1ca9 the same): an unset bound is
    the TIS bound, an unset TIS lower bound 1 / the upper."""
    tis_low = side["tis_lower_bound"] if side["tis_lower_bound"] is not None else 1.0 / side["tis_upper_bound"]
    low = side["rs_lower_bound"] if side["rs_lower_bound"] is not None else tis_low
    high = side["rs_upper_bound"] if side["rs_upper_bound"] is not None else side["tis_upper_bound"]
    return low, high


_RS_AGG = {"token": "token", "sequence": "sum", "geometric": "mean"}  # slime's rs_level -> the criterion's agg


def _mis_yaml(x: str, framework: str) -> dict | None:
    """The MIS example's YAML the export writes beside its flags, or None."""
    snip = export(x, framework)
    keys = read_back(snip.text, snip.filename) if snip.expressible else {}
    side = {k.split(":", 1)[1]: v for k, v in keys.items() if k.startswith("mis.yaml:")}
    return side or None


MIS = [(x, fw) for x in ALL for fw in ("slime", "miles") if _mis_yaml(x, fw) is not None]


_INERT = (math.exp(-20.0), math.exp(20.0))  # mis.py clamps the RS log-ratio at +-20 (SAFETY_BOUND) before exp


def _bands(comp, level: str) -> list[tuple[float, float]]:
    """The composition's ratio bands at slime's RS level, an open side as 0 / inf."""
    return [(c.low if c.low is not None else 0.0, c.high if c.high is not None else math.inf)
            for c in comp.criteria if c.statistic == "ratio" and c.agg == _RS_AGG[level] and c.advantage is None]


def _runs(x: str, framework: str) -> tuple[tuple[float, float] | None, list]:
    side = _mis_yaml(x, framework)
    return (_slime_rs_band(side) if side["use_rs"] else None), _bands(resolve(x), side["rs_level"])


@pytest.mark.parametrize("x,framework", MIS)
def test_the_rejection_band_slime_runs_is_the_compositions(x, framework):
    """slime runs [rs_lower, rs_upper] with unset bounds filled from the TIS bounds; that band must be one the
    composition has at the RS level, or reject nothing (a veto alone: the veto runs only under use_rs)."""
    band, bands = _runs(x, framework)
    if band is not None:
        inert = band[0] <= _INERT[0] and band[1] >= _INERT[1]
        assert band in bands or (inert and not bands), (x, framework, band, bands, _mis_yaml(x, framework))


def test_a_veto_alone_or_a_one_sided_band_is_not_widened_to_the_tis_bounds():
    """A rollout veto with no band, and a band with no lower edge: before the fix slime filled the missing bounds
    from the TIS bounds ([1 / 2, 2] and [1 / 2, 3]), rejections the composition never had."""
    veto = Composition(Weight("token", clip=2.0), (Criterion("ratio", "min", low=1e-4),), log_ratio_clamp=SAFETY_BOUND)
    upper = Composition(Weight("token", clip=2.0), (Criterion("ratio", "token", high=3.0),),
                        log_ratio_clamp=SAFETY_BOUND)
    for comp, want in ((veto, (0.0, math.inf)), (upper, (0.0, 3.0))):
        snip = export(comp, "slime")
        side = {k.split(":", 1)[1]: v for k, v in read_back(snip.text, snip.filename).items() if ":" in k}
        assert snip.expressible and side["use_rs"] and _slime_rs_band(side) == want, snip.text


# validate_score_centering_args (nanjiangwill/miles@52a21b0, miles/utils/arguments.py): what Miles refuses at startup
_MILES_ICEPOP = {"miles.backends.training_utils.loss_hub.corrections.icepop_function",
                 "miles.backends.training_utils.loss_hub.corrections:icepop_function"}
SC_MILES = [(x, "miles") for x in ALL if (s := export(x, "miles")).expressible and
            "--use-score-centering" in read_back(s.text, s.filename)]


@pytest.mark.parametrize("x,framework", SC_MILES)
def test_a_miles_score_centering_export_passes_miles_own_startup_checks(x, framework):
    """--use-miles-router (or an endpoint); a custom TIS function only the built-in IcePop one, with --use-tis;
    finite bounds 0 <= --tis-clip-low <= --tis-clip; without replay (top-p 1, top-k -1) temperature 1."""
    snip = export(x, framework)
    doc = read_back(snip.text, snip.filename)
    assert doc.get("--use-miles-router") is True and doc.get("--score-centering-head-size", 128) >= 1
    if "--custom-tis-function-path" in doc:
        assert doc.get("--use-tis") is True and doc["--custom-tis-function-path"] in _MILES_ICEPOP
    if doc.get("--use-tis"):
        low, high = doc.get("--tis-clip-low", 0.0), doc.get("--tis-clip", 2.0)
        assert math.isfinite(low) and math.isfinite(high) and 0 <= low <= high and high > 0
    replay = doc.get("--rollout-top-p", 1.0) < 1.0 or doc.get("--rollout-top-k", -1) > 0
    if not replay and "--rollout-top-p" in doc:
        assert (doc["--rollout-top-p"], doc["--rollout-top-k"], doc["--rollout-temperature"]) == (1.0, -1, 1.0)


# the values a few keys take, from the same parsers: argparse choices (OpenRLHF 0.11.2 wheel,
# openrlhf/cli/train_ppo_ray.py) and the MIS example's documented modes (THUDM/slime@624b824 mis.yaml, mis.py)
CHOICES = {
    "openrlhf": {"--algo.advantage.is_correction_level": {"off", "token", "seq"},
                 "--algo.advantage.is_correction_mode": {"mask", "clip"},
                 "--algo.advantage.is_correction_gating": {"ratio", "binary_kl", "tv"},
                 "--actor.policy_loss_type": {"ppo", "gspo"},
                 "--actor.loss_agg_mode": {"token-mean", "seq-mean-token-mean"}},
    "slime": {"mis.yaml:tis_level": {"token", "sequence", "geometric"},
              "mis.yaml:rs_level": {"token", "sequence", "geometric"},
              "mis.yaml:tis_mode": {"truncate", "mask", "clip"}},
}
CHOICES["miles"] = CHOICES["slime"]


@pytest.mark.parametrize("framework", sorted(CHOICES))
def test_every_choice_an_exporter_writes_is_one_its_parser_accepts(framework):
    bad = {}
    for x in ALL:
        snip = export(x, framework)
        doc = read_back(snip.text, snip.filename) if snip.expressible else {}
        # the flag reader parses a word as YAML, which reads "off" as False; argparse gets the word
        doc = {k: "off" if v is False else v for k, v in doc.items()}
        wrong = {k: v for k, v in doc.items() if k in CHOICES[framework] and v not in CHOICES[framework][k]}
        if wrong:
            bad[x] = wrong
    assert not bad, bad
