"""How the explorer prints a number, on every page: four significant digits, thousands separators on whole
numbers below a million, scientific notation past it (a chi-square of 4.33e+41, not 42 digits with commas)."""

from __future__ import annotations

import math

SCIENTIFIC = 1e6  # |x| from here on prints as 4.3e+41


def number(v, digits: int = 4) -> str:
    """One cell or figure: '' for a missing value, '193,993', '0.001254', '-0.9173', '4.33e+41', 'inf'."""
    if v is None or isinstance(v, str):
        return "" if v is None else v
    if isinstance(v, bool):
        return str(v)
    x = float(v)
    if math.isnan(x):
        return ""
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if abs(x) >= SCIENTIFIC:
        return f"{x:.{max(digits - 1, 1)}g}"
    if abs(x) >= 1000:  # whole units are enough here: 193,993 and 1,235 (not 1.235e+03)
        return f"{round(x):,}"
    return f"{x:.{digits}g}"
