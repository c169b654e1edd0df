"""slime's off-policy corrections: --use-tis (vanilla TIS or IcePop), the MIS example, and OPSM.

    tis      clamp(rho_t, tis_clip_low, tis_clip)                       (vanilla_tis_function, no log clamp)
    icepop   rho_t * 1[tis_clip_low <= rho_t <= tis_clip]               (icepop_function)
    mis      examples/train_infer_mismatch_helper: w = exp(clamp(log-ratio at tis_level, +-20)), truncated / clipped
             / masked to the TIS bounds, divided by its batch mean over every loss token (tis_batch_normalize); a
             token is rejected outside the RS bounds (rs_level) and a rollout is vetoed when any token has
             rho < rs_veto_threshold (raw l)
    opsm     --use-opsm with --use-rollout-logprobs (so pi_old = the sampler): drop a token with A < 0 whose
             rollout has mean(-l) > opsm_delta; the PPO ratio pi/mu is then the weight, clipped at 1 +- eps_clip

slime reduces the loss per rollout (mean over its tokens, then over rollouts: agg="seq-mean-token-mean");
rejected tokens leave the numerator only. The IcePop preset uses slime's defaults (tis_clip_low 0, tis_clip 2);
slime's own end-to-end test runs it with --tis-clip-low 0.5. Quirks: at sequence and geometric level the MIS
example clamps the summed (or mean) raw log-ratio at +-20, for its weight and for its RS band alike (kept:
clamp_order "aggregate").
tis_batch_normalize at tis_level sequence divides by the mean over every rollout, empty ones (weight 0) included
(kept: Weight.normalize_all).
Source: THUDM/slime, slime/backends/megatron_utils/loss.py, slime/utils/ppo_utils.py (compute_opsm_mask),
examples/train_infer_mismatch_helper/mis.py and mis.yaml. Read at 624b824 (2026-08-21). Miles (radixark/miles)
ships the same code (miles/backends/training_utils/loss_hub/, examples/infra_features/...): presets miles/*.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.compose import SAFETY_BOUND, Composition, Criterion, Weight, ppo_clip_criteria
from ..core.spec import Preset
from ..core.types import Config, knob
from ._preset import framework_estimator

_LEVEL_AGG = {"token": "token", "sequence": "sum", "geometric": "mean"}  # slime's level -> a ratio criterion's agg


@dataclass(frozen=True)
class TISConfig(Config):
    """--use-tis flags; slime's names."""

    tis_function: str = knob("vanilla", "vanilla_tis_function (clamp) or icepop_function (zero outside).",
                             choices=("vanilla", "icepop"))
    tis_clip: float = knob(2.0, "--tis-clip: upper bound.", gt=0.0, ui=(1.0, 10.0), log=True, inf=True)
    tis_clip_low: float = knob(0.0, "--tis-clip-low: lower bound.", ge=0.0, ui=(0.0, 1.0))


def compose_tis(cfg: TISConfig) -> Composition:
    if cfg.tis_function == "icepop":
        weight = Weight("token", band=(cfg.tis_clip_low, cfg.tis_clip))
    else:
        weight = Weight("token", clip=cfg.tis_clip, clip_low=cfg.tis_clip_low)
    return Composition(weight, adv_tau=cfg.adv_tau)


@dataclass(frozen=True)
class MISConfig(Config):
    """examples/train_infer_mismatch_helper/mis.yaml; slime's names."""

    tis_level: str = knob("token", "IS weight level.", choices=("token", "sequence", "geometric"))
    tis_mode: str = knob("truncate", "truncate (cap), clip (clamp to [lower, upper]) or mask (reject outside).",
                         choices=("truncate", "clip", "mask"))
    tis_lower_bound: float | None = knob(0.5, "Lower bound (clip / mask); None = 1 / upper.", optional=True,
                                         gt=0.0, ui=(0.1, 1.0))
    tis_upper_bound: float = knob(2.0, "Upper bound.", gt=0.0, ui=(1.0, 10.0), log=True)
    use_rs: bool = knob(True, "Rejection sampling on the RS level's ratio.", choices=(True, False))
    rs_level: str = knob("token", "RS ratio level.", choices=("token", "sequence", "geometric"))
    rs_lower_bound: float | None = knob(None, "RS lower bound; None = the TIS lower bound.", optional=True,
                                        gt=0.0, ui=(0.1, 1.0))
    rs_upper_bound: float | None = knob(None, "RS upper bound; None = the TIS upper bound.", optional=True,
                                        gt=0.0, ui=(1.0, 10.0), log=True)
    rs_veto_threshold: float | None = knob(1e-4, "Veto a rollout with any token ratio below this.", optional=True,
                                           gt=0.0, ui=(1e-8, 0.1), log=True)
    tis_batch_normalize: bool = knob(True, "Divide the weights by their batch mean.", choices=(True, False))

    def __post_init__(self):
        super().__post_init__()
        if self.tis_batch_normalize and self.tis_level == "geometric":
            raise ValueError("tis_batch_normalize supports tis_level token or sequence (slime raises for geometric)")


