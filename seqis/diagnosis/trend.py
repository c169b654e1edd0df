"""An early warning: a statistic's step against its own recent history, not against a fixed line.

Why: a monitor's KL rose ~25 steps before the reward fell (issue 43); the mean over a run hides a rise that a step's
departure from the steps just before it shows. `trend_z` reads each step's value against the trailing `window`
steps before it (not itself): the median and 1.4826 x the median absolute deviation (a past spike cannot inflate the
scale much), on the log of the statistic (the mismatch statistics are positive and move by factors; on the log a
doubling is one size of step at any level). A step alarms when its z passes `Z_ALARM` upwards.

    z = trend_z(kl_per_step)          # (n,) nan until MIN_HISTORY steps came before
    alarms = z > Z_ALARM

The false-alarm rate on clean runs (stationary mismatch, a fresh batch each step) is measured by
`scripts/measure_early_warning.py` and stated in docs/diagnose.md ("Early warning"); `CLEAN_FALSE_ALARM` holds
the figure the Run page quotes.
"""

from __future__ import annotations

import numpy as np

WINDOW = 20  # the trailing steps a step is read against
MIN_HISTORY = 8  # fewer steps before it: no z
Z_ALARM = 5.0  # an alarm: z above this
SCALE_FLOOR = 0.01  # least scale on the log (a 1% move): a run whose statistic barely moves cannot alarm on noise
MAD_SCALE = 1.4826
# measured by scripts/measure_early_warning.py (docs/diagnose.md): alarms per step on clean runs at Z_ALARM,
# the larger of the two statistics' rates (kl_k3, abs_ratio_mean) over the clean scenarios
CLEAN_FALSE_ALARM = 2e-3


def trend_z(values, window: int = WINDOW, min_history: int = MIN_HISTORY, log: bool = True) -> np.ndarray:
    """(n,) each step's z against the `window` steps before it (median, 1.4826 MAD, on the log when `log`): nan
    where fewer than `min_history` finite values came before, or the value itself is missing (nan) or not
    positive on the log."""
    x = np.asarray(values, dtype=np.float64)
    if log:
        with np.errstate(divide="ignore", invalid="ignore"):
            x = np.where(x > 0, np.log(x), np.nan)
    z = np.full(x.shape, np.nan)
    for t in range(len(x)):
        past = x[max(0, t - window):t]
        past = past[np.isfinite(past)]
        if len(past) < min_history or not np.isfinite(x[t]):
            continue
        med = float(np.median(past))
        scale = max(MAD_SCALE * float(np.median(np.abs(past - med))), SCALE_FLOOR if log else 1e-12)
        z[t] = (x[t] - med) / scale
    return z


# a statistic with a floor above 0 is read as its excess over it (abs_ratio_mean = mean exp|l| >= 1: its excess
# moves by factors as the mismatch grows, its log barely moves)
OFFSETS = {"abs_ratio_mean": 1.0}


def metric_z(metric: str, values, **kw) -> np.ndarray:
    """trend_z of a diagnostics column, read as its excess over its floor (OFFSETS) where it has one."""
    return trend_z(np.asarray(values, dtype=np.float64) - OFFSETS.get(metric, 0.0), **kw)


def alarms(values, z_alarm: float = Z_ALARM, **kw) -> np.ndarray:
    """(n,) bool: the steps whose z passes z_alarm upwards."""
    z = trend_z(values, **kw)
    return np.nan_to_num(z, nan=-np.inf) > z_alarm
