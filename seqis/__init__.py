"""seqis: sequence-level importance-sampling estimators for LLM RL with a mismatched sampler.

The trainer's policy pi and the inference engine's policy mu disagree on every token's log-probability.
With l_t = log pi(y_t) - log mu(y_t) and S_j = sum of l_t over rollout j's loss tokens (T_j of them),
the product ratio w_j = exp(S_j) is the exact importance weight of a rollout: unbiased, with variance
that grows like (1 + chi2)^T. Every estimator here trades some of that variance for bias by truncating
(seq_tis), gating on the geometric ratio exp(S_j / T_j) (seq_mis, geo_mask), or filtering tokens and
trajectories (mis_po); reference estimators (pg, seq_is, token_tis, ...) are there to compare.

    from seqis import Batch, ESTIMATORS, run, diagnostics, diagnose
    out = run("seq_tis", batch, ESTIMATORS["seq_tis"].config(seq_clip=3.0))
    out.loss.backward()            # d loss / d trainer_logprobs = -out.weights * adv_tau * A / N
    out = run("verl/bypass_pg_geo_rs", batch)   # every framework's shipped correction: seqis.PRESETS
"""

import sys

from .core.compose import Composition, Criterion, Penalty, Weight
from .core.spec import EstimatorSpec
from .core.types import Batch, Config, EstimatorOutput, Knobs, knob, knobs
from .diagnosis import advice
from .diagnosis.causes import Finding, diagnose
from .diagnosis.statistics import diagnostics
from .estimators import ESTIMATORS, SEED_ESTIMATORS
from .evaluators.plain import AGGREGATIONS
from .presets import PRESETS
from .registry import run, run_many

# `seqis.advice` (the shared design's name for the advice) is the diagnosis package's module, not another root file
sys.modules[__name__ + ".advice"] = advice

__all__ = [
    "AGGREGATIONS",
    "Batch",
    "Composition",
    "Config",
    "Criterion",
    "ESTIMATORS",
    "EstimatorOutput",
    "EstimatorSpec",
    "PRESETS",
    "SEED_ESTIMATORS",
    "Finding",
    "diagnose",
    "diagnostics",
    "Knobs",
    "knob",
    "knobs",
    "Penalty",
    "run",
    "run_many",
    "Weight",
    "advice",
]