def compose_mis(cfg: MISConfig) -> Composition:
    lower = cfg.tis_lower_bound if cfg.tis_lower_bound is not None else 1.0 / cfg.tis_upper_bound
    level = cfg.tis_level
    criteria: list[Criterion] = []
    every = cfg.tis_batch_normalize and level == "sequence"  # slime's mean over every rollout, empty ones too
    norm = dict(self_normalize=cfg.tis_batch_normalize, normalize_all=every)
    if cfg.tis_mode == "truncate":
        weight = Weight(level, clip=cfg.tis_upper_bound, **norm)
    elif cfg.tis_mode == "clip":
        weight = Weight(level, clip=cfg.tis_upper_bound, clip_low=lower, **norm)
    else:  # mask: the weight stays raw (and normalised raw), the band rejects
        weight = Weight(level, **norm)
        criteria.append(Criterion("ratio", _LEVEL_AGG[level], low=lower, high=cfg.tis_upper_bound))
    if cfg.use_rs:
        rs_low = cfg.rs_lower_bound if cfg.rs_lower_bound is not None else lower
        rs_high = cfg.rs_upper_bound if cfg.rs_upper_bound is not None else cfg.tis_upper_bound
        criteria.append(Criterion("ratio", _LEVEL_AGG[cfg.rs_level], low=rs_low, high=rs_high))
        if cfg.rs_veto_threshold is not None:
            criteria.append(Criterion("ratio", "min", low=cfg.rs_veto_threshold))
    order = "aggregate" if any(c.statistic == "ratio" and c.agg in ("sum", "mean") for c in criteria) else "token"
    return Composition(weight, tuple(criteria), log_ratio_clamp=SAFETY_BOUND, adv_tau=cfg.adv_tau, clamp_order=order)


@dataclass(frozen=True)
class OPSMConfig(Config):
    """--use-opsm with --use-rollout-logprobs; slime's names."""

    opsm_delta: float = knob(1e-4, "--opsm-delta: drop A < 0 rollouts whose mean log(mu/pi) exceeds this.",
                             gt=0.0, ui=(1e-5, 1.0), log=True)
    eps_clip: float = knob(0.2, "--eps-clip: PPO's lower epsilon.", gt=0.0, ui=(0.05, 1.0), inf=True)
    eps_clip_high: float | None = knob(None, "--eps-clip-high: PPO's upper epsilon; None = eps_clip.",
                                       optional=True, gt=0.0, ui=(0.05, 1.0), inf=True)
    eps_clip_c: float | None = knob(None, "--eps-clip-c: dual clip for A < 0; None = off.", optional=True, gt=1.0,
                                    ui=(1.5, 10.0), inf=True)


def compose_opsm(cfg: OPSMConfig) -> Composition:
    eps_high = cfg.eps_clip if cfg.eps_clip_high is None else cfg.eps_clip_high
    opsm = Criterion("k1", "mean", high=cfg.opsm_delta, advantage="negative")
    criteria = (*ppo_clip_criteria(cfg.eps_clip, eps_high, cfg.eps_clip_c), opsm)
    return Composition(Weight("token"), criteria, adv_tau=cfg.adv_tau)


SOURCE = "THUDM/slime@624b824: slime/backends/megatron_utils/loss.py"
MIS_SOURCE = "THUDM/slime@624b824: examples/train_infer_mismatch_helper/mis.py (compute_mis_weights)"
OPSM_SOURCE = "THUDM/slime@624b824: slime/utils/ppo_utils.py (compute_opsm_mask)"
_TIS = framework_estimator("slime/tis", compose_tis, TISConfig, "slime --use-tis (vanilla TIS or IcePop).")
_MIS = framework_estimator("slime/mis", compose_mis, MISConfig, "slime's MIS example (mis.py).")
_OPSM = framework_estimator("slime/opsm", compose_opsm, OPSMConfig, "slime --use-opsm.")

# (name, summary, estimator, config) of the four, shared with Miles (the same code under its own paths)
ROWS = [
    ("tis", "--use-tis: clamp(rho_t, 0, 2) per token, no log-ratio clamp.", _TIS, TISConfig()),
    ("icepop", "--use-tis with icepop_function: rho_t * 1[0 <= rho_t <= 2] at the defaults (slime's e2e test uses "
     "--tis-clip-low 0.5).", _TIS, TISConfig(tis_function="icepop")),
    ("mis", "MIS example: min(rho_t, 2) / batch mean, tokens outside [0.5, 2] rejected, rollouts with a token below "
     "1e-4 vetoed (log-ratio clamped at +-20).", _MIS, MISConfig()),
    ("opsm", "OPSM with --use-rollout-logprobs: PPO-clip on pi/mu (eps 0.2), dropping A < 0 rollouts whose "
     "mean(-l) > 1e-4.", _OPSM, OPSMConfig()),
]
_WHERE = {"tis": (f"{SOURCE} (vanilla_tis_function)", "since 2025-10-20 (slime #429; --tis-clip-low #236)"),
          "icepop": (f"{SOURCE} (icepop_function)", "since 2025-12-03 (slime #1014)"),
          "mis": (MIS_SOURCE, "since 2025-11-18 (slime #690: RS, veto, batch normalisation)"),
          "opsm": (OPSM_SOURCE, "since 2025-12-02 (slime #999)")}

PRESETS = [Preset(f"slime/{name}", summary, _WHERE[name][0], est, cfg, versions=_WHERE[name][1])
           for name, summary, est, cfg in ROWS]
