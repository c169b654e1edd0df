"""ms-swift's GRPO rollout importance sampling (rollout_importance_sampling_mode) and off-policy sequence mask.

    l_t        clamp(log pi_old - log mu, -20, 20) per token (SAFETY_BOUND), rho_t = exp(l_t)
    token_*    token_truncate: min(rho_t, C);  token_mask: rho_t where rho_t <= C, else 0
    sequence_* the "sequence" ratio is the GEOMETRIC mean g_j = exp(mean_t l_t) of the clamped token log-ratios
               (not the product TRL's sequence_* modes use); sequence_truncate: min(g_j, C) on every token;
               sequence_mask: the token ratio rho_t itself on rollouts with g_j <= C, else 0
    OPSM       keep a rollout when A >= 0 or mean_t(log mu - log pi) <= off_policy_sequence_mask_delta (raw l)

Defaults in the code: mode None (no correction), threshold C = 2.0, OPSM off. The mask modes zero the weight and
leave completion_mask (the normaliser) as it was; the default loss ("grpo") is seq-mean-token-mean, "dapo"/"bnpo"
token-mean. pi_theta / pi_old is 1 at the first minibatch, so the rollout IS weight is the correction.
Clamp order: ms-swift clamps each token's l before anything aggregates it (grpo_trainer.py:2363), so the
geometric weight is exp(mean of the clamped l) (weight_clamp_order "token": l = (+25, -20) gives g = 1, not
e^2.5) and the criteria see each token's clamped l; OPSM reads the raw l in ms-swift (the two agree while
|l| <= 20). Edges: token_mask keeps is_ratio <= C (:2374) and sequence_mask seq_ratios <= C (:2386), both on the
ratio itself (edge_space "ratio": l one ulp above log 2 has exp(l) = 2.0 and is kept). sequence_mask's g goes
through log(exp(l).clamp(min=1e-10)) first (:2339), which the composition does not repeat: a g within an ulp or
two of C can fall the other way.
Source: modelscope/ms-swift, swift/rlhf_trainers/grpo_trainer.py (_apply_rollout_importance_sampling,
_compute_sequence_level_ratios, _compute_off_policy_sequence_mask), swift/rlhf_trainers/args_mixin.py; the same
functions in swift/megatron/trainers/grpo_trainer.py. Read at 3602360a (2026-08-22) and in release 4.6.0.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.compose import SAFETY_BOUND, Composition, Criterion, Weight
from ..core.spec import Preset
from ..core.types import Config, knob
from ._preset import framework_estimator

MODES = (None, "token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


@dataclass(frozen=True)
class MsSwiftConfig(Config):
    """GRPO arguments (RLHFArguments); ms-swift's names."""

    rollout_importance_sampling_mode: str | None = knob(None, "Correction: token / sequence (geometric mean) x "
                                                        "truncate / mask; None = off.", optional=True, choices=MODES)
    rollout_importance_sampling_threshold: float = knob(2.0, "C: truncate at / mask above this.", gt=0.0,
                                                        ui=(1.0, 10.0), log=True)
    off_policy_sequence_mask_delta: float | None = knob(None, "OPSM delta: drop a rollout with A < 0 whose mean "
                                                        "log(mu/pi) exceeds it; None = off.", optional=True, gt=0.0,
                                                        ui=(0.01, 2.0), log=True)


def compose(cfg: MsSwiftConfig) -> Composition:
    c, mode = cfg.rollout_importance_sampling_threshold, cfg.rollout_importance_sampling_mode
    criteria: list[Criterion] = []
    if mode is None:
        weight = Weight("none")
    elif mode == "token_truncate":
        weight = Weight("token", clip=c)
    elif mode == "token_mask":
        weight = Weight("token", band=(0.0, c), edge_space="ratio")
    elif mode == "sequence_truncate":
        weight = Weight("geometric", clip=c)
    else:  # sequence_mask: the token ratio, on rollouts whose geometric mean is <= C
        weight = Weight("token")
        criteria.append(Criterion("ratio", "mean", high=c, edge_space="ratio"))
    if cfg.off_policy_sequence_mask_delta is not None:  # kept when A >= 0 or mean(-l) <= delta
        criteria.append(Criterion("k1", "mean", high=cfg.off_policy_sequence_mask_delta, advantage="negative"))
    return Composition(weight, tuple(criteria), log_ratio_clamp=None if mode is None else SAFETY_BOUND,
                       adv_tau=cfg.adv_tau, weight_clamp_order="token")


ESTIMATOR = framework_estimator("ms-swift", compose, MsSwiftConfig,
                                "ms-swift GRPO's rollout importance sampling and off-policy sequence mask.")
SOURCE = "modelscope/ms-swift@3602360a (4.6.0): swift/rlhf_trainers/grpo_trainer.py"
_FN = f"{SOURCE} (_apply_rollout_importance_sampling)"
_CLAMP = "l clamped to +-20 per token"

SHIPPED_MODES = (  # when the framework shipped it (Preset.versions)
    'every mode since 2025-11-26 (ms-swift #6678, release 3.11.0); OPSM since 2025-12-10 (#6978)'
)

PRESETS = [
    Preset("ms-swift/token_truncate", f"Token TIS min(rho_t, 2) ({_CLAMP}; not the default: the mode's default "
           "is None, no correction).", _FN, ESTIMATOR,
           MsSwiftConfig(rollout_importance_sampling_mode="token_truncate"), versions=SHIPPED_MODES),
    Preset("ms-swift/token_mask", f"Token MIS: rho_t where rho_t <= 2, else 0 (one-sided; {_CLAMP}; decided on "
           "exp(l_t) against 2 in the compute dtype, grpo_trainer.py:2374).", _FN,
           ESTIMATOR, MsSwiftConfig(rollout_importance_sampling_mode="token_mask"), versions=SHIPPED_MODES),
    Preset("ms-swift/sequence_truncate", "min(g, 2) on every token, g = exp(mean_t l_t) the GEOMETRIC mean (ms-swift "
           "calls it sequence) of the log-ratios each clamped at +-20 first (grpo_trainer.py:2363, :2340: l = "
           "(+25, -20) gives g = 1).", _FN, ESTIMATOR,
           MsSwiftConfig(rollout_importance_sampling_mode="sequence_truncate"), versions=SHIPPED_MODES),
    Preset("ms-swift/sequence_mask", f"The token ratio rho_t on rollouts whose geometric mean exp(mean_t l_t) is <= 2, "
           f"else 0 (the weight stays per token; {_CLAMP} before the mean; g against 2 in ratio space, :2386).",
           _FN, ESTIMATOR,
           MsSwiftConfig(rollout_importance_sampling_mode="sequence_mask"), versions=SHIPPED_MODES),
]
