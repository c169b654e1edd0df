"""The tests behind each finding: each a null hypothesis that holds exactly for a sampler without the fault, a
score statistic and an estimate with its 95% interval (the theory is in `seqis.diagnosis.causes`)."""

from __future__ import annotations

import math
from typing import Any

import torch

from .levels import (
    _BRANCHING,
    _MIN_FIT_TOKENS,
    CATASTROPHIC_LOG_RATIO,
    MIN_DEFICIT,
    MIN_ENTROPY_GAP,
    MIN_TEMPERATURE_SHIFT,
    ROUNDING_GROWTH,
    ROUNDING_RANGE,
    TEMPERATURE_R2,
    TEMPERATURE_R2_BARE,
    UNIT_ROUNDOFF,
    Z_DETECT,
)
from .pairs import _ci, _Pairs, _ratio, _sample, cluster_sums, clustered_mean, clustered_ratio, kept


def run_tests(p: _Pairs, z_detect: float = Z_DETECT) -> dict[str, Any]:
    """Every test on a batch's pairs, each result's "detected" settled against the others; "keep": the tokens
    that are not catastrophic.

    - catastrophic tokens (|l| > ln 20) leave every test; a detected temperature re-reads them off its line (its
      own tail is not a catastrophe);
    - a detected temperature (with the entropy) overrides the truncation test: a sampler sharper than the trainer
      misses the rare tokens where pi / mu is large, so in a finite batch its mean pi / mu can fall below 1, and
      the temperature's own checks (two-sided l, R^2, a positive share) refuse truncations; without the entropy
      the temperature is not identified against a truncation, so a truncation that fires wins;
    - raw log-probs are tested only when no truncation or temperature fired (both move rho (a + H) too);
    - without the entropy, a temperature whose mismatch also points along the advantages is not told from lag:
      the advantages decide."""
    catastrophic = p.l.abs() > CATASTROPHIC_LOG_RATIO  # (N,)
    keep = ~catastrophic
    trunc = truncation_test(p, keep, z_detect)
    temp = temperature_fit(p, keep, z_detect)
    if _fired(temp):
        if temp["uses_entropy"]:
            trunc = {**trunc, "detected": False}
        elif trunc["detected"]:
            temp = {**temp, "detected": False}
    if _fired(temp):
        keep = ~((p.l - temp["line"]).abs() > CATASTROPHIC_LOG_RATIO)
        if temp["uses_entropy"] and not bool(keep.equal(~catastrophic)):  # its tail was left out: fit with it
            temp = _refit(p, keep, z_detect, temp)
    raw = None if trunc["detected"] or _fired(temp) else raw_logprobs_test(p, keep, z_detect)
    lag = policy_lag_test(p, keep, z_detect)
    if _fired(temp) and not temp["uses_entropy"] and _fired(lag):
        temp = {**temp, "detected": False}
    return {"truncation": trunc, "temperature": temp, "raw": raw, "lag": lag, "keep": keep}


def _refit(p: _Pairs, keep: torch.Tensor, z_detect: float, first: dict[str, Any]) -> dict[str, Any]:
    """The temperature fitted again on the tokens its line keeps: leaving out every |l| > ln 20 drops the
    temperature's own tail (a sharp sampler's rare draws, further out under a coarse format's rounding), and
    biases the slope toward 0. The first fit stands when the second no longer fires. With the entropy only: there
    the line holds each context's log-partition; without it the line is s a + a constant, too coarse to say which
    tokens are the tail."""
    again = temperature_fit(p, keep, z_detect)
    return again if _fired(again) else first


def _fired(test: dict[str, Any] | None) -> bool:
    return test is not None and bool(test["detected"])


def score_z(d: torch.Tensor) -> float:
    """sum d / sqrt(sum d^2) for increments d that have mean zero given the past under the null (a martingale):
    asymptotically N(0, 1) under the null whatever the dependence between tokens, its variance estimated under
    the null (the score test), so a batch's spread between contexts does not dilute it."""
    d = d.double()
    q = float(d.pow(2).sum())
    return float(d.sum()) / math.sqrt(q) if q > 0 else 0.0


def one_sided(l: torch.Tensor) -> bool:
    """Under 5% of |l|'s mass above 0: what a truncation leaves (l = log of the kept mass <= 0), not a
    temperature (l = s log pi + c(context) takes both signs)."""
    total = float(l.abs().sum(dtype=torch.float64))
    return total > 0 and float(l.clamp(min=0).sum(dtype=torch.float64)) / total < 0.05


