"""The estimator table: one row per estimator, each a file of this package.

An estimator's file is its definition: a docstring (the formula in plain text, what it trades, what it reduces
to, its source), LATEX (the weight as a formula for the explorer), its frozen config class (CONFIG, knobs declared
once), `compose(cfg) -> Composition` (the correction as data, which the evaluators run) and `reference(batch, cfg)
-> (weights, kept)` (the formula in plain float64 torch, which the tests hold the evaluators to). Adding an
estimator is one file and one row here; the app, the tests and the benchmark pick it up from this table. Names are
looked up, and run, by seqis.registry.
"""

from __future__ import annotations

from ..core.spec import EstimatorSpec
from . import (
    geo_is,
    geo_mask,
    icepop,
    max_mask,
    mis_po,
    pg,
    prefix_is,
    seq_is,
    seq_mis,
    seq_mis_product,
    seq_tis,
    token_tis,
)

_SEED = (seq_tis, seq_mis, geo_mask, mis_po)  # prime-rl's sequence-level IS ablations
_REFERENCES = (pg, seq_is, token_tis, icepop, seq_mis_product, geo_is, prefix_is, max_mask)  # for comparison

ESTIMATORS: dict[str, EstimatorSpec] = {spec.name: spec for spec in (
    *(EstimatorSpec.of(m, seed=True) for m in _SEED), *(EstimatorSpec.of(m) for m in _REFERENCES))}
SEED_ESTIMATORS: tuple[str, ...] = tuple(name for name, spec in ESTIMATORS.items() if spec.seed)

__all__ = ["ESTIMATORS", "SEED_ESTIMATORS"]
