"""What the estimator files share: the knobs of a band's edges, and the float64 log-ratios their references
start from. Nothing here is used by the evaluators (seqis/evaluators/): a reference is checked
against them, so it must not share their code."""

from __future__ import annotations

import math

import torch

from ..core.types import Batch, knob

CAP = 40.0  # every weight is at most e^40 (DESIGN: min(w_j, e^40))
GEO = "the rollout's geometric ratio exp(S/T)"
TOKEN = "each token's ratio rho_t"


def band_low(default: float, what: str, ui: tuple[float, float] = (0.01, 1.0)):
    """The lower edge of a ratio band (inclusive; 0 opens it): `what` says what it bounds."""
    return knob(default, f"Lower edge of the band on {what}: below it the gradient is dropped (0 opens it).",
                ge=0.0, ui=ui, log=True)


def band_high(default: float, what: str, ui: tuple[float, float] = (1.0, 100.0)):
    """The upper edge of a ratio band (inclusive; inf opens it)."""
    return knob(default, f"Upper edge of the band on {what}: above it the gradient is dropped (inf opens it).",
                gt=0.0, ui=ui, log=True)


def log_ratios(batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """(m, l): the loss mask (B, T) and l_t = log pi - log mu on loss tokens in float64, 0 elsewhere."""
    m = batch.loss_mask
    return m, torch.where(m, batch.trainer_logprobs.detach().double() - batch.inference_logprobs.double(), 0.0)


def log_edge(x: float) -> float:
    """A band edge or clip in log space: log 0 = -inf, log inf = inf."""
    return math.log(x) if x > 0 else -math.inf
