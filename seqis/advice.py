"""`seqis.advice.advise`: the name docs/design.md and the shared design use for seqis.diagnosis.advice.advise (what a
batch means for each correction, compared over the registry and the relevant presets, knobs fitted to the batch)."""

from .diagnosis.advice import Advice, EstimatorReading, advise

__all__ = ["Advice", "EstimatorReading", "advise"]
