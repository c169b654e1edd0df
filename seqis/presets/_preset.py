"""What a preset is: a framework's shipped correction as a key, a summary, its source, an estimator and its config.

A preset's estimator is an `EstimatorSpec` like the registry's: either a registry entry (prime-rl's seed four) or
an entry built on the framework's own knobs (its config class mirrors the framework's settings, and its
`compose(cfg)` translates them into a `Composition` the way the framework's code reads them). `.config` holds the
framework's defaults; `run(key, batch, cfg)` runs `estimator.compose(cfg or config)`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..estimators import EstimatorSpec
from ..estimators.compose import Composition, Criterion
from ..types import Config

# verl, SkyRL and slime's MIS clamp log-ratios to [-20, 20] before exponentiating ("SAFETY_BOUND")
SAFETY_BOUND = 20.0


@dataclass(frozen=True)
class Preset:
    key: str  # "framework/name", e.g. "verl/bypass_pg_geo_rs"
    summary: str  # one line: what it computes, its defaults, where the code differs from the docs
    source: str  # "owner/repo: path/to/file.py (function)", the code it reproduces
    estimator: EstimatorSpec  # the entry it runs: .compose(cfg) -> Composition
    config: Config  # the framework's default knob values (an instance of estimator.config)
    exporter: str | None = None  # the seqis.export exporter that writes it, when not the framework's own

    @property
    def export_framework(self) -> str:
        return self.exporter or self.framework

    @property
    def framework(self) -> str:
        return self.key.split("/", 1)[0]

    @property
    def name(self) -> str:
        return self.key.split("/", 1)[1]

    def compose(self, cfg: Config | None = None) -> Composition:
        return self.estimator.compose(self.config if cfg is None else cfg)


def framework_estimator(name: str, compose, config: type[Config], summary: str) -> EstimatorSpec:
    """An estimator entry on a framework's own knobs; reached through PRESETS, not listed in ESTIMATORS."""
    return EstimatorSpec(name=name, compose=compose, config=config, summary=summary,
                         formula=r"\text{see the composition}")


def ppo_clip_criteria(eps_low: float, eps_high: float, clip_c: float | None = None) -> tuple[Criterion, ...]:
    """Where the PPO-clip loss -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A) has a gradient, r = pi / mu:
    A > 0 needs r <= 1 + eps_high, A < 0 needs r >= 1 - eps_low (and r <= c with dual clip c); the gradient
    there is r * A, so the weight is the token ratio itself."""
    up = Criterion("ratio", "token", high=1.0 + eps_high, advantage="positive")
    down = Criterion("ratio", "token", low=1.0 - eps_low, high=clip_c, advantage="negative")
    return up, down


def log_or_none(x: float | None) -> float | None:
    return None if x is None else (math.log(x) if x > 0 else -math.inf)