def truncation_test(p: _Pairs, keep: torch.Tensor, z_detect: float = Z_DETECT) -> dict[str, Any]:
    """Null E_mu[rho] = 1 (any full-support sampler); against E_mu[rho] = pi(K) < 1 (a sampler keeping K).
    The increments rho_t - 1 have mean zero given the past under the null, so z = -score_z(rho - 1); detected
    when z > Z_DETECT, the deficit 1 - mean rho is above MIN_DEFICIT and the mean log offset is negative.
    log_offset = mean l (the mean log kept mass, when the sampler's untruncated distribution is the trainer's)
    and kept_mass = mean rho, each with its 95% ci clustered by rollout."""
    n = int(torch.count_nonzero(keep))
    if n < _MIN_FIT_TOKENS:
        return {"detected": False, "n_tokens": n}
    rows = kept(p.rows, keep)
    rho = _ratio(p, keep)
    mass, mass_se = clustered_mean(rho, rows)
    offset, offset_se = clustered_mean(kept(p.l64, keep), rows)
    z = -score_z(rho - 1)
    detected = z > z_detect and 1 - mass > MIN_DEFICIT and offset < 0
    return {"detected": detected, "log_offset": offset, "ci": _ci(offset, offset_se), "kept_mass": mass,
            "kept_mass_ci": _ci(mass, mass_se), "z": z, "n_tokens": n}


def temperature_fit(p: _Pairs, keep: torch.Tensor, z_detect: float = Z_DETECT) -> dict[str, Any] | None:
    """The sampler's temperature relative to the trainer's, tau = 1 / (1 - s), from l = s a + c(context).

    With the trainer's entropy: s = sum (l - f) g / sum (a + H) g over the kept tokens, g = rho (a + H), f a
    quadratic in H fitted by least squares to l - s0 (a + H) (s0: the same estimate with f = 0). Both are
    exact moment estimators whatever f is (E_mu[g | context] = 0); f only removes most of the per-context
    log-partition from the error. r2: the share of l's variance the line s (a + H) + f explains; share =
    s sum a (rho - 1) / sum l (rho - 1), the part of the symmetric divergence it explains (1 for a pure
    temperature in expectation, but carried by rare tokens). Without the entropy: s = sum l (rho - 1) /
    sum a (rho - 1), no share, and r2 is l's squared correlation with log pi at branching tokens. Detected when
    |s| / se > Z_DETECT, |tau - 1| > MIN_TEMPERATURE_SHIFT, l is not one-sided, r2 >= TEMPERATURE_R2 (with the
    entropy) or TEMPERATURE_R2_BARE (without) and share > 0.
    None with fewer than _MIN_FIT_TOKENS tokens."""
    n = int(torch.count_nonzero(keep))
    if n < _MIN_FIT_TOKENS:
        return None
    a, l, rows = kept(p.a64, keep), kept(p.l64, keep), kept(p.rows, keep)
    rho = _ratio(p, keep)
    uses_entropy = p.entropy is not None
    if uses_entropy:
        h = kept(p.h64, keep)
        x = a + h  # (n,) log pi + H: mean zero under pi at every context
        g = rho * x  # (n,) the instrument
        s0, _ = clustered_ratio(l * g, x * g, rows)
        X = torch.stack([torch.ones_like(h), h, h * h], 1)  # (n, 3) context features
        beta = torch.linalg.lstsq(X, (l - s0 * x)[:, None]).solution[:, 0]  # (3,)
        f = X @ beta  # (n,) a control variate for the per-context log-partition
        s, se = clustered_ratio((l - f) * g, x * g, rows)
    else:
        g = rho - 1
        s, se = clustered_ratio(l * g, a * g, rows)
    if not math.isfinite(s):
        return None
    jeffreys = float((l * (rho - 1)).sum())
    share = s * float((a * (rho - 1)).sum()) / jeffreys if uses_entropy and jeffreys > 0 else None
    tau = 1 / (1 - s) if s < 1 else math.inf
    tau_ci = [1 / (1 - v) if v < 1 else math.inf for v in _ci(s, se)]
    # the line through the tokens, for telling catastrophic tokens from the temperature's own tail
    a_all = p.a64
    if uses_entropy:
        h_all = p.h64
        ctx = torch.stack([torch.ones_like(h_all), h_all, h_all * h_all], 1) @ torch.linalg.lstsq(
            X, (l - s * x)[:, None]).solution[:, 0]  # (N,) fitted c(context) - s H
        line = (s * (a_all + h_all) + ctx).float()
    else:
        line = (s * a_all + float((l - s * a).mean())).float()
    if uses_entropy:
        resid = l - kept(line, keep).double()
        r2 = 1 - float(resid.pow(2).sum()) / max(float((l - l.mean()).pow(2).sum()), 1e-300)
    else:  # the line misses c(context): how linear l is in log pi, over the branching tokens (least squares)
        sel = a < _BRANCHING if int((a < _BRANCHING).sum()) >= _MIN_FIT_TOKENS else torch.ones_like(a, dtype=torch.bool)
        r2 = float(torch.corrcoef(torch.stack([a[sel], l[sel]]))[0, 1] ** 2) if int(sel.sum()) > 2 else 0.0
        r2 = r2 if math.isfinite(r2) else 0.0
    z = abs(s) / se if se > 0 else math.inf
    resid = l - kept(line, keep).double()
    residual_floor = _residual_floor(resid, a)
    growth = _residual_growth(resid, s * (a + h), (a - l).exp()) if uses_entropy else None
    noise = growth is not None and growth <= ROUNDING_GROWTH and bool(rounding_formats(residual_floor))
    explains = r2 >= (TEMPERATURE_R2 if uses_entropy else TEMPERATURE_R2_BARE) or noise
    detected = (z > z_detect and abs(tau - 1) > MIN_TEMPERATURE_SHIFT and explains
                and (share is None or share > 0) and not one_sided(l))
    return {"slope": s, "temperature": tau, "ci": tau_ci, "slope_ci": _ci(s, se), "z": z, "share": share, "r2": r2,
            "n_fit": n, "line": line, "uses_entropy": uses_entropy, "detected": detected,
            "residual_floor": residual_floor, "residual_dtype": rounding_dtype(residual_floor),
            "residual_growth": growth, "explained_by_rounding": bool(noise and r2 < TEMPERATURE_R2)}


