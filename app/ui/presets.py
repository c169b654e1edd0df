"""Explore's view keys, its first view, and the presets Learn offers (each opens Explore with a setting).

A view is a dict of Explore's widget keys (see `explore_view`); `state.set_view` applies one and
`state.query` turns it into the query parameters of a shareable link.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from seqis import SEED_ESTIMATORS

PREFIX = "ex."

# The first screen: a long-tailed Gaussian batch (256 rollouts up to 4096 tokens) under the four seed
# estimators. Seq TIS clips the long rollouts (their w = exp(S) spreads like s sqrt(T)); MIS-PO's narrow
# trajectory band rejects the short ones (S/T spreads like s / sqrt(T)); Li's [0.5, 2] band keeps all.
FIRST_SCENARIO = "gaussian"
FIRST_BATCH = {"max_len": 4096}
FIRST_ESTIMATORS = list(SEED_ESTIMATORS)


def key_estimators() -> str:
    return f"{PREFIX}est"


def key_knob(estimator: str, knob: str) -> str:
    return f"{PREFIX}{estimator}.{knob}"


def key_scenario_knob(scenario: str, knob: str) -> str:
    return f"{PREFIX}sc.{scenario}.{knob}"


def explore_view(
    *,
    estimators: list[str] | None = None,
    knobs: dict[str, dict[str, Any]] | None = None,
    scenario: str | None = None,
    batch: dict[str, Any] | None = None,
    seed: int | None = None,
    rollout: int | None = None,
) -> dict[str, Any]:
    """Explore's widget keys for a view: the estimators shown and their knobs, a synthetic scenario and
    its knobs, the seed, the rollout picked. Unnamed keys keep their defaults."""
    view: dict[str, Any] = {f"{PREFIX}source": "synthetic"}
    if estimators is not None:
        view[key_estimators()] = list(estimators)
    for est, values in (knobs or {}).items():
        for k, v in values.items():
            view[key_knob(est, k)] = v
    if scenario is not None:
        view[f"{PREFIX}scenario"] = scenario
    sc = scenario or FIRST_SCENARIO
    for k, v in {**(FIRST_BATCH if sc == FIRST_SCENARIO else {}), **(batch or {})}.items():
        view[key_scenario_knob(sc, k)] = v
    if seed is not None:
        view[f"{PREFIX}seed"] = seed
    if rollout is not None:
        view[f"{PREFIX}rollout"] = rollout
    return view


@dataclass(frozen=True)
class Preset:
    label: str
    help: str
    view: dict[str, Any] = field(default_factory=dict)


def _p(label: str, help: str, **kw) -> Preset:
    return Preset(label, help, explore_view(**kw))


# estimator -> its presets (the first is always "its defaults beside the seed estimators")
PRESETS: dict[str, list[Preset]] = {
    "seq_tis": [
        _p("Li's C = 2 vs no clip", "Seq TIS at C = 2 beside untruncated sequence IS: the clip caps the weights "
           "of long rollouts, sequence IS lets a few dominate (ESS collapses).",
           estimators=["seq_tis", "seq_is"], knobs={"seq_tis": {"seq_clip": 2.0}}),
        _p("Older prime-rl C = 10", "The older prime-rl default clip: fewer rollouts clipped, more variance.",
           estimators=["seq_tis", "seq_is"], knobs={"seq_tis": {"seq_clip": 10.0}}),
        _p("Drift: the product explodes", "Deterministic drift r = 1.001: w = r^T crosses C = 2 at T = 693; the "
           "geometric ratio stays 1.001 at every length.",
           estimators=["seq_tis", "geo_mask"], scenario="drift", batch={"max_len": 4096, "ratio": 1.001}),
    ],
    "seq_mis": [
        _p("Li's band [0.5, 2]", "The geometric gate with Li's band and the untempered product weight inside it.",
           estimators=["seq_mis", "geo_mask", "seq_tis"]),
        _p("Gate vs product criterion", "Geometric gate (seq_mis) beside Li's product criterion (w <= C): the "
           "product criterion rejects long rollouts, the geometric gate does not.",
           estimators=["seq_mis", "seq_mis_product"]),
    ],
    "geo_mask": [
        _p("Catastrophic tokens", "A rare token with |l| ~ 10 hides in a long rollout's mean: the geometric band "
           "keeps it, a token band (MIS-PO) or the max criterion catches it.",
           estimators=["geo_mask", "mis_po", "max_mask"], scenario="catastrophic", batch={"max_len": 4096}),
        _p("With a token clip", "Geo-Mask-Token-TIS: the geometric gate, then each kept token weighs "
           "min(rho_t, 2).", estimators=["geo_mask", "token_tis"], knobs={"geo_mask": {"token_clip": 2.0}}),
    ],
    "mis_po": [
        _p("Step 3.5 Flash bands", "Token band [0.5, 2] and trajectory band [0.996, 1.001]: short rollouts are "
           "rejected more, long ones pass iff the per-token KL is below 0.004 nats.",
           estimators=["mis_po", "geo_mask"]),
        _p("Above the KL cutoff", "s = 0.1 gives a per-token KL of 0.005 > 0.004: MIS-PO's trajectory band "
           "now rejects the long rollouts too.", estimators=["mis_po", "seq_tis"],
           batch={"max_len": 4096, "s": 0.1}),
    ],
    "pg": [_p("No correction vs seq TIS", "Plain REINFORCE on the sampler's tokens beside truncated sequence IS.",
              estimators=["pg", "seq_tis"])],
    "seq_is": [_p("Unbiased, heavy-tailed", "Untruncated sequence IS: a handful of long rollouts carry the batch.",
                  estimators=["seq_is", "seq_tis"])],
    "token_tis": [_p("Token TIS vs seq TIS", "Truncating each token's ratio (Yao et al.) beside truncating the "
                     "product: token TIS corrects tokens, not the state distribution.",
                     estimators=["token_tis", "seq_tis"])],
    "icepop": [_p("IcePop on catastrophes", "IcePop's band [0.5, 5] zeroes catastrophic tokens one by one.",
                  estimators=["icepop", "mis_po"], scenario="catastrophic", batch={"max_len": 4096})],
    "seq_mis_product": [_p("Product criterion", "Li's Seq-MIS: drop rollouts with w > C; long rollouts go first.",
                           estimators=["seq_mis_product", "seq_tis"])],
    "geo_is": [_p("GeoMean IS", "The geometric ratio as the weight (GSPO-style), beside seq TIS.",
                  estimators=["geo_is", "seq_tis"])],
    "prefix_is": [_p("Prefix ratios", "The cumulative prefix ratio: late tokens carry nearly the full product.",
                     estimators=["prefix_is", "seq_tis", "token_tis"])],
    "max_mask": [_p("Max criterion", "Drop a rollout if any token leaves [0.5, 2] (verl's veto): long rollouts "
                    "are dropped more.", estimators=["max_mask", "geo_mask"], scenario="catastrophic",
                    batch={"max_len": 4096})],
}


def presets_for(name: str) -> list[Preset]:
    """An estimator's presets; one that opens it beside the seed estimators when it has none."""
    own = PRESETS.get(name, [])
    default = _p("Defaults", f"{name} with its default knobs beside the seed estimators.",
                 estimators=[name, *[e for e in SEED_ESTIMATORS if e != name]])
    return [*own, default]
