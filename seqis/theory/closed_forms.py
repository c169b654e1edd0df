"""What valid IS noise gives in closed form for a correction, read from its composition (never from its name).

Under l_t ~ N(-s^2/2, s^2) i.i.d. (seqis.theory.formulas), a correction is covered when its rollouts are decided by one
band on the ratio at the rollout level and its weight is 1 or the sequence weight:

    one rollout rule             accepted                     a criterion by mean: the geometric band;
                                                              by sum, or a sequence weight's band (0 < w <= C):
                                                              the product band; max / min: every token's band
    weight 1, no token rule      weight_mean = accepted, weight_var = accepted (1 - accepted)   (0/1 weights)
    min(w, C), nothing rejected  seq_tis_moments (C = inf: seq_is, mean 1 and variance e^(T s^2) - 1);
                                 clipped = P(w > C)
    1[w <= C] w, nothing else    seq_mis_product_moments

A token rule beside a rollout rule (mis_po's token band) is taken as never emptying a rollout: the acceptance is
the rollout rule's (a rollout loses all its T tokens with probability (1 - p)^T). A rule conditioned on the
advantage's sign, on another statistic than the ratio, or two rollout rules at once: not covered (None).
The weight's moments ignore the e^40 cap, as theory does; a log-ratio clamp or self-normalisation leaves them
uncovered. Every entry's closed form is tested against a simulation (tests/test_closed_forms.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core.types import Config
from ..registry import resolve
from . import formulas as theory

# a rollout band's level -> the acceptance of a band [low, high] on it
_ACCEPT = {"geometric": theory.geo_band_acceptance, "sequence": theory.product_band_acceptance,
           "every": theory.max_band_acceptance}


@dataclass(frozen=True)
class ClosedForm:
    """Closed forms at the lengths T (numpy arrays over T); None where the composition is not covered.

    accepted: the fraction of rollouts its one rollout-level band keeps (rollouts["accepted"]); None when no
    rollout-level band decides it (nothing drops rollouts, or only token rules do).
    clipped: the fraction whose sequence weight is truncated (rollouts["clipped"]), when nothing is rejected.
    weight_mean, weight_var: of the applied rollout weight (rollouts["weight"]; 0 for a dropped rollout)."""

    accepted: np.ndarray | None = None
    clipped: np.ndarray | None = None
    weight_mean: np.ndarray | None = None
    weight_var: np.ndarray | None = None


def closed_form(x, cfg: Config | None, T, s: float) -> ClosedForm | None:
    """The closed forms of a correction (a name, a preset key or a Composition; cfg its config or None) at the
    lengths T (array-like, each > 0) and noise scale s; None when its rollout rules are not covered."""
    comp = resolve(x, cfg)
    T = np.asarray(T, dtype=np.float64)
    bands = comp.rollout_bands()
    if bands is None or len(bands) > 1:
        return None
    w = comp.weight
    token_rules = bool(comp.token_rules)
    exact = comp.log_ratio_clamp is None and not w.self_normalize  # the weight's moments are covered
    if bands:
        band = bands[0]
        lo, hi = band.low, band.high
        accepted = np.asarray(_ACCEPT[band.level](T, s, lo, hi), dtype=np.float64)
        if w.level == "none" and not token_rules:  # a 0/1 weight: Bernoulli(accepted)
            return ClosedForm(accepted, weight_mean=accepted, weight_var=accepted * (1 - accepted))
        product_mask = (band.level == "sequence" and lo == 0.0 and w.level == "sequence" and w.band is not None
                        and not w.truncated and not comp.criteria)
        if product_mask and exact:  # 1[w <= C] w
            mean, var = theory.seq_mis_product_moments(T, s, hi)
            return ClosedForm(accepted, weight_mean=np.asarray(mean), weight_var=np.asarray(var))
        return ClosedForm(accepted)
    if w.level == "sequence" and w.clip_low == 0.0:  # min(w, C), C = inf when untruncated
        clipped = 1.0 - np.asarray(theory.product_band_acceptance(T, s, 0.0, w.upper)) if w.truncated else None
        if token_rules or not exact:
            return ClosedForm(clipped=clipped)
        mean, var = theory.seq_tis_moments(T, s, w.upper)
        return ClosedForm(clipped=clipped, weight_mean=np.asarray(mean), weight_var=np.asarray(var))
    if w.level == "none" and not token_rules:  # pg: every weight 1
        return ClosedForm(weight_mean=np.ones_like(T), weight_var=np.zeros_like(T))
    return ClosedForm()


__all__ = ["ClosedForm", "closed_form"]
