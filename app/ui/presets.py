"""Explore's view keys, its first view, and the presets Learn offers: each opens the page where its point lives
(Explore, Length & thresholds, Bias & variance or Training) with a setting, and that page says why on arrival.

A view is a dict of a page's widget keys (Explore's: see `explore_view`; the others' keys start "lt.", "bv.",
"tr."); `state.set_view` applies one and `state.query` turns it into the query parameters of a shareable link.
`open_preset` does both and leaves the preset's message for `arrival`, which the page it opens calls.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import streamlit as st

from seqis import SEED_ESTIMATORS

from .state import query, set_view, switch_page

PREFIX = "ex."

# The first screen: a long-tailed Gaussian batch (256 rollouts up to 4096 tokens) under the four seed
# estimators. Seq TIS clips the long rollouts (their w = exp(S) spreads like s sqrt(T)); MIS-PO's narrow
# trajectory band rejects the short ones (S/T spreads like s / sqrt(T)); Li's [0.5, 2] band keeps all.
FIRST_SCENARIO = "gaussian"
FIRST_BATCH = {"max_len": 4096}
FIRST_ESTIMATORS = list(SEED_ESTIMATORS)
# Compare's first view: three frameworks' defaults (verl's token TIS, TRL's default sequence mask, prime-rl's IPO)
COMPARE_FIRST = ["verl/decoupled_token_is", "trl/sequence_mask", "prime-rl/default"]
COMPARE_HEAD = "verl/bypass_pg_sc"  # on a batch with the sampler's head: score centering as a fourth column


def compare_first(has_head: bool) -> list[str]:
    """Compare's first picks: three frameworks' defaults, and score centering where the batch has a head."""
    return [*COMPARE_FIRST, COMPARE_HEAD] if has_head else list(COMPARE_FIRST)


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


# the pages a preset can open, by the prefix of their widget keys
PAGES = {"ex": "views/explore.py", "lt": "views/length_thresholds.py", "bv": "views/bias_variance.py",
         "tr": "views/training.py"}
TITLES = {"ex": "Explore", "lt": "Length & thresholds", "bv": "Bias & variance", "tr": "Training"}


@dataclass(frozen=True)
class Preset:
    """label (its button), help (what it shows: the tooltip, and the caption on arrival), view (the widget keys it
    sets), page (the key prefix of the page it opens: "ex", "lt", "bv" or "tr"), look (where on that page to look)."""

    label: str
    help: str
    view: dict[str, Any] = field(default_factory=dict)
    page: str = "ex"
    look: str = ""

    @property
    def path(self) -> str:
        return PAGES[self.page]


def _p(label: str, help: str, **kw) -> Preset:
    return Preset(label, help, explore_view(**kw))


def _on(page: str, label: str, help: str, view: dict[str, Any], look: str) -> Preset:
    """A preset that opens another page than Explore."""
    if not all(k.startswith(page + ".") for k in view):
        raise ValueError(f"preset {label!r}: every key of a {page!r} view starts with '{page}.', got {list(view)}")
    return Preset(label, help, dict(view), page, look)


ARRIVAL = "presets.arrival"  # session state: (page prefix, label, message) the page shows once


def open_preset(preset: Preset) -> None:
    """Apply the preset's view on top of its page's defaults and switch there; the page then says what to look at
    (`arrival`). Call from a button's run (st.switch_page stops the script)."""
    set_view(preset.view, reset=preset.page + ".")
    st.session_state[ARRIVAL] = (preset.page, preset.label, preset.help, preset.look)
    switch_page(preset.path, query(preset.view))


def arrival(page: str) -> None:
    """On the page with key prefix `page`: the message of the preset that just opened it, once."""
    held = st.session_state.get(ARRIVAL)
    if held is None or held[0] != page:
        return
    del st.session_state[ARRIVAL]
    _, label, text, look = held
    st.info(f"**{label}.** {text}" + (f" Look at **{look}**." if look else ""), icon=":material/school:")


