"""Huang's published prefix-chain results, as data: the numbers the Training page and tests compare with.

Source: L. Huang, "Is Frontier Asynchronous RL Solved?" (2026); the figures' data are the SVG tooltips of
github.com/luk-huang/personal-website, figures/prefix-chain-sim/ (figure-1-policy-lag-sweep-step7000-
estimator-panels.svg: H = 1024, seed 3, step 7,000, B = 8..4096, K = 0..1000; figure-2-3-side-by-side-
step7000.svg: the horizon and batch sweeps). Every value is the success probability J after 7,000 updates.

The horizon sweep matches figure 1 at B = 2048, K = 500 (Sequence IS 0.7487 / Token IS 0.4126 at H = 1024
appear there), and the batch sweep matches figure 1 at K = 500 (Sequence IS 0.7448 at B = 512): both used
lag 500. The post does not state the threshold, learning rate, optimiser, starting point or normalisation.

Labels: "Sequence IS" = seq_is; "Token IS" = token_tis with token_clip = inf; "GeoMean IS" = geo_is;
"Sequence TIS 0-C" = seq_tis with seq_clip = C.
"""

from __future__ import annotations

import math

from ..estimators import ESTIMATORS

STEPS = 7000
LAGS = (0, 100, 250, 500, 1000)
BATCHES = (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)

# what each published label runs, as train() takes it
ESTIMATOR_OF = {
    "Sequence IS": "seq_is",
    "Token IS": ("token_tis", ESTIMATORS["token_tis"].config(token_clip=math.inf)),
    "GeoMean IS": "geo_is",
    **{f"Sequence TIS 0-{c}": ("seq_tis", ESTIMATORS["seq_tis"].config(seq_clip=float(c))) for c in (2, 8, 32, 128)},
}

# figure 2 (left): J at step 7,000 against horizon H (B = 2048, K = 500)
HORIZON = {
    "Sequence IS": {128: 0.9853, 256: 0.9733, 512: 0.9396, 1024: 0.7487},
    "Token IS": {128: 0.9843, 256: 0.9694, 512: 0.9090, 1024: 0.4126},
    "GeoMean IS": {128: 0.9687, 256: 0.9363, 512: 0.8131, 1024: 0.3322},
}

# figure 3 (right): J at step 7,000 against batch size B (H = 1024, K = 500)
BATCH = {
    "Sequence IS": (0.1229, 0.0420, 0.4227, 0.7071, 0.7285, 0.7417, 0.7448, 0.7445, 0.7487, 0.7504),
    "Sequence TIS 0-2": (0.4674, 0.5594, 0.6499, 0.6802, 0.7097, 0.7314, 0.7387, 0.7402, 0.7456, 0.7480),
    "Sequence TIS 0-8": (0.4198, 0.5780, 0.6837, 0.7071, 0.7287, 0.7417, 0.7448, 0.7445, 0.7487, 0.7504),
    "Sequence TIS 0-32": (0.1590, 0.4445, 0.6581, 0.7071, 0.7285, 0.7417, 0.7448, 0.7445, 0.7487, 0.7504),
    "Sequence TIS 0-128": (0.1229, 0.0556, 0.5226, 0.7071, 0.7286, 0.7417, 0.7448, 0.7445, 0.7487, 0.7504),
}

# figure 1: J at step 7,000 against lag K (columns LAGS), one row per batch size (BATCHES), H = 1024
LAG = {
    "Sequence IS": (
        (0.6475, 0.5768, 0.0465, 0.1229, 0.0156), (0.6720, 0.6731, 0.3710, 0.0420, 0.1237),
        (0.7128, 0.7156, 0.7083, 0.4227, 0.1773), (0.7251, 0.7233, 0.7201, 0.7071, 0.4440),
        (0.7309, 0.7328, 0.7332, 0.7286, 0.7185), (0.7418, 0.7411, 0.7409, 0.7417, 0.7369),
        (0.7452, 0.7454, 0.7462, 0.7448, 0.7451), (0.7463, 0.7460, 0.7458, 0.7445, 0.7424),
        (0.7499, 0.7490, 0.7494, 0.7486, 0.7473), (0.7514, 0.7512, 0.7510, 0.7504, 0.7499),
    ),
    "Token IS": (
        (0.6475, 0.5966, 0.4381, 0.2976, 0.1723), (0.6720, 0.6173, 0.5088, 0.3361, 0.1830),
        (0.7128, 0.6577, 0.5456, 0.3676, 0.1950), (0.7251, 0.6632, 0.5571, 0.3825, 0.2050),
        (0.7309, 0.6798, 0.5713, 0.3901, 0.2099), (0.7418, 0.6884, 0.5821, 0.4054, 0.2187),
        (0.7452, 0.6934, 0.5903, 0.4111, 0.2219), (0.7463, 0.6931, 0.5886, 0.4077, 0.2190),
        (0.7499, 0.6973, 0.5947, 0.4126, 0.2216), (0.7514, 0.6998, 0.5968, 0.4150, 0.2230),
    ),
    "GeoMean IS": (
        (0.6475, 0.5698, 0.3713, 0.2627, 0.1432), (0.6720, 0.5744, 0.4558, 0.2716, 0.1539),
        (0.7128, 0.6214, 0.4800, 0.2994, 0.1626), (0.7251, 0.6211, 0.4797, 0.3096, 0.1679),
        (0.7309, 0.6396, 0.4922, 0.3147, 0.1711), (0.7418, 0.6496, 0.5033, 0.3273, 0.1775),
        (0.7452, 0.6541, 0.5110, 0.3312, 0.1798), (0.7463, 0.6537, 0.5091, 0.3287, 0.1777),
        (0.7499, 0.6582, 0.5142, 0.3322, 0.1793), (0.7514, 0.6608, 0.5162, 0.3340, 0.1803),
    ),
}


def frame():
    """Every published point as one long DataFrame: figure, estimator, horizon, batch_size, lag, J."""
    import pandas as pd

    rows = [{"figure": "horizon", "estimator": e, "horizon": h, "batch_size": 2048, "lag": 500, "J": j}
            for e, by_h in HORIZON.items() for h, j in by_h.items()]
    rows += [{"figure": "batch", "estimator": e, "horizon": 1024, "batch_size": b, "lag": 500, "J": j}
             for e, js in BATCH.items() for b, j in zip(BATCHES, js, strict=True)]
    rows += [{"figure": "lag", "estimator": e, "horizon": 1024, "batch_size": b, "lag": k, "J": j}
             for e, table in LAG.items() for b, js in zip(BATCHES, table, strict=True)
             for k, j in zip(LAGS, js, strict=True)]
    return pd.DataFrame(rows)
