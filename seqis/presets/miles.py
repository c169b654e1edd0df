"""Miles (radixark/miles): slime's off-policy corrections under Miles's own paths, the same code.

Miles carries slime's --use-tis (vanilla_tis_function, icepop_function), the MIS example's compute_mis_weights
(identical apart from its context-parallel gather) and OPSM (compute_opsm_mask), with slime's flag names and
defaults (--tis-clip 2, --tis-clip-low 0, --opsm-delta 1e-4, --eps-clip 0.2); see seqis/presets/slime.py for what
each computes and its quirks. One difference: since #1363 (2026-06-30) Miles's compute_policy_loss clamps PPO's
log-ratio to +-20 in float32 before exp, so with --use-rollout-logprobs (OPSM's PPO-clip on pi/mu) a token with
|l| > 20 has no gradient (the clamp's), where slime's keeps weight rho_t.
Source: radixark/miles, miles/backends/training_utils/loss_hub/corrections.py and math_utils.py,
examples/infra_features/train_infer_mismatch_helper/mis.py. Read at 31f1ca9 (2026-08-21).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..core.compose import SAFETY_BOUND, Centering, Composition, Criterion, Weight
from ..core.spec import Preset
from ..core.types import Config, knob
from ._preset import framework_estimator
from .slime import ROWS, OPSMConfig, compose_opsm

# Miles's clamp of PPO's log-ratio: no gradient beyond +-20 (a rejection, as the composition writes it)
GRADIENT_BAND = Criterion("ratio", "token", low=math.exp(-SAFETY_BOUND), high=math.exp(SAFETY_BOUND))


def compose_miles_opsm(cfg: OPSMConfig) -> Composition:
    comp = compose_opsm(cfg)
    return Composition(comp.weight, (*comp.criteria, GRADIENT_BAND), adv_tau=comp.adv_tau)


_OPSM = framework_estimator("miles/opsm", compose_miles_opsm, OPSMConfig, "Miles --use-opsm.")

AT = "radixark/miles@31f1ca9: "
_WHERE = {"tis": (f"{AT}miles/backends/training_utils/loss_hub/corrections.py (vanilla_tis_function)",
                  "since 2025-10-22 (Miles, synced from slime)"),
          "icepop": (f"{AT}miles/backends/training_utils/loss_hub/corrections.py (icepop_function)",
                     "since 2025-12-10 (Miles, synced from slime)"),
          "mis": (f"{AT}examples/infra_features/train_infer_mismatch_helper/mis.py (compute_mis_weights)",
                  "since 2025-11-24 (Miles, synced from slime)"),
          "opsm": (f"{AT}miles/backends/training_utils/loss_hub/math_utils.py (compute_opsm_mask)",
                   "since 2025-12-10 (Miles, synced from slime)")}

@dataclass(frozen=True)
class ScoreCenteringConfig(Config):
    """--use-score-centering with the slime lineage's TIS flags (Miles #3317, vime); their names."""

    use_tis: bool = knob(False, "--use-tis: weigh each token (and each head token) by f(p / q).", choices=(False, True))
    tis_clip: float = knob(2.0, "--tis-clip: f's upper edge.", gt=0.0, ui=(1.0, 10.0), log=True)
    tis_clip_low: float = knob(0.0, "--tis-clip-low: f's lower edge.", ge=0.0, ui=(0.0, 1.0))
    icepop: bool = knob(False, "--custom-tis-function-path icepop_function: f = x 1[low <= x <= high] instead of "
                        "clamp(x, low, high).", choices=(False, True))
    use_sampling_support_replay: bool = knob(False, "Center exactly over the replayed top-p / top-k support (the "
                                             "trainer renormalised on it), no tail model.", choices=(False, True))

    def __post_init__(self):
        super().__post_init__()
        if self.tis_clip_low > self.tis_clip:
            raise ValueError(f"tis_clip_low must be <= tis_clip, got {self.tis_clip_low} > {self.tis_clip}")


def compose_score_centering(cfg: ScoreCenteringConfig, sampler_floor: float | None,
                            trainer_floor: float) -> Composition:
    """The sampled token's weight and the head's f: 1 without --use-tis, clamp(x, low, high) (vanilla TIS) or the
    band (icepop), the same rule on both (_importance_weights); the tail's floors are the framework's."""
    lo, hi = cfg.tis_clip_low, cfg.tis_clip
    floors = dict(sampler_floor=sampler_floor, trainer_floor=trainer_floor, exact=cfg.use_sampling_support_replay)
    if not cfg.use_tis:
        weight, sc = Weight("none"), Centering("none", **floors)
    elif cfg.icepop:
        weight, sc = Weight("token", band=(lo, hi)), Centering("band", low=lo, high=hi, **floors)
    else:
        weight, sc = Weight("token", clip=hi, clip_low=lo), Centering("clamp", low=lo, high=hi, **floors)
    return Composition(weight, adv_tau=cfg.adv_tau, centering=sc)


def compose_miles_sc(cfg: ScoreCenteringConfig) -> Composition:
    """Miles's floors: the trainer's tail at 1e-6, the sampler's at 0 (_score_modeled_tail)."""
    return compose_score_centering(cfg, 0.0, 1e-6)


_SCORE = framework_estimator("miles/score_centering", compose_miles_sc, ScoreCenteringConfig,
                             "Miles --use-score-centering (#3317).")
SC_SOURCE = ("nanjiangwill/miles@52a21b0 (the #3317 design, open): miles/backends/training_utils/score_centering.py "
             "(compute_score_centering_terms, _score_modeled_tail, _score_exact_support, _importance_weights); flags "
             "in miles/utils/arguments.py (--use-score-centering, --score-centering-head-size). "
             "radixark/miles@857598f's loss_hub/score_centering.py is another design (--loss-type score_centering, "
             "both tails floored at 1e-6)")
SC_VERSIONS = "open pull request (Miles #3317), not merged"
_SC_ROWS = [
    ("score_centering", ScoreCenteringConfig(), "REINFORCE, weight 1, plus score centering over the sampler's top-k "
     "head (--score-centering-top-k 128 in its runs), the tail modelled as rho p with the trainer's tail floored at "
     "1e-6 and the sampler's at 0."),
    ("score_centering_tis", ScoreCenteringConfig(use_tis=True), "Token TIS clamp(rho_t, 0, 2) plus score centering "
     "with the same f = clamp(x, 0, 2) on the head (floors: trainer 1e-6, sampler 0)."),
    ("score_centering_exact", ScoreCenteringConfig(use_sampling_support_replay=True), "REINFORCE, weight 1, plus "
     "score centering over the replayed top-p / top-k support, the trainer renormalised on it, no tail; quirk: Miles "
     "adds sum q f log p' without seqis's - p' (the same gradient, since sum p' grad log p' = 0; its sc_correction "
     "value is larger by -sum p' log p', the trainer's entropy on the support), and its sampled token's log pi is "
     "the renormalised one (the batch must carry that)."),
]

_OWN = {"opsm": (_OPSM, "; a token with |l| > 20 has no gradient (Miles clamps PPO's log-ratio, #1363)")}

PRESETS = [*(Preset(f"miles/{name}", summary[:-1] + _OWN[name][1] + "." if name in _OWN else summary,
                    _WHERE[name][0], _OWN[name][0] if name in _OWN else est, cfg, exporter="miles",
                    versions=_WHERE[name][1]) for name, summary, est, cfg in ROWS),
           *(Preset(f"miles/{name}", summary, SC_SOURCE, _SCORE, cfg, exporter="miles", versions=SC_VERSIONS)
             for name, cfg, summary in _SC_ROWS)]
