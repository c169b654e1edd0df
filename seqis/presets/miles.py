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

from ..core.compose import SAFETY_BOUND, Composition, Criterion
from ..core.spec import Preset
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

_OWN = {"opsm": (_OPSM, "; a token with |l| > 20 has no gradient (Miles clamps PPO's log-ratio, #1363)")}

PRESETS = [Preset(f"miles/{name}", summary[:-1] + _OWN[name][1] + "." if name in _OWN else summary,
                  _WHERE[name][0], _OWN[name][0] if name in _OWN else est, cfg, exporter="miles",
                  versions=_WHERE[name][1]) for name, summary, est, cfg in ROWS]
