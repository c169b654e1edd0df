"""open-instruct's train/infer rho correction (grpo_fast, use_rho_correction), on by default.

    l_t        clamp(log pi_old - log mu, -10, 10) on response tokens (the +-10 clamp, not verl's 20)
    rho        rho_t = exp(l_t); with rho_mask_sequence_level the geometric mean exp(mean_t l_t) of the clamped l
               replaces it, for the mask AND the weight
    mask       drop tokens whose rho is below rho_mask_lower_bound or above rho_mask_upper_bound (edges kept; 0
               switches a side off)
    weight     clamp(rho, rho_clamp_lower_bound, rho_clamp_upper_bound) (0 switches a side off) on kept tokens

Defaults in the code: use_rho_correction True, clamp upper 2.0 (lower off), both mask bounds off, token level:
min(rho_t, 2) per token. The weight multiplies the DAPO (PPO-clip) or CISPO per-token loss; the normaliser is every
response token of the accumulation group (loss_denominator "token"), so dropped tokens stay in it (token-mean).
pi_theta / pi_old is 1 at the first minibatch. CHANGELOG.md says the PR that set the cap (#1547) made it 10; the
code says 2.0. rho_mask_tv_divergence (VACO: the rollout mean of |rho_t - 1|, dropping only tokens with
sign(l_t) * A > 0) needs a |rho - 1| statistic and a per-token sign condition the composition lacks: compose
refuses it. Sequence level clamps each token's l before the mean (grpo_utils.py:419, :427; weight_clamp_order
"token": l = (30, -10) gives the weight exp(0) = 1), and the masks compare rho itself with their bounds (:375-376,
`rho < lower`, `rho > upper`: edge_space "ratio").
Source: allenai/open-instruct, open_instruct/grpo_utils.py (compute_rho_correction, _rho_drop_masks,
_sequence_level_mean, GRPOExperimentConfig), open_instruct/grpo_fast.py (the training step). Read at e6c3044a
(2026-08-20).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.compose import Composition, Criterion, Weight
from ..core.spec import Preset
from ..core.types import Config, knob
from ._preset import framework_estimator

LOG_RATIO_CLAMP = 10.0  # compute_rho_correction's clamp of old_logprob - vllm_logprobs


@dataclass(frozen=True)
class OpenInstructConfig(Config):
    """GRPOExperimentConfig's rho fields; open-instruct's names (0 switches a bound off)."""

    use_rho_correction: bool = knob(True, "Apply the rho correction at all.", choices=(True, False))
    rho_clamp_lower_bound: float = knob(0.0, "Clamp rho from below (0 = off; else in (0, 1)).", ge=0.0,
                                        ui=(0.0, 1.0))
    rho_clamp_upper_bound: float = knob(2.0, "Clamp rho from above (0 = off; else > 1).", ge=0.0, ui=(1.0, 10.0))
    rho_mask_lower_bound: float = knob(0.0, "Drop tokens with rho below this (0 = off; else in (0, 1)).", ge=0.0,
                                       ui=(0.0, 1.0))
    rho_mask_upper_bound: float = knob(0.0, "Drop tokens with rho above this (0 = off; else > 1).", ge=0.0,
                                       ui=(1.0, 10.0))
    rho_mask_sequence_level: bool = knob(False, "Use the rollout's geometric-mean rho for the mask and the weight.",
                                         choices=(True, False))
    rho_mask_tv_divergence: bool = knob(False, "VACO's TV mask (needs a |rho - 1| statistic: not expressible).",
                                        choices=(True, False))

    def __post_init__(self):
        super().__post_init__()
        if not self.use_rho_correction:
            return
        for name, lo, hi in (("rho_mask_lower_bound", 0.0, 1.0), ("rho_clamp_lower_bound", 0.0, 1.0)):
            v = getattr(self, name)
            if v > 0.0 and not lo < v < hi:  # GRPOExperimentConfig.__post_init__'s checks
                raise ValueError(f"{name} must satisfy 0 < lb < 1 when set, got {v}")
        for name in ("rho_mask_upper_bound", "rho_clamp_upper_bound"):
            v = getattr(self, name)
            if v > 0.0 and v <= 1.0:
                raise ValueError(f"{name} must be > 1 when set, got {v}")
        if self.rho_mask_tv_divergence:
            raise ValueError("rho_mask_tv_divergence needs a |rho - 1| statistic and a per-token sign(l) * A "
                             "condition the composition does not have yet (issue 23)")


def _on(x: float) -> float | None:
    return x if x > 0.0 else None


def compose(cfg: OpenInstructConfig) -> Composition:
    if not cfg.use_rho_correction:
        return Composition(Weight("none"), adv_tau=cfg.adv_tau)
    level, agg = ("geometric", "mean") if cfg.rho_mask_sequence_level else ("token", "token")
    weight = Weight(level, clip=_on(cfg.rho_clamp_upper_bound), clip_low=cfg.rho_clamp_lower_bound)
    lo, hi = _on(cfg.rho_mask_lower_bound), _on(cfg.rho_mask_upper_bound)
    criteria = () if lo is None and hi is None else (Criterion("ratio", agg, low=lo, high=hi, edge_space="ratio"),)
    return Composition(weight, criteria, log_ratio_clamp=LOG_RATIO_CLAMP, adv_tau=cfg.adv_tau,
                       weight_clamp_order="token")


ESTIMATOR = framework_estimator("open-instruct", compose, OpenInstructConfig,
                                "open-instruct grpo_fast's train/infer rho correction.")
SOURCE = "allenai/open-instruct@e6c3044a: open_instruct/grpo_utils.py (compute_rho_correction)"

SHIPPED_DEFAULT = (  # when the framework shipped it (Preset.versions)
    'this default since 2026-03-20 (open-instruct #1547: truncated_importance_sampling_ratio_cap 0 -> '
    '2.0, the same arithmetic), under the rho_* names since 2026-05-07 (#1650); off (cap 0) from '
    '2025-10-08 (#1041) to then'
)

PRESETS = [
    Preset("open-instruct/default", "open-instruct's default: min(rho_t, 2) per token, l clamped to +-10 first "
           "(grpo_utils.py:419; at sequence level each token's l before the mean, :427; the masks compare rho "
           "itself with their bounds, :375; use_rho_correction on; CHANGELOG.md calls the cap 10, the code sets "
           "2.0).", SOURCE, ESTIMATOR,
           OpenInstructConfig(), versions=SHIPPED_DEFAULT),
]
