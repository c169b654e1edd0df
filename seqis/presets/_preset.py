"""What the framework files share: building a preset's estimator on the framework's own knobs, the PPO-clip
criteria (verl's / SkyRL's / slime's SAFETY_BOUND is in seqis/core/compose.py).

A preset (seqis.core.spec.Preset) runs an `EstimatorSpec` like the registry's: either a registry entry (prime-rl's
seed four) or an entry built on the framework's own knobs (its config class mirrors the framework's settings, and
its `compose(cfg)` translates them into a `Composition` the way the framework's code reads them). `.config` holds
the framework's defaults; `run(key, batch, cfg)` runs `estimator.compose(cfg or config)`.
"""

from __future__ import annotations

import math

from ..core.spec import EstimatorSpec
from ..core.types import Config


def framework_estimator(name: str, compose, config: type[Config], summary: str) -> EstimatorSpec:
    """An estimator entry on a framework's own knobs; reached through PRESETS, not listed in ESTIMATORS."""
    return EstimatorSpec(name=name, compose=compose, config=config, summary=summary,
                         formula=r"\text{see the composition}")


def log_or_none(x: float | None) -> float | None:
    return None if x is None else (math.log(x) if x > 0 else -math.inf)
