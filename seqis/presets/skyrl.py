"""SkyRL's off-policy correction (trainer.algorithm.off_policy_correction, every option off by default) and its
policy losses anchored on the sampler (trainer.algorithm.policy_loss_type dppo, cispo with cispo_anchor rollout).

    ratios     exp(clamp(x, -20, 20)) of the token l_t, the rollout sum S_j or the geometric mean S_j / T_j
    outlier    drop a rollout with any token ratio below outlier_token_is_threshold_low or above _high
    token mask drop tokens whose ratio leaves [token_mask_is_threshold_low, _high] (both must be set)
    TIS        weight min(rho_t, token_tis_ratio_clip_high) or min(exp S_j, sequence_tis_ratio_clip_high)
    seq mask   drop rollouts whose geometric (exp(S/T)) or product (exp S) ratio leaves its band

    dppo       binary_tv: weight rho_t = exp(clamp(l_t, +-20)) (not detached: the clamp's gradient is 0 where
               |l_t| > 20, so such a token has no gradient); drop t if A > 0 and pd_t > delta_high, or A < 0 and
               pd_t < -delta_low, pd_t = exp(pi_t) - exp(mu_t) (0.2, 0.2)
    cispo      cispo_anchor rollout: weight clamp(exp(clamp(l_t, +-20)), 1 - cispo_eps_clip_low,
               1 + cispo_eps_clip_high), every token keeps it (1.0 and 4.0: [0, 5])

Every ratio is exp in float32 (safe_exp_delta), cast back to the log-probs' dtype, and every band compares that
ratio with its bounds (off_policy_correction_utils.py:108, :114, :176, :227, :243; ppo_utils.py:793): the criteria
decide in ratio space (edge_space "ratio"), to the bit for float32 log-probs (for float64 ones SkyRL still
exponentiates in float32, the composition in float64: an edge within float32's rounding can fall the other way).
The masks multiply loss_mask but
the token-mean normaliser was fixed from the original mask: token-mean. Clamp order (kept: clamp_order
"aggregate"): the sequence TIS weight and both sequence masks clamp the SUMMED (or mean) raw log-ratio at +-20,
not each l_t (l = (+25, -20): the product ratio is e^5, dropped; clamping each token first would give e^0, kept).
Presets: one per option at its config default; the outlier thresholds are the config docstrings' suggestions
(1e-4, 100). token_mask_is_threshold_* has no default or suggestion, so it is a knob, not a preset.
Source: NovaSky-AI/SkyRL, skyrl/backends/skyrl_train/utils/off_policy_correction_utils.py,
skyrl/backends/skyrl_train/utils/ppo_utils.py (dppo_policy_loss, compute_policy_loss_cispo),
skyrl/train/config/config.py (OffPolicyCorrectionConfig, DPPOConfig, CISPOConfig). Read at a956457 (2026-08-21).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..core.compose import SAFETY_BOUND, Centering, Composition, Criterion, Weight
from ..core.spec import Preset
from ..core.types import Config, knob
from ._preset import framework_estimator

LOSSES = ("regular", "rollout_is", "dppo", "cispo")


@dataclass(frozen=True)
class SkyRLConfig(Config):
    """AlgorithmConfig's policy_loss_type, DPPOConfig, CISPOConfig and OffPolicyCorrectionConfig; SkyRL's names."""

    policy_loss_type: str = knob("regular", "regular (PPO on pi/pi_old: 1 at the first minibatch), rollout_is "
                                 "(pi/mu zeroed outside an open band), dppo (a divergence mask on pi/mu) or cispo "
                                 "(its clamped ratio).", choices=LOSSES)
    eps_clip_low: float = knob(0.2, "rollout_is: zero the ratio at or below 1 - this.", gt=0.0, ui=(0.01, 1.0),
                               band=False, inf=True)
    eps_clip_high: float = knob(0.2, "rollout_is: zero the ratio at or above 1 + this.", gt=0.0, ui=(0.01, 1.0),
                                inf=True)
    dppo_type: str = knob("binary_tv", "DPPO's divergence: binary_tv (the probability difference) or binary_kl "
                          "(KL(mu || pi) of the two-outcome split, on the side the probability moved).",
                          choices=("binary_tv", "binary_kl"))
    delta_low: float = knob(0.2, "DPPO: drop an A < 0 token whose probability fell by more than this.", ge=0.0,
                            ui=(0.01, 1.0), band=False)
    delta_high: float = knob(0.2, "DPPO: drop an A > 0 token whose probability rose by more than this.", ge=0.0,
                             ui=(0.01, 1.0))
    cispo_eps_clip_low: float = knob(1.0, "CISPO: the weight's lower clamp is 1 - this.", ge=0.0, ui=(0.0, 1.0),
                                     band=False)
    cispo_eps_clip_high: float = knob(4.0, "CISPO: the weight's upper clamp is 1 + this.", gt=0.0, ui=(0.1, 10.0),
                                      inf=True)
    cispo_anchor: str = knob("rollout", "CISPO's ratio: pi/mu (rollout) or pi/pi_old (old: 1 at the first "
                             "minibatch, no correction).", choices=("rollout", "old"))

    tis_ratio_type: str | None = knob(None, "TIS weight: token, sequence, or None.", optional=True,
                                      choices=(None, "token", "sequence"))
    token_tis_ratio_clip_high: float = knob(2.0, "Token TIS cap.", gt=0.0, ui=(1.0, 10.0), log=True, inf=True)
    sequence_tis_ratio_clip_high: float = knob(5.0, "Sequence TIS cap.", gt=0.0, ui=(1.0, 20.0), log=True, inf=True)
    sequence_mask_metric: str | None = knob(None, "Drop rollouts by their geometric or product ratio.",
                                            optional=True, choices=(None, "geometric", "product"))
    geo_mask_low: float = knob(0.99, "Geometric band, low.", gt=0.0, ui=(0.9, 1.0))
    geo_mask_high: float = knob(1.01, "Geometric band, high.", gt=0.0, ui=(1.0, 1.1))
    product_mask_low: float = knob(0.5, "Product band, low.", gt=0.0, ui=(0.1, 1.0))
    product_mask_high: float = knob(2.0, "Product band, high.", gt=0.0, ui=(1.0, 10.0), log=True)
    outlier_token_is_threshold_low: float | None = knob(None, "Drop a rollout with any token ratio below this.",
                                                        optional=True, gt=0.0, ui=(1e-8, 0.5), log=True)
    outlier_token_is_threshold_high: float | None = knob(None, "Drop a rollout with any token ratio above this.",
                                                         optional=True, gt=0.0, ui=(2.0, 1e4), log=True)
    token_mask_is_threshold_low: float | None = knob(None, "Drop tokens whose ratio is below this (needs _high).",
                                                     optional=True, gt=0.0, ui=(0.01, 1.0))
    token_mask_is_threshold_high: float | None = knob(None, "Drop tokens whose ratio is above this (needs _low).",
                                                      optional=True, gt=0.0, ui=(1.0, 100.0), log=True)


    score_centering: bool = knob(False, "Score centering (SkyRL #2244): subtract the sampler-expected score over its "
                                 "top-k head, f the token TIS cap; the regular loss with token TIS only.",
                                 choices=(False, True))

    def __post_init__(self):
        super().__post_init__()
        if self.policy_loss_type in ("dppo", "cispo") and self.tis_ratio_type is not None:
            raise ValueError(f"tis_ratio_type with policy_loss_type={self.policy_loss_type}: SkyRL multiplies the "
                             "loss's own ratio by the TIS weight (cispo rollout refuses it); not expressible")
        if self.score_centering and (self.policy_loss_type != "regular" or self.tis_ratio_type != "token"):
            raise ValueError("score_centering is ppo_tis_score_centering_correction: the regular PPO loss with token "
                             "TIS (tis_ratio_type token) only")


def _loss_weight(cfg: SkyRLConfig) -> tuple[Weight, list[Criterion], float | None] | None:
    """The weight (and criteria, clamp) of a policy loss anchored on the sampler; None for one anchored on pi_old."""
    if cfg.policy_loss_type == "dppo":  # the clamp's zero gradient beyond +-20, then the sign-conditioned mask
        stat = "prob_diff" if cfg.dppo_type == "binary_tv" else "binary_kl_mu"  # KL signed by the move's side
        return Weight("token"), [Criterion("ratio", "token", low=math.exp(-SAFETY_BOUND), high=math.exp(SAFETY_BOUND),
                                           edge_space="ratio"),
                                 Criterion(stat, "token", high=cfg.delta_high, advantage="positive"),
                                 Criterion(stat, "token", low=-cfg.delta_low, advantage="negative")], None
    if cfg.policy_loss_type == "rollout_is":  # exp(clamp(l)) kept on the open band (1 - eps_low, 1 + eps_high)
        band = Criterion("ratio", "token", low=1.0 - cfg.eps_clip_low, high=1.0 + cfg.eps_clip_high, strict=True,
                         edge_space="ratio")
        return Weight("token"), [band], SAFETY_BOUND
    if cfg.policy_loss_type == "cispo" and cfg.cispo_anchor == "rollout":
        low = max(1.0 - cfg.cispo_eps_clip_low, 0.0)
        return Weight("token", clip=1.0 + cfg.cispo_eps_clip_high, clip_low=low), [], SAFETY_BOUND
    return None


def compose(cfg: SkyRLConfig) -> Composition:
    criteria: list[Criterion] = []
    if cfg.outlier_token_is_threshold_low is not None:
        criteria.append(Criterion("ratio", "min", low=cfg.outlier_token_is_threshold_low, edge_space="ratio"))
    if cfg.outlier_token_is_threshold_high is not None:
        criteria.append(Criterion("ratio", "max", high=cfg.outlier_token_is_threshold_high, edge_space="ratio"))
    if cfg.token_mask_is_threshold_low is not None and cfg.token_mask_is_threshold_high is not None:
        criteria.append(Criterion("ratio", "token", low=cfg.token_mask_is_threshold_low,
                                  high=cfg.token_mask_is_threshold_high, edge_space="ratio"))
    own = _loss_weight(cfg)
    clamp = SAFETY_BOUND
    if own is not None:
        weight, extra, clamp = own
        criteria += extra
    elif cfg.tis_ratio_type is None:
        weight = Weight("none")
    elif cfg.tis_ratio_type == "token":
        weight = Weight("token", clip=cfg.token_tis_ratio_clip_high)
    else:
        weight = Weight("sequence", clip=cfg.sequence_tis_ratio_clip_high)
    if cfg.sequence_mask_metric == "geometric":
        criteria.append(Criterion("ratio", "mean", low=cfg.geo_mask_low, high=cfg.geo_mask_high, edge_space="ratio"))
    elif cfg.sequence_mask_metric == "product":
        criteria.append(Criterion("ratio", "sum", low=cfg.product_mask_low, high=cfg.product_mask_high,
                                  edge_space="ratio"))
    # ppo_tis_score_centering_correction at the first minibatch (p = o: PPO's ratio 1, its clip inactive): head
    # q min(p / q, cap), tail alpha = rho min(1 / rho, cap), each tail mass floored at TAIL_MASS_FLOOR 1e-6
    sc = Centering("truncate", high=cfg.token_tis_ratio_clip_high, sampler_floor=1e-6,
                   trainer_floor=1e-6) if cfg.score_centering else None
    return Composition(weight, tuple(criteria), log_ratio_clamp=clamp, adv_tau=cfg.adv_tau,
                       clamp_order=_clamp_order(criteria), centering=sc)


def _clamp_order(criteria) -> str:
    """SkyRL's and slime's rollout masks clamp the raw sum (mean) at +-20; with no such rule the order is moot."""
    return "aggregate" if any(c.statistic == "ratio" and c.agg in ("sum", "mean") for c in criteria) else "token"


ESTIMATOR = framework_estimator("skyrl", compose, SkyRLConfig, "SkyRL's off_policy_correction and policy losses.")
SOURCE = "NovaSky-AI/SkyRL@a956457: skyrl/backends/skyrl_train/utils/off_policy_correction_utils.py"
LOSSES_AT = "NovaSky-AI/SkyRL@a956457: skyrl/backends/skyrl_train/utils/ppo_utils.py"
_SINCE = "since 2026-03-02 or before (SkyRL #1249 moved it to skyrl/; the copy read keeps no older history)"
_CLAMP_NOTE = "the summed log-ratio is clamped at +-20, not each token (l = (+25, -20): e^5, dropped)"

PRESETS = [
    Preset("skyrl/token_tis", "Token TIS min(rho_t, 2) (log-ratio clamped at +-20).", f"{SOURCE} (compute_tis_ratio)",
           ESTIMATOR, SkyRLConfig(tis_ratio_type="token"), versions=_SINCE),
    Preset("skyrl/token_tis_score_centering", "Token TIS min(rho_t, 2) (log-ratio clamped at +-20) plus score "
           "centering over the sampler's top-k head: at the first minibatch the head's q min(p / q, 2) and the tail's "
           "rho min(1 / rho, 2), every tail mass floored at 1e-6 (PPO's ratio p / o is 1 there; later minibatches "
           "gate the head by PPO's clip, which seqis does not model).", "NovaSky-AI/SkyRL#2244 (open; the search "
           "index's copy, id 70229985213, commit not recorded): skyrl_train/objective/score_centering.py "
           "(ppo_tis_score_centering_correction)", ESTIMATOR, SkyRLConfig(tis_ratio_type="token", score_centering=True),
           versions="open pull request (SkyRL #2244), not merged"),
    Preset("skyrl/sequence_tis", "Sequence TIS min(exp(clamp(S, +-20)), 5).", f"{SOURCE} (compute_tis_ratio)",
           ESTIMATOR, SkyRLConfig(tis_ratio_type="sequence"), versions=_SINCE),
    Preset("skyrl/geo_mask", f"Drop rollouts with exp(S/T) outside [0.99, 1.01]; weight 1; {_CLAMP_NOTE}.",
           f"{SOURCE} (compute_sequence_mask)", ESTIMATOR, SkyRLConfig(sequence_mask_metric="geometric"),
           versions=_SINCE),
    Preset("skyrl/product_mask", f"Drop rollouts with exp(S) outside [0.5, 2]; weight 1; {_CLAMP_NOTE}.",
           f"{SOURCE} (compute_sequence_mask)", ESTIMATOR, SkyRLConfig(sequence_mask_metric="product"),
           versions=_SINCE),
    Preset("skyrl/outlier_token_mask", "Drop rollouts with any token ratio below 1e-4 or above 100 (the config "
           "docstrings' suggested thresholds; no code default); weight 1.", f"{SOURCE} (compute_outlier_token_mask)",
           ESTIMATOR, SkyRLConfig(outlier_token_is_threshold_low=1e-4, outlier_token_is_threshold_high=100.0),
           versions=_SINCE),
    Preset("skyrl/dppo_tv", "DPPO binary TV (policy_loss_type dppo): rho_t, dropping tokens whose probability rose "
           "> 0.2 (A > 0) or fell > 0.2 (A < 0); a token with |l| > 20 has no gradient (the clamp's).",
           f"{LOSSES_AT} (dppo_policy_loss)", ESTIMATOR, SkyRLConfig(policy_loss_type="dppo"),
           versions="since 2026-06-17 (SkyRL #1037)"),
    Preset("skyrl/rollout_is", "rollout_is (the loss on pi/mu): rho_t = exp(clamp(l_t, +-20)) kept on the OPEN band "
           "0.8 < rho_t < 1.2 (strict), else 0.", f"{LOSSES_AT} (rollout_is_policy_loss)", ESTIMATOR,
           SkyRLConfig(policy_loss_type="rollout_is"), versions="since 2026-03-12 (SkyRL #1314)"),
    Preset("skyrl/dppo_kl", "DPPO binary KL (dppo_type binary_kl, delta 0.2 at the config default; its docstring "
           "recommends 0.05): rho_t, dropping A > 0 tokens whose probability rose with KL(mu || pi) > 0.2 and A < 0 "
           "tokens whose probability fell with it > 0.2 (1e-8 inside the complement's log); no gradient beyond "
           "abs(l) > 20.", f"{LOSSES_AT} (dppo_policy_loss)", ESTIMATOR,
           SkyRLConfig(policy_loss_type="dppo", dppo_type="binary_kl"), versions="since 2026-06-17 (SkyRL #1037)"),
    Preset("skyrl/cispo_rollout", "CISPO on the sampler (cispo_anchor rollout): every token keeps "
           "clamp(rho_t, 0, 5) (1 - 1.0, 1 + 4.0: the ScaleRL bounds).", f"{LOSSES_AT} (compute_policy_loss_cispo)",
           ESTIMATOR, SkyRLConfig(policy_loss_type="cispo"), versions="since 2026-07-28 (SkyRL #1859)"),
]
