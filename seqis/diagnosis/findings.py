"""The findings a test's result becomes: a sentence a user can act on, and the numbers that show it."""

from __future__ import annotations

import math
from typing import Any

import torch

from .detectors import noise_floor, rounding_dtype, rounding_formats
from .levels import UNIT_ROUNDOFF, VERL_VETO_FRACTION, Finding, _level, _threshold_clause
from .pairs import _Pairs


def _misalignment(shift: int, agreement: dict[int, float]) -> Finding:
    late = "late" if shift > 0 else "early"
    return Finding(
        "token_misalignment", "bad",
        f"The inference log-probs sit {abs(shift)} position(s) {late}: they match the trainer's "
        f"{agreement[0] / max(agreement[shift], 1e-12):.0f}x better shifted by {shift}. Re-align them (check "
        "where the response starts and whether the logits were shifted) before any correction: every ratio "
        "of this batch pairs the wrong tokens.",
        {"shift": shift, "agreement_in_place": agreement[0], "agreement_shifted": agreement[shift],
         "agreement": agreement})


def temperature_estimable(fit: dict[str, Any]) -> bool:
    """Whether the fitted slope s of l on log pi gives a temperature: tau = 1 / (1 - s) is finite and positive
    only for s < 1 (a sampler at any finite temperature has s = 1 - 1/tau < 1)."""
    return math.isfinite(fit["temperature"])


def tau_interval(ci: list[float], spec: str = ".3g") -> str:
    """A temperature's 95% interval in words: '1.02-1.08'; '1.02 to unbounded' when the slope's interval reaches
    1 (tau = 1 / (1 - s) has no upper end); 'not estimable' when its standard error is not a number."""
    lo, hi = ci
    if math.isnan(lo) or math.isnan(hi) or math.isinf(lo):
        return "not estimable"
    return f"{lo:{spec}} to unbounded" if math.isinf(hi) else f"{lo:{spec}}-{hi:{spec}}"


def _slope_words(fit: dict[str, Any], *notes: str) -> str:
    """'+1.402 (95% CI +1.137 to +1.667; notes...)': the fitted slope of l on log pi, its interval when it has one."""
    lo, hi = fit["slope_ci"]
    said = ([f"95% CI {lo:+.3f} to {hi:+.3f}"] if math.isfinite(lo) and math.isfinite(hi) else []) + list(notes)
    return f"{fit['slope']:+.3f}" + (f" ({'; '.join(said)})" if said else "")


def temperature_words(fit: dict[str, Any], spec: str = ".3g") -> str:
    """'temperature 1.05 (95% CI 1.02-1.08)', or, when the slope is at or above 1, 'temperature not estimable:'
    and why (never 'inf (inf-inf)')."""
    if not temperature_estimable(fit):
        return (f"temperature not estimable: the log-ratio's slope on log pi is {_slope_words(fit)}, at or above "
                "1, which no finite temperature gives (tau = 1 / (1 - slope))")
    return f"temperature {fit['temperature']:{spec}} (95% CI {tau_interval(fit['ci'], spec)})"


def _temperature(fit: dict[str, Any], stats: dict[str, float]) -> Finding:
    tau = fit["temperature"]
    level = _level(stats)
    how = (f"the line explains {fit['r2']:.0%} of its variance" if fit["uses_entropy"] else
           "fitted without the trainer's entropy, so how much of the mismatch it explains is not known, and a "
           "coarse format's rounding pushes it away from 1: the sampler's temperature is between it and 1")
    if fit.get("explained_by_rounding"):
        how += (", the rest two-sided noise no larger where the line moves the log-ratio most: a format's rounding "
                f"({fit['residual_dtype']})")
    if temperature_estimable(fit):
        said = (f"The sampler runs at {tau:.3g}x the trainer's temperature (95% CI {tau_interval(fit['ci'])}; "
                f"log-ratio linear in log pi, slope {fit['slope']:+.3f} = 1 - 1/tau, {how}): divide the trainer's "
                "logits by the sampling temperature (or sample at the trainer's). " + _off_the_line(fit))
    else:  # s >= 1: tau = 1 / (1 - s) would be infinite or negative
        said = (f"The log-ratio rises with log pi at slope {_slope_words(fit, how)}: a sampler at temperature "
                "tau gives slope 1 - 1/tau, below 1 at every finite tau, so the temperature is not estimable. A "
                "slope at or above 1 is a sampler far hotter than the trainer (nearly flat over the tokens) or "
                "something else that moves the log-ratio with log pi: check the sampler's temperature and logits "
                "processing" + ("" if fit["uses_entropy"] else " (the trainer's entropy would sharpen the fit)")
                + ". ")
    return Finding(
        "temperature_mismatch", "warn" if level == "ok" else "bad", said + _threshold_clause(stats),
        {"temperature": tau, "ci": fit["ci"], "slope": fit["slope"], "slope_ci": fit["slope_ci"], "z": fit["z"],
         "share": fit["share"], "r2": fit["r2"] if fit["uses_entropy"] else None, "n_fit": fit["n_fit"],
         "uses_entropy": fit["uses_entropy"], "residual_floor": fit["residual_floor"],
         "residual_dtype": fit["residual_dtype"], **stats})


