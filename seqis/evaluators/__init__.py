"""Evaluators: a `Composition` on a `Batch` -> an `EstimatorOutput`.

`plain` is the definition (every composition, read top to bottom); `fast` computes the same outputs once per batch and
shares them between compositions (`Ratios`, `Cache`): its rejection rules in `rules`, its rows form in `rows`, its
outputs (loss, metrics, per-rollout values) in `outputs`, its primitives in `kernels`. `compiled` is one
`torch.compile`d graph for the compositions it knows, used when `compiled_status()` says so (decided once per process).
"""

from .compiled import compiled_status

__all__ = ["compiled_status"]
