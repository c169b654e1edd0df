"""verl's rollout correction: the 19 preset factories of `RolloutCorrectionConfig`, as verl's code computes them.

    IS weight   token: exp(clamp(l_t, -20, 20));  sequence: exp(clamp(S_j, -20, 20)) (S_j sums the raw l_t)
                then min(w, threshold) (TIS), or w * 1[lower <= w <= upper] for a "lower_upper" threshold (IcePop)
    rejection   per-token l clamped to [-20, 20], then k1 = -l, k2 = l^2 / 2, k3 = e^l - 1 - l, taken per token or
                as a rollout's sum / mean / max; k1 keeps log(lower) <= k1 <= log(upper), so in ratio terms it
                keeps [1/upper, 1/lower]: "0.5_1.5" keeps rho in [0.667, 2]; k2 / k3 keep stat <= upper
    loss        decoupled: PPO on pi_theta / pi_old (1 at the first minibatch) times the IS weights;
                bypass + reinforce: -w A log pi;  bypass + ppo_clip: PPO-clip on r = pi / mu (IS weights unused)

Quirks kept: the +-20 clamp, k1 on -l. Quirk not kept: with IcePop, `compute_is_metrics` divides by the mean
squared weight, a ZeroDivisionError when every weight is 0; seqis returns zero weights. In bypass ppo_clip a token
with l < -20 keeps weight r < 2e-9 here, where verl's clamp stops its gradient.
Source: pip verl 0.9.1, verl/trainer/ppo/rollout_corr_helper.py, verl/trainer/config/algorithm.py,
verl/trainer/ppo/core_algos.py (compute_policy_loss_bypass_mode); the same files as verl-project/verl (formerly
volcengine/verl) at 1dda039 (2026-08-22). Versions: the geo and k3 rejections have their present form since
#4544 (2026-01-14: k1 on -l, no veto); before it, "geometric" was a ratio band with a 1e-4 token veto.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.compose import SAFETY_BOUND, Centering, Composition, Criterion, Weight, ppo_clip_criteria
from ..core.spec import Preset
from ..core.types import Config, knob
from ._preset import framework_estimator, log_or_none

RS_OPTIONS = ("token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k2", "seq_sum_k3", "seq_mean_k1",
              "seq_mean_k2", "seq_mean_k3", "seq_max_k2", "seq_max_k3")
_RS_AGG = {"token": "token", "seq_sum": "sum", "seq_mean": "mean", "seq_max": "max"}  # option prefix -> agg


@dataclass(frozen=True)
class VerlConfig(Config):
    """algorithm.rollout_correction (+ the actor's PPO clip for bypass ppo_clip); verl's names."""

    rollout_is: str | None = knob(None, "IS weight level: token, sequence, or None (no IS weight).", optional=True,
                                  choices=(None, "token", "sequence"))
    rollout_is_threshold: float = knob(2.0, "TIS: truncate the IS weight at this (IcePop: the band's upper edge).",
                                       gt=0.0, ui=(1.0, 10.0), log=True)
    rollout_is_threshold_lower: float | None = knob(
        None, "IcePop ('lower_upper' threshold): zero IS weights outside [lower, upper]; None = TIS.",
        optional=True, gt=0.0, ui=(0.1, 1.0))
    rollout_is_batch_normalize: bool = knob(False, "Divide the IS weights by their batch mean.",
                                            choices=(False, True))
    rollout_rs: str | None = knob(None, "Rejection: a divergence statistic per token or per rollout (sum/mean/max).",
                                  optional=True, choices=(None, *RS_OPTIONS))
    rollout_rs_threshold: float | None = knob(
        None, "Rejection upper bound (k1: on mu/pi, so 1/threshold is the lowest kept pi/mu).", optional=True,
        gt=0.0, ui=(1e-4, 10.0), log=True)
    rollout_rs_threshold_lower: float | None = knob(
        None, "k1 only: the lower bound on mu/pi ('lower_upper'); None = 1/upper.", optional=True, gt=0.0,
        ui=(0.1, 1.0))
    bypass_mode: bool = knob(False, "Bypass: pi_old = the sampler (2 policies) instead of a recomputed pi_old.",
                             choices=(False, True))
    loss_type: str = knob("ppo_clip", "Bypass loss: ppo_clip (PPO on pi/mu, IS weights unused) or reinforce.",
                          choices=("ppo_clip", "reinforce"))
    clip_ratio: float = knob(0.2, "actor.clip_ratio: PPO's epsilon (bypass ppo_clip).", gt=0.0, ui=(0.05, 1.0),
                             inf=True)
    clip_ratio_c: float = knob(3.0, "actor.clip_ratio_c: dual-clip bound for A < 0 (bypass ppo_clip).", gt=1.0,
                               ui=(1.5, 10.0), inf=True)
    score_centering: bool = knob(False, "Score centering (verl #8010): subtract the sampler-expected score over the "
                                 "rollout's top-k head; bypass REINFORCE with no IS weight or a token one only.",
                                 choices=(False, True))

    def __post_init__(self):
        super().__post_init__()
        if self.rollout_rs is not None and self.rollout_rs_threshold is None:
            raise ValueError("rollout_rs_threshold must be set when rollout_rs is (verl raises too)")
        lo = self.rollout_is_threshold_lower
        if lo is not None and lo > self.rollout_is_threshold:
            raise ValueError(f"rollout_is_threshold_lower must be <= rollout_is_threshold, got {lo}")
        if self.score_centering:  # verl's own refusals (RolloutCorrectionConfig, its test_score_centering_config)
            for bad, why in ((not self.bypass_mode, "bypass_mode False"),
                             (self.loss_type == "ppo_clip", "loss_type ppo_clip"),
                             (self.rollout_is == "sequence", "rollout_is sequence"),
                             (self.rollout_is == "token" and self.rollout_is_batch_normalize,
                              "token rollout_is with rollout_is_batch_normalize")):
                if bad:
                    raise ValueError(f"score_centering composes with bypass REINFORCE and no or a token IS weight; "
                                     f"verl refuses {why}")


def _rejection(option: str, upper: float, lower: float | None) -> Criterion:
    """One rollout_rs option as a criterion, parsed the way verl parses it ("seq_mean_k1" -> mean of k1)."""
    level, statistic = option.rsplit("_", 1)
    if statistic == "k1":  # a band on -l: log(lower) <= k1 <= log(upper), lower defaulting to 1/upper
        return Criterion("k1", _RS_AGG[level], low=log_or_none(lower or 1.0 / upper), high=log_or_none(upper))
    return Criterion(statistic, _RS_AGG[level], high=upper)


def compose(cfg: VerlConfig) -> Composition:
    criteria: list[Criterion] = []
    if cfg.bypass_mode and cfg.loss_type == "ppo_clip":  # the PPO ratio pi/mu is the weight; IS weights unused
        weight = Weight("token")
        criteria += ppo_clip_criteria(cfg.clip_ratio, cfg.clip_ratio, cfg.clip_ratio_c)
    elif cfg.rollout_is is None:
        weight = Weight("none")
    elif cfg.rollout_is_threshold_lower is None:
        weight = Weight(cfg.rollout_is, clip=cfg.rollout_is_threshold, self_normalize=cfg.rollout_is_batch_normalize)
    else:
        band = (cfg.rollout_is_threshold_lower, cfg.rollout_is_threshold)
        weight = Weight(cfg.rollout_is, band=band, self_normalize=cfg.rollout_is_batch_normalize)
    if cfg.rollout_rs is not None:
        criteria.append(_rejection(cfg.rollout_rs, cfg.rollout_rs_threshold, cfg.rollout_rs_threshold_lower))
    return Composition(weight, tuple(criteria), log_ratio_clamp=SAFETY_BOUND, adv_tau=cfg.adv_tau,
                       centering=_centering(cfg) if cfg.score_centering else None)


def _centering(cfg: VerlConfig) -> Centering:
    """score_centering_weight_fn: the IS weight's own rule on the head (1 without one, TIS min(x, threshold), a
    "lower_upper" threshold's band); score_centering_correction's eps 1e-6 floors both tail masses."""
    floors = dict(sampler_floor=SC_FLOOR, trainer_floor=SC_FLOOR)
    if cfg.rollout_is is None:
        return Centering("none", **floors)
    if cfg.rollout_is_threshold_lower is None:
        return Centering("truncate", high=cfg.rollout_is_threshold, **floors)
    return Centering("band", low=cfg.rollout_is_threshold_lower, high=cfg.rollout_is_threshold, **floors)


ESTIMATOR = framework_estimator("verl", compose, VerlConfig, "verl's rollout correction (RolloutCorrectionConfig).")
SOURCE = "verl-project/verl@0.9.1: verl/trainer/ppo/rollout_corr_helper.py, verl/trainer/config/algorithm.py"
_SINCE = {  # factory -> the PR that gave it its present form (verl's git history)
    "decoupled_token_is": "2025-11-12 (verl #4070)", "decoupled_seq_is": "2025-11-12 (verl #4070)",
    "decoupled_token_icepop": "2026-03-24 (verl #5722)", "bypass_pg_token_icepop": "2026-03-24 (verl #5722)",
    "bypass_ppo_clip": "2025-12-15 (verl #4511)", "bypass_pg_is": "2025-12-15 (verl #4511)",
    "disabled": "2025-11-07 (verl #3984)"}
_GEO = dict(rollout_rs="seq_mean_k1", rollout_rs_threshold=1.001, rollout_rs_threshold_lower=0.999)
_K3 = dict(rollout_rs="seq_mean_k3", rollout_rs_threshold=0.01)
_BYPASS_PG = dict(bypass_mode=True, loss_type="reinforce")
_BYPASS_PPO = dict(bypass_mode=True, loss_type="ppo_clip")
_GEO_NOTE = ("geo RS '0.999_1.001' is a band on -S/T: it keeps exp(S/T) in [1/1.001, 1/0.999] = [0.999001, "
             "1.001001], not the docs' [0.999, 1.001]")
_PPO_NOTE = "PPO-clip on pi/mu (eps 0.2, dual clip 3): A > 0 keeps r <= 1.2, A < 0 keeps 0.8 <= r <= 3"
SC_FLOOR = 1e-6  # score_centering_correction's eps: both tail masses floored
SC_SOURCE = "verl-project/verl@c6236f5: verl/trainer/ppo/score_centering.py (score_centering_correction)"
SC_VERSIONS = "merged after 0.9.1 (verl #8010; read at c6236f5), in no release yet"
_SC = ("; plus score centering over the rollout's top-k head (rollout.topk_log_probs, 128 in verl's runs), the tail "
       "modelled as rho p with both tail masses floored at 1e-6, alpha = rho f(1 / rho)")
_ICEPOP_NOTE = ("weights outside [0.5, 5] are zeroed (response_mask kept); verl raises ZeroDivisionError in its "
                "ESS metric when every weight is 0, seqis returns zeros")

_D = " (Decoupled: PPO's pi_theta/pi_old is 1 at the first minibatch; the IS weights are the correction.)"
_ROWS = [  # (factory, its defaults, summary)
    ("decoupled_token_is", dict(rollout_is="token"), "Token TIS min(rho_t, 2) (log-ratio clamped at +-20)." + _D),
    ("decoupled_seq_is", dict(rollout_is="sequence"), "Sequence TIS min(exp(clamp(S, +-20)), 2)." + _D),
    ("decoupled_seq_is_rs", dict(rollout_is="sequence", rollout_rs="seq_sum_k1", rollout_rs_threshold=2.0,
                                 rollout_rs_threshold_lower=0.5),
     "Seq TIS at 2 plus seq_sum_k1 rejection '0.5_2.0' (a band on -S: keeps exp(S) in [0.5, 2])." + _D),
    ("decoupled_geo_rs", dict(_GEO), f"Geometric rejection only, weight 1; {_GEO_NOTE}." + _D),
    ("decoupled_geo_rs_seq_tis", dict(rollout_is="sequence", **_GEO),
     f"Seq TIS at 2 times geo RS; {_GEO_NOTE}." + _D),
    ("decoupled_geo_rs_token_tis", dict(rollout_is="token", **_GEO),
     f"Token TIS at 2 times geo RS; {_GEO_NOTE}." + _D),
    ("decoupled_k3_rs", dict(_K3), "Reject rollouts whose mean k3 = rho - 1 - l exceeds 0.01; weight 1." + _D),
    ("decoupled_k3_rs_seq_tis", dict(rollout_is="sequence", **_K3),
     "Seq TIS at 2 times mean-k3 rejection at 0.01." + _D),
    ("decoupled_k3_rs_token_tis", dict(rollout_is="token", **_K3),
     "Token TIS at 2 times mean-k3 rejection at 0.01." + _D),
    ("decoupled_token_icepop", dict(rollout_is="token", rollout_is_threshold=5.0, rollout_is_threshold_lower=0.5),
     f"Token IcePop: {_ICEPOP_NOTE}." + _D),
    ("bypass_ppo_clip", dict(_BYPASS_PPO), f"{_PPO_NOTE}; no IS weights (the ratio is the correction)."),
    ("bypass_ppo_clip_geo_rs", dict(_BYPASS_PPO, **_GEO), f"{_PPO_NOTE}, plus geo RS; {_GEO_NOTE}."),
    ("bypass_ppo_clip_k3_rs", dict(_BYPASS_PPO, **_K3), f"{_PPO_NOTE}, plus mean-k3 rejection at 0.01."),
    ("bypass_pg_is", dict(_BYPASS_PG, rollout_is="sequence"), "REINFORCE with seq TIS min(exp(S), 2)."),
    ("bypass_pg_token_icepop", dict(_BYPASS_PG, rollout_is="token", rollout_is_threshold=5.0,
                                    rollout_is_threshold_lower=0.5), f"REINFORCE with token IcePop: {_ICEPOP_NOTE}."),
    ("bypass_pg_geo_rs", dict(_BYPASS_PG, **_GEO), f"REINFORCE, weight 1, geo RS; {_GEO_NOTE}."),
    ("bypass_pg_geo_rs_seq_tis", dict(_BYPASS_PG, rollout_is="sequence", **_GEO),
     f"REINFORCE with seq TIS at 2 and geo RS; {_GEO_NOTE}."),
    ("bypass_pg_geo_rs_token_tis", dict(_BYPASS_PG, rollout_is="token", **_GEO),
     f"REINFORCE with token TIS at 2 and geo RS; {_GEO_NOTE}."),
    ("disabled", dict(), "No correction (metrics only): weight 1."),
]

_SC_ROWS = [  # the score-centering factories (verl #8010): bypass REINFORCE, f the IS weight's rule
    ("bypass_pg_sc", dict(_BYPASS_PG, score_centering=True), "REINFORCE, weight 1 (f = 1)" + _SC + "."),
    ("bypass_pg_token_tis_sc", dict(_BYPASS_PG, rollout_is="token", score_centering=True),
     "REINFORCE with token TIS min(rho_t, 2) (f = min(x, 2))" + _SC + "."),
    ("bypass_pg_token_icepop_sc", dict(_BYPASS_PG, rollout_is="token", rollout_is_threshold=5.0,
                                       rollout_is_threshold_lower=0.5, score_centering=True),
     f"REINFORCE with token IcePop (f = x 1[0.5 <= x <= 5]): {_ICEPOP_NOTE}" + _SC + "."),
]

PRESETS = [
    *(Preset(f"verl/{name}", summary, f"{SOURCE} (RolloutCorrectionConfig.{name})", ESTIMATOR, VerlConfig(**values),
             versions=f"since {_SINCE.get(name, '2026-01-14 (verl #4544)')}; read in verl 0.9.1 (2026-09)")
      for name, values, summary in _ROWS),
    *(Preset(f"verl/{name}", summary, f"{SC_SOURCE}; RolloutCorrectionConfig.{name}", ESTIMATOR, VerlConfig(**values),
             versions=SC_VERSIONS) for name, values, summary in _SC_ROWS),
]