# estimator -> its presets (each opens the page where its point lives)
PRESETS: dict[str, list[Preset]] = {
    "seq_tis": [
        _p("Li's C = 2 vs no clip", "Seq TIS at C = 2 beside untruncated sequence IS: the clip caps the weights "
           "of long rollouts, sequence IS lets a few dominate (ESS collapses).",
           estimators=["seq_tis", "seq_is"], knobs={"seq_tis": {"seq_clip": 2.0}}),
        _p("Older prime-rl C = 10", "The older prime-rl default clip: fewer rollouts clipped, more variance.",
           estimators=["seq_tis", "seq_is"], knobs={"seq_tis": {"seq_clip": 10.0}}),
        _on("bv", "The best clip", "On a bit chain (H = 16, k = 11, p = 0.55, q = 0.45, 128 rollouts a batch) the "
            "MSE of seq TIS has an interior minimum: exact best C = 1.83, Li's C* = √(2(1+χ²)) = 1.94 with χ² = "
            "0.885, the whole rollout's. Clip harder and bias grows, clip less and variance does.",
            {"bv.H": 16, "bv.k": 11, "bv.p": 0.55, "bv.q": 0.45, "bv.est": ["seq_tis", "seq_is", "token_tis"],
             "bv.sweep": "seq_tis · seq_clip"}, "the sweep at the bottom (the star and the dashed C*)"),
        _on("lt", "Drift: the product explodes", "Deterministic drift r = 1.001: w = r^T crosses C = 2 at T = 693; "
            "the geometric ratio stays 1.001 at every length.", {"lt.r": 1.001, "lt.drift_C": 2.0},
            "Deterministic drift, at the bottom"),
    ],
    "seq_mis": [
        _p("Li's band [0.5, 2]", "The geometric gate with Li's band and the untempered product weight inside it.",
           estimators=["seq_mis", "geo_mask", "seq_tis"]),
        _on("lt", "Gate vs product criterion", "The product weight's band rejects long rollouts (its log spreads "
            "like s√T); the same band on the geometric ratio keeps them all at s = 0.05.", {},
            "the first chart, Acceptance vs length"),
        _on("lt", "Where Li's band cuts", "s = 1.2 gives a per-token KL of 0.72 nats, past the band's cutoff −log 0.5 "
            "= 0.69: now the geometric band [0.5, 2] rejects long rollouts too, more the longer they are.",
            {"lt.s": 1.2}, "the geometric band's line in Acceptance vs length"),
    ],
    "geo_mask": [
        _on("lt", "Catastrophic tokens", "One token with l = −10 among on-policy tokens: the geometric band "
            "[0.5, 2] lets it through once T ≥ 10 / log 2 = 14.4 (long rollouts dilute it); a token band (mis_po) "
            "or the max criterion catches it at every length.", {"lt.L": 10}, "Catastrophic-token dilution"),
        _p("With a token clip", "Geo-Mask-Token-TIS: the geometric gate, then each kept token weighs "
           "min(rho_t, 2).", estimators=["geo_mask", "token_tis"], knobs={"geo_mask": {"token_clip": 2.0}}),
    ],
    "mis_po": [
        _on("lt", "Step 3.5 Flash bands", "Token band [0.5, 2] and trajectory band [0.996, 1.001]: short rollouts "
            "are rejected more, long ones pass iff the per-token KL is below −log 0.996 = 0.004 nats.", {},
            "the KL-cutoff chart and mis_po's line in Acceptance vs length"),
        _on("lt", "Above the KL cutoff", "s = 0.1 gives a per-token KL of 0.005 > 0.004: MIS-PO's trajectory band "
            "now rejects the long rollouts too.", {"lt.s": 0.1}, "mis_po's line in Acceptance vs length"),
    ],
    "pg": [_on("bv", "No correction vs seq TIS", "Plain REINFORCE on the sampler's tokens beside truncated and "
               "untruncated sequence IS, on Huang's chain: naive PG's mean gradient is 29% of the true one.",
               {"bv.est": ["pg", "seq_tis", "seq_is"]}, "the relative bias in the table")],
    "seq_is": [_p("Unbiased, heavy-tailed", "Untruncated sequence IS: a handful of long rollouts carry the batch.",
                  estimators=["seq_is", "seq_tis"])],
    "token_tis": [
        _on("bv", "Token IS on Huang's chain", "Token IS corrects every token, yet on Huang's chain (reward 1[sum "
            "of bits ≥ 40]) its mean gradient is 57% of the true one: the other tokens still come from μ.",
            {"bv.est": ["token_tis", "seq_tis", "seq_is"]}, "the caption under the three tiles"),
        _on("bv", "Additive reward: unbiased", "The same chain with the reward the sum of the bits: every token is "
            "rewarded on its own and token IS is unbiased (100% of the true gradient).",
            {"bv.bit_reward": "additive", "bv.est": ["token_tis", "seq_is", "pg"]}, "the relative bias in the table"),
    ],
    "icepop": [_p("IcePop on catastrophes", "IcePop's band [0.5, 5] zeroes catastrophic tokens one by one.",
                  estimators=["icepop", "mis_po"], scenario="catastrophic", batch={"max_len": 4096})],
    "seq_mis_product": [_on("lt", "Product criterion", "Li's Seq-MIS: drop rollouts with w > C; long rollouts go "
                            "first, and the kept mass E[w 1(w ≤ C)] falls towards 0.", {"lt.clip.seq_clip": 2.0},
                            "seq_mis_product in Acceptance vs length and the moments chart")],
    "geo_is": [
        _p("GeoMean IS", "The geometric ratio as the weight (GSPO-style), beside seq TIS.",
           estimators=["geo_is", "seq_tis"]),
        _on("tr", "Under policy lag", "Training with rollouts 100 updates stale (H = 128, 512 rollouts an update): "
            "GeoMean IS and token IS stop learning, sequence IS keeps going.",
            {"tr.H": 128, "tr.f": 0.65, "tr.K": 100, "tr.B": 512, "tr.lr": 10.0, "tr.seeds": 2},
            "the learning curves"),
    ],
    "prefix_is": [_p("Prefix ratios", "The cumulative prefix ratio: late tokens carry nearly the full product.",
                     estimators=["prefix_is", "seq_tis", "token_tis"])],
    "max_mask": [_on("lt", "Max criterion", "Drop a rollout if any token leaves [0.5, 2] (verl's veto): it catches "
                     "a catastrophic token at every length, where the geometric band lets it through past "
                     "T = 14.4.", {"lt.L": 10}, "Catastrophic-token dilution")],
}


def presets_for(name: str) -> list[Preset]:
    """An estimator's presets; one that opens it beside the seed estimators when it has none."""
    own = PRESETS.get(name, [])
    default = _p("Defaults", f"{name} with its default knobs beside the seed estimators.",
                 estimators=[name, *[e for e in SEED_ESTIMATORS if e != name]])
    return [*own, default]
