"""What a batch can tell about the sampler's settings: each sampler-side parameter's 95% interval, the faulty values
inside it that the batch cannot rule out, and about how many rollouts would tell (issue 45).

A detector fires beyond Z_DETECT standard errors, so a fault smaller than that is not named: a temperature of 1.1 at
96 rollouts of a peaked LM, a top-k that keeps 99.9% of the mass. Silence is then not "no fault": the verdict says
which faulty values the interval still holds. Two parameters, each from its own test:

  temperature   tau = 1 / (1 - s), s the slope of the temperature fit (`temperature_fit`); a fault is |tau - 1| >
                MIN_TEMPERATURE_SHIFT (the smallest temperature the detector reports). Without the entropy the
                interval runs on to 1: the sampler's rounding adds sigma^2 E_mu[1 - mu] > 0 to the fit's one
                moment, pushing its slope away from 0 by an amount the log-probs do not give (docs/diagnose.md).
  kept mass     E_mu[pi / mu] (`truncation_test`), the trainer's mass on the sampler's kept set: top-p and top-k both
                keep a set and give the same statistic (nucleus mass or top-k mass: the batch does not tell which);
                a fault is a deficit 1 - mass > MIN_DEFICIT.

How many rollouts would tell: the standard error shrinks as 1 / sqrt(rollouts) (rollouts are the independent
draws), so the fault at the interval's far end, Delta from the null, reaches Z_DETECT standard errors at
R (Z_DETECT se / Delta)^2 rollouts. A rough figure (the batch's own rollouts' lengths and contexts assumed).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .levels import CATASTROPHIC_LOG_RATIO, MIN_DEFICIT, MIN_TEMPERATURE_SHIFT, Z_CI, Z_DETECT


def rollouts_to_tell(n_rollouts: int, se: float, delta: float) -> int | None:
    """Rollouts at which a fault delta from the null reaches Z_DETECT standard errors (se at n_rollouts)."""
    if not (se > 0 and delta > 0 and math.isfinite(se) and n_rollouts > 0):
        return None
    return max(n_rollouts, math.ceil(n_rollouts * (Z_DETECT * se / delta) ** 2))


def temperature_interval(fit: dict[str, Any] | None, n_rollouts: int) -> dict[str, Any] | None:
    """The temperature's 95% interval and the faulty temperatures in it (beyond MIN_TEMPERATURE_SHIFT of 1) that
    the batch cannot rule out; None without a fit."""
    if fit is None or not all(math.isfinite(v) for v in fit["slope_ci"]):
        return None
    s_lo, s_hi = fit["slope_ci"]
    se = (s_hi - s_lo) / (2 * Z_CI)
    lo, hi = fit["ci"]  # tau = 1 / (1 - s): increasing in s, infinite from s = 1
    if not fit.get("uses_entropy", True):  # rounding pushes a bare fit away from 1 by an unknown amount: run to 1
        lo, hi = min(lo, 1.0), max(hi, 1.0)
    faulty = [(lo, min(hi, 1 - MIN_TEMPERATURE_SHIFT))] if lo < 1 - MIN_TEMPERATURE_SHIFT else []
    faulty += [(max(lo, 1 + MIN_TEMPERATURE_SHIFT), hi)] if hi > 1 + MIN_TEMPERATURE_SHIFT else []
    far = max(abs(s_lo), abs(s_hi))  # the far end's slope: its distance from the null s = 0
    return {"interval": [lo, hi], "faulty": faulty, "rollouts_to_tell": rollouts_to_tell(n_rollouts, se, far),
            "bare": not fit.get("uses_entropy", True)}


def kept_mass_interval(trunc: dict[str, Any] | None, n_rollouts: int) -> dict[str, Any] | None:
    """The kept mass's 95% interval (at most 1 for a truncation) and the deficits in it beyond MIN_DEFICIT that the
    batch cannot rule out; None when the test did not run."""
    if trunc is None or "kept_mass_ci" not in trunc:
        return None
    lo, hi = trunc["kept_mass_ci"]
    se = (hi - lo) / (2 * Z_CI)
    faulty = [(lo, min(hi, 1 - MIN_DEFICIT))] if lo < 1 - MIN_DEFICIT else []
    return {"interval": [lo, min(hi, 1.0)], "faulty": faulty,
            "rollouts_to_tell": rollouts_to_tell(n_rollouts, se, 1 - lo)}


def sampler_intervals(tests: dict[str, Any], n_rollouts: int) -> dict[str, Any]:
    """Evidence for a verdict: `temperature_interval` and `kept_mass_interval` ((lo, hi), 95%; None when not
    tested) and `cannot_rule_out`: per parameter, the faulty ranges and the rollouts that would tell."""
    temp = temperature_interval(tests.get("temperature"), n_rollouts)
    mass = kept_mass_interval(tests.get("truncation"), n_rollouts)
    open_ = {name: {"faulty": x["faulty"], "rollouts_to_tell": x["rollouts_to_tell"], "bare": x.get("bare", False)}
             for name, x in (("temperature", temp), ("kept_mass", mass)) if x is not None and x["faulty"]}
    return {"temperature_interval": None if temp is None else temp["interval"],
            "kept_mass_interval": None if mass is None else mass["interval"], "cannot_rule_out": open_}


def _range(lo: float, hi: float, spec: str) -> str:
    return f"[{lo:{spec}}, unbounded)" if math.isinf(hi) else f"[{lo:{spec}}, {hi:{spec}}]"


def intervals_words(ev: dict[str, Any], n_rollouts: int, skip: tuple[str, ...] = ()) -> str:
    """The sentence a verdict ends with: what the batch cannot rule out, and about how many rollouts would tell
    ("A temperature in [0.86, 0.98] or [1.02, 1.12] cannot be ruled out with 96 rollouts; about 400 would tell.").
    `skip`: parameters a finding already names (a found temperature is not "not ruled out")."""
    said = []
    names = {"temperature": ("a temperature in", ".3g"), "kept_mass": ("a top-p / top-k set keeping a mass in", ".4f")}
    for name, x in ev["cannot_rule_out"].items():
        if name in skip:
            continue
        what, spec = names[name]
        ranges = " or ".join(_range(lo, hi, spec) for lo, hi in x["faulty"])
        n = x["rollouts_to_tell"]
        tell = (f"; about {n:,} would tell" if n and n > n_rollouts else
                "; without the trainer's per-token entropy its fit does not tell a temperature from the sampler's "
                "rounding at any batch size (the rounding pushes it from 1), and the entropy column (extras["
                "'entropy']) would tell" if n and x.get("bare") else
                "; its test is significant at this size, but the fit does not explain the mismatch" if n else "")
        said.append(f"{what} {ranges} cannot be ruled out with {n_rollouts} rollouts{tell}")
    if not said:
        return ""
    text = "; ".join(said)
    return text[0].upper() + text[1:] + "."


def temperature_tail(a: torch.Tensor, l: torch.Tensor, keep: torch.Tensor, bad: torch.Tensor,
                     faulty: list[tuple[float, float]]) -> torch.Tensor:
    """(N,) bool: the tokens of `bad` (|l| > ln 20) within ln 20 of the line of a temperature in one of the
    `faulty` ranges the batch cannot rule out: a sharper sampler's rare tokens (l = s a + c grows with -log pi),
    pushed further out by a coarse format's rounding, are that temperature's own tail, not a kernel's catastrophe.
    The line is the bare fit's, s (a - mean a) + mean l over the kept tokens (linear in s, so the lines of a range
    sweep the band between its ends' lines at each a); s = 1 - 1/tau, 1 at an unbounded end."""
    out = torch.zeros_like(bad)
    if not faulty or not bool(keep.any()):
        return out
    a64, l64 = a.double(), l.double()
    centred = a64 - float(a64[keep].mean())  # (N,)
    mean_l = float(l64[keep].mean())
    for lo, hi in faulty:
        ends = [centred * (1 - 1 / tau if math.isfinite(tau) else 1.0) + mean_l for tau in (lo, hi)]  # 2 x (N,)
        low, high = torch.minimum(*ends), torch.maximum(*ends)
        out |= bad & (l64 >= low - CATASTROPHIC_LOG_RATIO) & (l64 <= high + CATASTROPHIC_LOG_RATIO)
    return out
