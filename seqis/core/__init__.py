"""The records everything else reads: the rollout batch, an estimator's output and its declared knobs (`types`), the
correction as data (`compose`), the registry's records (`spec`), and a batch's shared log-ratios (`ratios`).

Nothing here evaluates a correction; the evaluators (seqis/evaluators/) do, and import only this layer.
"""