def _off_the_line(fit: dict[str, Any]) -> str:
    """What the temperature's line leaves, in words: the two-sided noise a format's rounding may add to it (the
    temperature and the precision are fitted together, not one instead of the other)."""
    bound = "at most "  # the line leaves part of each context's log-partition in it too
    return (f"Off the line remains two-sided noise of {bound}{fit['residual_floor']:.2g} nats at branching tokens "
            f"({fit['residual_dtype']} rounding's size). ")


def _truncation(t: dict[str, Any], stats: dict[str, float]) -> Finding:
    level = _level(stats)
    offset, (lo, hi) = t["log_offset"], t["ci"]
    return Finding(
        "sampler_truncation", "warn" if level == "ok" else "bad",
        f"The sampler renormalises over a top-p / top-k set the trainer does not: E_mu[pi/mu], 1 for any "
        f"sampler that can draw every token, is {t['kept_mass']:.4f} ({t['z']:.0f} standard errors below 1), "
        f"and the log-ratio is {offset:+.4f} nats per token on average (95% CI {lo:+.4f} to {hi:+.4f}; the "
        f"kept mass is {math.exp(offset):.3f}). Apply the same top-p / top-k to the trainer's logits, or have "
        "the sampler return its unprocessed log-probs. " + _threshold_clause(stats),
        {"log_offset": offset, "ci": t["ci"], "kept_mass": t["kept_mass"], "kept_mass_ci": t["kept_mass_ci"],
         "z": t["z"], **stats})


def _raw_logprobs(r: dict[str, Any], stats: dict[str, float]) -> Finding:
    gap, (lo, hi) = r["entropy_gap"], r["ci"]
    sharper = "sharper" if gap < 0 else "flatter"
    return Finding(
        "raw_logprobs", "bad",
        f"The tokens are {sharper} than the distribution the sampler reported: -log pi(y) exceeds the trainer's "
        f"entropy by {gap:+.3f} nats per token (95% CI {lo:+.3f} to {hi:+.3f}) while the log-probs agree, so "
        "the sampler drew from a processed distribution (temperature, top-p, top-k) and reported raw log-probs "
        "(vLLM's logprobs_mode='raw_logprobs'). Report the processed log-probs (logprobs_mode="
        "'processed_logprobs'), or sample without processing: every importance ratio of this batch is "
        "computed against the wrong distribution. " + _threshold_clause(stats),
        {"entropy_gap": gap, "ci": r["ci"], "z": r["z"], **stats})


def _policy_lag(lag: dict[str, Any], stats: dict[str, float]) -> Finding:
    level = _level(stats)
    lo, hi = lag["ci"]
    need = ("below every framework's line, but a trainer ahead of its sampler needs an importance correction all "
            "the same" if level == "ok" else "past the frameworks' lines: correct it and bound the lag")
    return Finding(
        "policy_lag", level,
        f"A systematic mismatch from the trainer side, not a sampler fault: the trainer's policy scores higher "
        f"than the sampler's on this batch's own rewards (the importance-sampling estimate of the gain, sum_t "
        f"A (rho - 1) per rollout, is {lag['gain']:+.3g}, 95% CI {lo:+.3g} to {hi:+.3g}, {lag['z']:.1f} standard "
        f"errors above 0), which a sampler's rounding, truncation or temperature cannot do: the trainer's "
        f"weights are ahead of the sampler's (policy lag, an asynchronous step). No sampler setting fixes it; "
        f"it is {need} (NeMo-RL's async GRPO guide requires importance-sampling correction for convergence; "
        "verl's rollout correction treats model staleness as an off-policy gap; prime-rl's default loss is "
        "built for max_async_level 2). " + _threshold_clause(stats),
        {"gain": lag["gain"], "ci": lag["ci"], "z": lag["z"], "n_rollouts": lag["n_rollouts"], **stats})