def _residual_growth(resid: torch.Tensor, shift: torch.Tensor, mu: torch.Tensor) -> float | None:
    """How much larger the residual is where the line moves l most than where it moves it least, each token's
    squared residual divided by the rounding's own variance there. Rounding a logit by a relative error delta
    moves log mu by z delta / tau whatever the temperature's shift, and the renormalisation leaves 1 - mu of it on
    the drawn token: its variance is sigma^2 (1 - mu), sigma set by the format and the logits' size (one value
    for a batch). So r^2 / (1 - mu) has the same mean in the two halves of the branching tokens sorted by the
    line's |s (a + H)|, and the ratio is ~1; a residual that is a temperature the line misses (one group's
    temperature in a mixed batch, a trainer-side change) grows with the shift. None with too few tokens."""
    sel = (1 - mu) > 0.5  # branching draws: where 1 - mu is not near 0 (a tiny divisor)
    if int(sel.sum()) < 2 * _MIN_FIT_TOKENS:
        return None
    scaled = resid[sel].pow(2) / (1 - mu[sel])  # (n,) ~ sigma^2 for rounding
    order = shift[sel].abs().argsort()
    low, high = scaled[order[: order.numel() // 2]], scaled[order[order.numel() // 2:]]
    base = float(low.mean())
    return float(high.mean()) / base if base > 0 else None


def _residual_floor(resid: torch.Tensor, a: torch.Tensor) -> float:
    """The median |l - line| at branching tokens: the two-sided noise left once the temperature's line is taken
    out, the joint fit's second part (rounding leaves a floor set by the format, `rounding_dtype` names it). Without
    the entropy the line misses each context's log-partition, so this is an upper bound on the rounding's floor."""
    sel = a < _BRANCHING
    return float(resid[sel].abs().median()) if int(sel.sum()) >= _MIN_FIT_TOKENS else float(resid.abs().median())


def raw_logprobs_test(p: _Pairs, keep: torch.Tensor, z_detect: float = Z_DETECT) -> dict[str, Any] | None:
    """Null E_mu[rho (a + H) | context] = 0: the tokens came from the distribution the sampler reported. Needs
    the trainer's entropy (None without it). z = |score_z(rho (a + H))|; detected when z > Z_DETECT,
    |entropy_gap| > MIN_ENTROPY_GAP and the log-probs agree (|mean l| under a tenth of the gap: a truncation
    the first test could not yet see also moves rho (a + H), but leaves l far from 0). entropy_gap = mean of
    -a - H over the kept loss tokens, with its 95% ci clustered by rollout."""
    n = int(torch.count_nonzero(keep))
    if p.entropy is None or n < _MIN_FIT_TOKENS:
        return None
    a, h, rows = kept(p.a64, keep), kept(p.h64, keep), kept(p.rows, keep)
    z = abs(score_z(_ratio(p, keep) * (a + h)))
    gap, gap_se = clustered_mean(-a - h, rows)
    offset = float(kept(p.l64, keep).mean())
    agree = abs(offset) < 0.1 * abs(gap)
    return {"detected": z > z_detect and abs(gap) > MIN_ENTROPY_GAP and agree, "entropy_gap": gap,
            "ci": _ci(gap, gap_se), "z": z, "log_offset": offset, "n_tokens": n}


def policy_lag_test(p: _Pairs, keep: torch.Tensor, z_detect: float = Z_DETECT) -> dict[str, Any] | None:
    """Null: the trainer's policy scores no higher than the sampler's on this batch's rewards. gain = mean over
    rollouts of G_j = sum_t A_t (rho_t - 1) (the per-decision IS estimate of E_pi[A] - E_mu[A]), its se from
    the rollouts' G_j (independent across rollouts). Detected when gain / se > Z_DETECT (one-sided: ahead).
    None without finite, varying advantages."""
    if p.advantages is None or int(torch.count_nonzero(keep)) < _MIN_FIT_TOKENS:
        return None
    adv = kept(p.advantages, keep)
    if float(adv.abs().max()) == 0:
        return None
    per = cluster_sums(adv * (_ratio(p, keep) - 1), kept(p.rows, keep))  # (R,) G_j of the rollouts with kept tokens
    gain = float(per.mean())
    se = float(per.std()) / math.sqrt(per.numel()) if per.numel() > 1 else math.inf
    z = gain / se if se > 0 else 0.0
    return {"detected": z > z_detect, "gain": gain, "ci": _ci(gain, se), "z": z, "n_rollouts": per.numel()}


def noise_floor(p: _Pairs, keep: torch.Tensor) -> float:
    """Median |l| over the kept branching tokens; with fewer than _MIN_FIT_TOKENS of them, over the
    _MIN_FIT_TOKENS kept tokens the trainer finds least likely. Not over all tokens: at a near-certain token
    rounding leaves l = 0 exactly, so a peaked batch's median would call a bf16 sampler exact."""
    sel = keep & (p.a < _BRANCHING)
    if int(sel.sum()) < _MIN_FIT_TOKENS:
        a = torch.where(keep, p.a, math.inf)
        sel = torch.zeros_like(keep)
        sel[a.topk(min(_MIN_FIT_TOKENS, int(keep.sum())), largest=False).indices] = True
    return float(_sample(p.l[sel]).abs().median()) if bool(sel.any()) else 0.0


def rounding_formats(floor: float) -> list[str]:
    """The number formats whose rounding gives a noise floor of this size: u/4 .. 32 u of the format's unit
    roundoff u (ROUNDING_RANGE), finest first."""
    lo, hi = ROUNDING_RANGE
    return [name for name, u in sorted(UNIT_ROUNDOFF.items(), key=lambda kv: kv[1]) if lo * u <= floor <= hi * u]


def rounding_dtype(floor: float) -> str:
    """The formats a noise floor is consistent with, in words ("bf16 or fp16"); "none (exact)" for a floor
    below fp32's range, "finer than fp16" between fp32's and fp16's, "coarser than fp8" above every range."""
    names = rounding_formats(floor)
    if names:
        return " or ".join(reversed(names))  # the coarsest, the likelier sampler format, first
    lo, hi = ROUNDING_RANGE
    if floor < lo * UNIT_ROUNDOFF["fp32"]:
        return "none (exact)"
    if floor > hi * UNIT_ROUNDOFF["fp8"]:
        return "coarser than fp8"
    return "finer than fp16"
