"""A composition as Miles command-line flags: slime's flags (see slime.py), with Miles's function paths.

Miles's PPO (compute_policy_loss, #1363) clamps its log-ratio to +-20: with --use-rollout-logprobs a token beyond
it has no gradient. The composition writes that as a ratio rejection [e^-20, e^20] on every token, read here as
Miles's own; a PPO-clip on pi/mu without it gets a NOTE."""

from __future__ import annotations

import math
from dataclasses import replace

from ..core.compose import SAFETY_BOUND, Composition
from . import slime
from ._format import Settings

HEADER = ["Miles training flags (slime's, same code)"]
SUFFIX = "miles.sh"
PARTS = frozenset({"clamp_order", "normalize_all"})  # the later parts it writes (_parts.later_parts)
_ICEPOP = "miles.backends.training_utils.loss_hub.corrections.icepop_function"
_MIS = "examples.infra_features.train_infer_mismatch_helper.mis.compute_mis_weights_with_cp"


_BAND = (math.exp(-SAFETY_BOUND), math.exp(SAFETY_BOUND))


def settings(comp: Composition) -> Settings:
    band = [c for c in comp.criteria if (c.statistic, c.agg, c.advantage, c.low, c.high) == ("ratio", "token", None,
                                                                                           *_BAND)]
    comp = replace(comp, criteria=tuple(c for c in comp.criteria if c not in band))
    s = slime.settings(comp, icepop=_ICEPOP, mis=_MIS)
    if not band and comp.ppo_clip() is not None:
        s.notes.append("Miles clamps PPO's log-ratio at +-20: a token beyond it has no gradient")
    return s


write = slime.write
