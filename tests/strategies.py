"""Hypothesis strategies the property tests share: an estimator's config drawn from its declared knobs, how many
examples a property test draws (`examples`: more under `make test`, which sets SEQIS_HYPOTHESIS=full), and the
floats of a dtype around a band edge (`ulps_around`)."""

import math
import os

import torch
from hypothesis import assume
from hypothesis import strategies as st

from seqis import ESTIMATORS, knobs

# plain `pytest` (the fast suite) draws the given number of examples; `make test` (SEQIS_HYPOTHESIS=full) draws
# FULL_FACTOR times as many
FULL_FACTOR = 3


def examples(n: int) -> int:
    """How many examples a property test with a base of n draws under the current profile."""
    return n * FULL_FACTOR if os.environ.get("SEQIS_HYPOTHESIS") == "full" else n


@st.composite
def configs(draw, name, adv_taus=None):
    """A config of the estimator with each knob at its default, an end or the middle of its slider range,
    open (0 / inf for band edges and clips) or off (None, where that is allowed). `adv_taus`: draw adv_tau
    from these values instead of its range."""
    values = {}
    for f in knobs(ESTIMATORS[name].config):
        if f.name == "adv_tau" and adv_taus is not None:
            values[f.name] = draw(st.sampled_from(adv_taus))
            continue
        lo, hi = f.metadata["ui"]
        options = [f.default, lo, hi, math.sqrt(lo * hi)]
        options += [None] if f.metadata["optional"] else [0.0 if f.metadata["ge"] == 0 else math.inf]
        values[f.name] = draw(st.sampled_from(options))
    try:
        return ESTIMATORS[name].config(**values)
    except ValueError:  # a band whose low is not below its high
        assume(False)


def ulps_around(x: float, n: int, dtype: torch.dtype) -> list[float]:
    """The 2n + 1 values of dtype nearest x: n below its rounding, the rounding, n above."""
    v = torch.tensor(x, dtype=dtype)
    down, up = [v], [v]
    for _ in range(n):
        down.append(torch.nextafter(down[-1], torch.tensor(-math.inf, dtype=dtype)))
        up.append(torch.nextafter(up[-1], torch.tensor(math.inf, dtype=dtype)))
    return [float(t) for t in [*reversed(down[1:]), v, *up[1:]]]