def _catastrophic(p: _Pairs, bad: torch.Tensor, tail: torch.Tensor | None = None,
                  faulty: list[tuple[float, float]] = ()) -> Finding:
    """|l| > ln 20 tokens. Those of them on the line of a temperature the batch cannot rule out (`tail`, see
    `temperature_tail`) are said to be that temperature's rare tokens; when every one is, the finding is a warning
    that names the temperature before a kernel bug (issue 45: fp8 rounding at 0.7 without the entropy)."""
    count = int(bad.sum())
    index = bad.nonzero()[:, 0]  # (count,)
    rows, pos = p.where(index)
    share_rollouts = len(set(rows.tolist())) / max(p.n_rollouts, 1)
    worst = p.l[index].abs().topk(min(count, 20)).indices
    low_prob = float((p.a[bad] < math.log(0.05)).double().mean())
    on_line = 0 if tail is None else int(tail.sum())
    severity = "bad" if share_rollouts > VERL_VETO_FRACTION and on_line < count else "warn"
    said = (f"{count} token(s) ({count / p.l.numel():.2%} of loss tokens, in {share_rollouts:.1%} of rollouts) "
            f"have |log-ratio| > ln 20, {low_prob:.0%} of them on tokens the trainer gives under 5%")
    if on_line:
        ranges = " or ".join(f"[{lo:.3g}, {hi:.3g}]" for lo, hi in faulty)
        said += (f"; {'all' if on_line == count else on_line} of them lie within ln 20 of the log-ratio's line at a "
                 f"temperature in {ranges}, which this batch cannot rule out: a sharper sampler's own rare tokens, "
                 "pushed out further by a coarse format's rounding, look like this")
        act = ("Settle the temperature first (the trainer's per-token entropy would tell); if it is the trainer's, "
               "look for a kernel bug in the sampler at these tokens" if on_line == count else
               "Look for a kernel bug in the sampler at the others")
    else:
        act = "Look for a kernel bug in the sampler at those tokens"
    return Finding(
        "catastrophic_tokens", severity,
        f"{said}. {act}, and meanwhile reject their rollouts (a token band, verl's veto at 1e-4 or a max "
        f"criterion; verl calls a veto fraction above {VERL_VETO_FRACTION} too high).",
        {"count": count, "share": count / p.l.numel(), "rollout_share": share_rollouts, "low_prob_share": low_prob,
         "on_temperature_line": on_line, "max_abs_log_ratio": float(p.l.abs()[bad].max()),
         "where": [[int(rows[k]), int(pos[k])] for k in worst.tolist()]})


def _precision(p: _Pairs, keep: torch.Tensor, stats: dict[str, float], tests: dict[str, Any]) -> Finding:
    floor = noise_floor(p, keep)
    dtype = rounding_dtype(floor)
    level = _level(stats)
    ruled_out = _ruled_out(tests)
    size = (f"{floor:.2g} nats at branching tokens ({floor / UNIT_ROUNDOFF['bf16']:.2g} bf16 unit roundoffs)")
    if rounding_formats(floor):
        what = (f"the size {dtype} rounding leaves; the data do not tell rounding from any other two-sided mismatch "
                "of that size (a kernel difference, policy lag the advantages do not show)")
    else:
        what = f"no common format's rounding leaves a floor of that size ({dtype})"
    advice = ("a geometric or token band absorbs it" if level == "ok" else
              "more than the frameworks accept: correct it (a geometric band or sequence TIS) and look for the "
              "source")
    return Finding(
        "precision_noise", level,
        f"No sampler fault is confirmed ({ruled_out}). What remains is two-sided noise of {size}: {what}; {advice}. "
        + _threshold_clause(stats),
        {"dtype": dtype, "dtypes": rounding_formats(floor), "noise_floor": floor,
         "roundoffs_bf16": floor / UNIT_ROUNDOFF["bf16"], "tests": _test_summary(tests), **stats})


def _ruled_out(tests: dict[str, Any]) -> str:
    """What the tests that did not fire saw, in words."""
    out = []
    t = tests["truncation"]
    if "kept_mass" in t:
        lo, hi = t["kept_mass_ci"]
        out.append(f"E_mu[pi/mu] {t['kept_mass']:.4f}, 95% CI {lo:.4f}-{hi:.4f}: no truncation")
    temp = tests["temperature"]
    if temp is not None:
        bare = "" if temp["uses_entropy"] or not temperature_estimable(temp) else (
            " fitted without the trainer's entropy, which a coarse format's rounding pushes from 1: the temperature "
            "lies between it and 1")
        out.append(temperature_words(temp, ".3f") + bare)
    raw = tests["raw"]
    if raw is not None:
        lo, hi = raw["ci"]
        out.append(f"entropy gap {raw['entropy_gap']:+.3f} ({lo:+.3f} to {hi:+.3f})")
    lag = tests["lag"]
    if lag is not None:
        out.append(f"not along the advantages ({lag['z']:+.1f} standard errors)")
    return "; ".join(out) or "too few tokens to test"


def _test_summary(tests: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each test's estimate, ci and z, for the evidence (plain numbers)."""
    keys = {"truncation": ("kept_mass", "kept_mass_ci", "z"), "temperature": ("temperature", "ci", "z", "share"),
            "raw": ("entropy_gap", "ci", "z"), "lag": ("gain", "ci", "z")}
    return {name: {k: t[k] for k in keys[name] if k in t} for name, t in tests.items() if t is not None}

