"""A correction built from the mechanism's parts: one knob per part, so the app draws its widgets like any config.

    weight      level (none / token / sequence / geometric / prefix), truncated at clip (and raised to clip_low),
                or masked to [band_low, band_high] (its edges compared in log or ratio space); optionally divided
                by its batch mean
    rule 1, 2   a rejection criterion each: statistic (ratio / k1 / k2 / k3 / prob_diff / e^|l| / |rho - 1| /
                the binary KLs), aggregation over the rollout (token / sum / mean / max / min), a band (inclusive
                or open; a ratio's in log or ratio space), an optional advantage sign, and whether its dropped
                tokens leave the token count
    batch       M2PO's batch rule (its threshold); clamp orders: the criteria's and the weight's, each token's
                log-ratio first or a rollout's aggregate
    penalty     coef * f(l_t) on every loss token (f = l^2 or k3);  clamp: log-ratios clamped to +-clamp first

The default is a geometric gate [0.5, 2] with token weights truncated at 2 (verl's geo RS + token TIS, wider).
It is PRESETS["custom/composition"] (framework "custom", not a framework's): `run("custom/composition", batch,
cfg)` like any preset, so the app's picker and widgets need nothing else.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..core.compose import (
    ADVANTAGE_SIGNS,
    AGGREGATES,
    CLAMP_ORDERS,
    EDGE_SPACES,
    PENALTIES,
    STATISTICS,
    WEIGHT_LEVELS,
    BatchRule,
    Composition,
    Criterion,
    Penalty,
    Weight,
)
from ..core.spec import Preset
from ..core.types import Config, knob
from ._preset import framework_estimator

RULES = (None, *STATISTICS)  # a rule's statistic, None = no rule
SIGNS = (None, *ADVANTAGE_SIGNS)
_EDGE = dict(optional=True, ui=(-2.0, 4.0))  # a rule's band edge: ratio units, or the statistic's own
_STAT = "the statistic (None = no rule)"
_AGG = "per token, or over the rollout's loss tokens"
_SIGN = "only drop tokens whose advantage has this sign"
_SPACE = ("a ratio band's edges: l against log C (verl, prime-rl), or exp(l) against C in the compute dtype (TRL, "
          "ms-swift, open-instruct)")


@dataclass(frozen=True)
class CustomConfig(Config):
    weight_level: str = knob("token", "The IS weight: 1, rho_t, exp(S), exp(S/T) or the prefix ratio.",
                             choices=WEIGHT_LEVELS)
    weight_clip: float = knob(2.0, "Truncate the weight at this (inf = no truncation).", gt=0.0, ui=(1.0, 100.0),
                              log=True, inf=True)
    weight_clip_low: float = knob(0.0, "Raise the weight to at least this (0 = none).", ge=0.0, ui=(0.0, 1.0))
    weight_band_low: float | None = knob(None, "Drop where the weight is below this (None = no band).",
                                         optional=True, ge=0.0, ui=(0.0, 1.0))
    weight_band_high: float | None = knob(None, "Drop where the weight is above this (None = no band).",
                                          optional=True, gt=0.0, ui=(1.0, 100.0), log=True)
    weight_band_space: str = knob("log", f"The weight's band: {_SPACE}.", choices=EDGE_SPACES)
    weight_self_normalize: bool = knob(False, "Divide the weight by its batch mean.", choices=(False, True))
    rule1_statistic: str | None = knob("ratio", f"Rule 1: {_STAT}.", optional=True, choices=RULES)
    rule1_agg: str = knob("mean", f"Rule 1: {_AGG}.", choices=AGGREGATES)
    rule1_low: float | None = knob(0.5, "Rule 1: keep when the statistic is >= this (None = open).", **_EDGE)
    rule1_high: float | None = knob(2.0, "Rule 1: keep when the statistic is <= this (None = open).", **_EDGE)
    rule1_advantage: str | None = knob(None, f"Rule 1: {_SIGN}.", optional=True, choices=SIGNS)
    rule1_strict: bool = knob(False, "Rule 1: open edges (keep low < statistic < high).", choices=(False, True))
    rule1_leaves_normaliser: bool = knob(False, "Rule 1: its dropped tokens leave the loss's token count.",
                                          choices=(False, True))
    rule1_edge_space: str = knob("log", f"Rule 1 (on the ratio): {_SPACE}.", choices=EDGE_SPACES)
    rule2_statistic: str | None = knob(None, f"Rule 2: {_STAT}.", optional=True, choices=RULES)
    rule2_agg: str = knob("token", f"Rule 2: {_AGG}.", choices=AGGREGATES)
    rule2_low: float | None = knob(None, "Rule 2: keep when the statistic is >= this (None = open).", **_EDGE)
    rule2_high: float | None = knob(None, "Rule 2: keep when the statistic is <= this (None = open).", **_EDGE)
    rule2_advantage: str | None = knob(None, f"Rule 2: {_SIGN}.", optional=True, choices=SIGNS)
    rule2_strict: bool = knob(False, "Rule 2: open edges (keep low < statistic < high).", choices=(False, True))
    rule2_leaves_normaliser: bool = knob(False, "Rule 2: its dropped tokens leave the loss's token count.",
                                          choices=(False, True))
    rule2_edge_space: str = knob("log", f"Rule 2 (on the ratio): {_SPACE}.", choices=EDGE_SPACES)
    penalty_coef: float = knob(0.0, "Add coef * f(l_t) on every loss token (0 = none).", ge=0.0, ui=(0.0, 0.1))
    penalty_statistic: str = knob("squared_log_ratio", "f: l^2 (prime-rl's KL) or k3 = rho - 1 - l.",
                                  choices=PENALTIES)
    log_ratio_clamp: float | None = knob(None, "Clamp log-ratios to [-c, c] first (verl: 20).", optional=True,
                                         gt=0.0, ui=(1.0, 40.0))
    clamp_order: str = knob("token", "The clamp on a rollout's sum / mean: each token's first (verl) or the "
                            "aggregate's (SkyRL, slime).", choices=CLAMP_ORDERS)
    weight_clamp_order: str = knob("aggregate", "The clamp on the weight's exponent: the aggregate of the raw "
                                   "log-ratios (verl, SkyRL, slime) or each token's first (ms-swift, open-instruct).",
                                   choices=CLAMP_ORDERS)
    batch_rule_threshold: float | None = knob(None, "M2PO: drop the batch's largest l^2 until their mean is below "
                                              "this (None = off).", optional=True, gt=0.0, ui=(0.001, 1.0), log=True)

    def __post_init__(self):
        super().__post_init__()
        compose(self)  # the parts validate themselves: a bad combination is refused naming the part

def _criterion(cfg: CustomConfig, n: int) -> Criterion | None:
    statistic = getattr(cfg, f"rule{n}_statistic")
    if statistic is None:
        return None
    return Criterion(statistic, getattr(cfg, f"rule{n}_agg"), low=getattr(cfg, f"rule{n}_low"),
                     high=getattr(cfg, f"rule{n}_high"), advantage=getattr(cfg, f"rule{n}_advantage"),
                     strict=getattr(cfg, f"rule{n}_strict"),
                     leaves_normaliser=getattr(cfg, f"rule{n}_leaves_normaliser"),
                     edge_space=getattr(cfg, f"rule{n}_edge_space"))


def compose(cfg: CustomConfig) -> Composition:
    lo, hi = cfg.weight_band_low, cfg.weight_band_high
    band = None if lo is None and hi is None else (lo or 0.0, math.inf if hi is None else hi)
    weight = Weight() if cfg.weight_level == "none" else Weight(  # weight 1 takes no clip, band or normalisation
        cfg.weight_level, clip=cfg.weight_clip, clip_low=cfg.weight_clip_low, band=band,
        self_normalize=cfg.weight_self_normalize, edge_space=cfg.weight_band_space)
    criteria = tuple(c for c in (_criterion(cfg, 1), _criterion(cfg, 2)) if c is not None)
    penalty = Penalty(cfg.penalty_coef, cfg.penalty_statistic) if cfg.penalty_coef > 0 else None
    batch_rule = None if cfg.batch_rule_threshold is None else BatchRule(cfg.batch_rule_threshold)
    return Composition(weight, criteria, penalty=penalty, log_ratio_clamp=cfg.log_ratio_clamp, adv_tau=cfg.adv_tau,
                       clamp_order=cfg.clamp_order, batch_rule=batch_rule, weight_clamp_order=cfg.weight_clamp_order)


CUSTOM = Preset("custom/composition", "A correction built from the mechanism's parts: a weight, two rules, a "
                "penalty.", "seqis: seqis/presets/custom.py", framework_estimator(
                    "custom", compose, CustomConfig, "A custom composition."), CustomConfig(),
                versions="seqis's own: not a framework's")
PRESETS = [CUSTOM]
