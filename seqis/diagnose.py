"""Why trainer and sampler disagree: name the cause of a batch's mismatch, with its evidence.

Only the two log-probs of each sampled token are needed (a = log pi(y_t), b = log mu(y_t), l = a - b); the
trainer's entropy at each position sharpens the temperature fit when the batch carries it
(`batch.extras["entropy"]`). Each cause leaves its own signature in l:

  token_misalignment    b agrees with a far better `shift` positions away than in place: the log-probs are
                        off by one (or two). Everything else is then read on the re-aligned pairs.
  catastrophic_tokens   a few tokens with |l| above ln 20 (a ratio outside every token band in use, 4x
                        beyond IcePop's 5), mostly on tokens the trainer finds unlikely: a kernel bug.
  temperature_mismatch  a sampler at temperature tau draws from mu = pi^(1/tau) / Z_t, so at one position
                        l = (1 - 1/tau) log pi + log Z_t: linear in log pi with slope 1 - 1/tau. The slope is
                        fitted on the branching tokens (pi < 1/2) where it shows; with the trainer's entropy
                        H_t as a second regressor when the batch has it (log Z_t ~ (1/tau - 1) H_t to first
                        order), which removes most of the bias a position-dependent log Z_t leaves.
  sampler_truncation    top-p / top-k in the sampler renormalises the kept tokens: log mu = log pi - log Z_t
                        with Z_t the kept mass, so l = log Z_t <= 0 on every token: one-sided. Evidence:
                        the mean per-token offset, which is also the KL(mu || pi) it causes.
  precision_noise       what is left is rounding: |l| at branching tokens is a small multiple of the
                        format's unit roundoff (bf16 2^-8, fp16 2^-11) and falls as the token gets likely.
                        The multiple is the model's (about 1.6 for the tiny transformer, more for deep
                        models with large logits), so the dtype is a best guess, said as such.

Severity cites the frameworks' published guidance:
- NeMo-RL (docs/adding-new-models.md, "Expected Error Threshold"): the mean over tokens of exp(|l|) should
  stay below 1.05; above, "further investigation" is needed. A systematic cause (truncation, temperature) is
  at least a warning, and bad once the tokens it shapes cross that line; plain noise is a warning there.
- verl (docs/algo/rollout_corr.md): |KL| > 0.1 flags "significant off-policy gap", chi2_token > 1 a
  "severe distribution shift"; a veto fraction (rollouts with a catastrophic token) above 0.1 is "too high".

    from seqis import diagnose
    for f in diagnose(batch, by="env_name"):
        print(f.severity, f.kind, f.group, f.message, f.evidence)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from .types import Batch

NEMO_MULT_PROB_ERROR = 1.05  # NeMo-RL: mean exp(|l|) above this needs investigation
VERL_KL = 0.1  # verl: |KL| above this is a significant off-policy gap
VERL_CHI2 = 1.0  # verl: chi2_token above this is a severe distribution shift
VERL_VETO_FRACTION = 0.1  # verl: more than this fraction of rollouts vetoed is too high
CATASTROPHIC_LOG_RATIO = math.log(20.0)  # |l| above this: a ratio 4x outside IcePop's [0.5, 5]
UNIT_ROUNDOFF = {"bf16": 2.0**-8, "fp16": 2.0**-11}
SEVERITY_RANK = {"bad": 0, "warn": 1, "ok": 2}
# every kind a Finding may have (seqis.monitor logs each, found or not)
KINDS = ("token_misalignment", "catastrophic_tokens", "temperature_mismatch", "sampler_truncation", "precision_noise",
         "healthy")
_BRANCHING = math.log(0.5)  # tokens the trainer gives under 1/2: where temperature and rounding show
_MIN_FIT_TOKENS = 50


@dataclass(frozen=True)
class Finding:
    """One cause of mismatch (or `healthy`), with the numbers that show it."""

    kind: str  # sampler_truncation | temperature_mismatch | token_misalignment | catastrophic_tokens | ...
    severity: str  # "ok" | "warn" | "bad"
    message: str  # one sentence a user can act on
    evidence: dict[str, Any] = field(default_factory=dict)
    group: Any = None  # None: the whole batch; else the value of the `by` column it is about


@dataclass
class _Pairs:
    """The loss tokens of a batch as flat pairs (after any re-alignment), on the CPU in float32."""

    a: torch.Tensor  # (N,) log pi
    l: torch.Tensor  # (N,) log pi - log mu
    mask: torch.Tensor  # (B, T) where the N tokens sit
    entropy: torch.Tensor | None  # (N,) the trainer's entropy, when the batch has it
    n_rollouts: int

    def where(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(rollout, position) of the flat tokens at `index`."""
        rows, pos = self.mask.nonzero(as_tuple=True)
        return rows[index], pos[index]


@torch.no_grad()
def diagnose(batch: Batch, by: str | None = None) -> list[Finding]:
    """Findings about why the batch's trainer and sampler log-probs disagree, worst first. With `by` (a
    metadata column: environment, turn, rank), the whole batch's findings are followed by each value's."""
    findings = _diagnose(batch, None)
    if by is not None:
        if by not in batch.metadata:
            raise ValueError(f"diagnose: by={by!r} is not a metadata column; the batch has "
                             f"{', '.join(sorted(batch.metadata)) or 'none'}")
        for value, rows in groups(batch.metadata[by]).items():
            findings += _diagnose(batch.select(rows), value)
    return sorted(findings, key=lambda f: (SEVERITY_RANK[f.severity], f.group is not None))


def groups(column: list) -> dict[Any, list[int]]:
    """value -> the rollouts holding it, in order of first appearance."""
    out: dict[Any, list[int]] = {}
    for i, v in enumerate(column):
        out.setdefault(v, []).append(i)
    return out


def _diagnose(batch: Batch, group) -> list[Finding]:
    findings: list[Finding] = []
    shift, agreement = best_shift(batch.trainer_logprobs.detach(), batch.inference_logprobs.detach(),
                                  batch.loss_mask)
    if shift:
        findings.append(_misalignment(shift, agreement))
    pairs = aligned_pairs(batch, shift)
    if pairs.l.numel() == 0:
        return [Finding("healthy", "ok", "No loss tokens to diagnose.", {"n_tokens": 0}, group)]
    catastrophic = pairs.l.abs() > CATASTROPHIC_LOG_RATIO  # (N,)
    fit = temperature_fit(pairs, ~catastrophic)
    if fit is not None and fit["detected"]:  # tokens the temperature line explains are not catastrophes
        catastrophic = (pairs.l - fit["line"]).abs() > CATASTROPHIC_LOG_RATIO
    clean = pairs.l[~catastrophic] if bool(catastrophic.any()) else pairs.l  # (N',) without the outliers
    stats = mismatch_stats(clean)  # what the systematic causes do
    if fit is not None and fit["detected"]:
        findings.append(_temperature(fit, stats))
    if bool(catastrophic.any()):
        findings.append(_catastrophic(pairs, catastrophic))
    offset = truncation_offset(clean)
    if offset is not None and (fit is None or not fit["detected"]):
        findings.append(_truncation(offset, stats))
    if all(f.kind in ("catastrophic_tokens", "token_misalignment") for f in findings):
        findings.append(_precision(pairs, ~catastrophic, stats))
    if all(f.severity == "ok" for f in findings):
        findings.append(Finding("healthy", "ok", "Trainer and sampler agree within the frameworks' guidance "
                                f"(mean exp|l| {stats['mult_prob_error']:.4f} <= NeMo-RL's "
                                f"{NEMO_MULT_PROB_ERROR}): no correction is needed for the mismatch itself.",
                                stats))
    for f in findings:
        object.__setattr__(f, "group", group)
    return findings


# ---------------------------------------------------------------------------------------------------------
# the statistics behind each finding


def best_shift(trainer: torch.Tensor, inference: torch.Tensor, mask: torch.Tensor, shifts=(-2, -1, 0, 1, 2),
               max_tokens: int = 1 << 16) -> tuple[int, dict[int, float]]:
    """The shift k at which inference[:, t + k] agrees best with trainer[:, t] (median |difference| over
    positions where both are loss tokens, on the first rollouts up to max_tokens positions), and the
    agreement at every k. k != 0 only when it beats k = 0 by 4x: a batch that is merely noisy stays at 0."""
    B, T = trainer.shape
    rows = slice(0, max(1, min(B, max_tokens // max(T, 1))))
    t, i, m = trainer[rows].float(), inference[rows].float(), mask[rows]
    agreement = {}
    for k in shifts:
        if abs(k) >= T:
            continue
        lo, hi = max(0, -k), T - max(0, k)  # positions t whose partner t + k exists
        both = m[:, lo:hi] & m[:, lo + k:hi + k]
        d = (t[:, lo:hi] - i[:, lo + k:hi + k])[both].abs()
        agreement[k] = float(d.median()) if d.numel() else math.inf
    best = min(agreement, key=lambda k: (agreement[k], abs(k)))
    if best != 0 and not agreement[best] * 4 < agreement.get(0, math.inf):
        best = 0
    return best, agreement


def realign(batch: Batch, shift: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(trainer, inference, mask) on the CPU in float32, the inference log-probs read `shift` positions later
    and the mask limited to finite pairs whose partner exists."""
    trainer = batch.trainer_logprobs.detach().cpu().float()
    inference = batch.inference_logprobs.detach().cpu().float()
    mask = batch.loss_mask.cpu()
    if shift:
        inference = torch.roll(inference, -shift, dims=1)  # (B, T) position t now holds t + shift
        partner = torch.roll(mask, -shift, dims=1)
        T = mask.shape[1]
        partner[:, max(0, T - shift):] = False  # rolled in from the other end
        partner[:, :max(0, -shift)] = False
        mask = mask & partner
    return trainer, inference, mask


def aligned_pairs(batch: Batch, shift: int = 0) -> _Pairs:
    """The loss tokens' (log pi, l) with the inference log-probs read `shift` positions later."""
    trainer, inference, mask = realign(batch, shift)
    index = mask.reshape(-1).nonzero().squeeze(1)  # (N,) where the loss tokens sit, row by row
    a = trainer.reshape(-1).index_select(0, index)  # (N,) what trainer[mask] gives, with one search for both
    l = a - inference.reshape(-1).index_select(0, index)  # (N,)
    finite = torch.isfinite(l)
    if not bool(finite.all()):  # a log-prob of -inf or NaN on a loss token: leave it out
        keep = torch.zeros_like(mask)
        keep[mask] = finite
        mask, a, l, index = keep, a[finite], l[finite], index[finite]
    entropy = batch.extras.get("entropy")
    if entropy is not None:
        entropy = entropy.detach().cpu().float().reshape(-1).index_select(0, index)
        entropy = entropy if bool(torch.isfinite(entropy).all()) else None
    return _Pairs(a, l, mask, entropy, int(batch.loss_mask.any(-1).sum()))


def _sample(x: torch.Tensor, n: int = 1 << 18) -> torch.Tensor:
    """Every k-th element, so at most about n remain (a fixed, seedless choice)."""
    return x[:: max(1, x.numel() // n)]


def mismatch_stats(l: torch.Tensor) -> dict[str, float]:
    """The frameworks' mismatch metrics over loss tokens: NeMo-RL's mean exp|l|, verl's KL (k1), k3, chi2."""
    n = max(l.numel(), 1)
    lc = l.clamp(-20.0, 20.0)  # verl's safety bound, so one absurd token cannot overflow
    rho = lc.exp()  # (N,)
    f64 = torch.float64
    return {
        "mult_prob_error": float(torch.maximum(rho, 1 / rho).sum(dtype=f64)) / n,
        "kl_k1": -float(l.sum(dtype=f64)) / n,
        "kl_k3": float((rho - 1 - lc).sum(dtype=f64)) / n,
        "chi2_token": float((rho * rho - 1).sum(dtype=f64)) / n,
        "n_tokens": int(l.numel()),
    }


def _level(stats: dict[str, float]) -> str:
    """bad past verl's KL / chi2 lines, warn past NeMo-RL's 1.05, else ok."""
    if abs(stats["kl_k1"]) > VERL_KL or stats["chi2_token"] > VERL_CHI2:
        return "bad"
    return "warn" if stats["mult_prob_error"] > NEMO_MULT_PROB_ERROR else "ok"


def temperature_fit(p: _Pairs, keep: torch.Tensor) -> dict[str, Any] | None:
    """Least-squares slope of l on log pi over kept branching tokens (with the trainer's entropy as a second
    regressor when known: it absorbs log Z_t, which otherwise varies with the position and biases the slope,
    most for a hotter sampler): slope s = 1 - 1/tau, so tau = 1 / (1 - s). Detected when the slope is sharp
    (t > 10), the line explains most of l's variance (R^2 > 0.6: policy lag, also linear in log pi, stays
    near 0.3-0.5) and it moves the temperature by more than 2%."""
    sel = (keep & (p.a < _BRANCHING)).nonzero().squeeze(1)  # (n,) the kept branching tokens
    a, ys = _sample(p.a.index_select(0, sel)).double(), _sample(p.l.index_select(0, sel)).double()
    n = a.numel()
    if n < _MIN_FIT_TOKENS:
        return None
    cols = [a - a.mean()]
    if p.entropy is not None:
        h = _sample(p.entropy.index_select(0, sel)).double()
        cols.append(h - h.mean())
    X = torch.stack(cols, 1)  # (n, 1 or 2) centred regressors
    yc = ys - ys.mean()
    xtx = X.T @ X
    if float(torch.linalg.det(xtx)) <= 0:
        return None
    coef = torch.linalg.solve(xtx, X.T @ yc)  # (1 or 2,)
    resid = yc - X @ coef
    sse, syy = float(resid @ resid), float(yc @ yc)
    r2 = 1 - sse / syy if syy > 0 else 0.0
    slope = float(coef[0])
    se = math.sqrt(max(sse / max(n - 1 - len(cols), 1), 1e-300) * float(torch.linalg.inv(xtx)[0, 0]))
    tau = 1 / (1 - slope) if slope < 1 else math.inf
    x_mean = [float(a.mean())] + ([float(h.mean())] if p.entropy is not None else [])
    intercept = float(ys.mean()) - sum(float(c) * m for c, m in zip(coef, x_mean))
    detected = abs(slope) / se > 10 and r2 > 0.6 and abs(tau - 1) > 0.02
    # the line at every token (N,), which only a detected temperature needs (catastrophes measured from it)
    line = slope * p.a + intercept + (float(coef[1]) * p.entropy if p.entropy is not None else 0.0) if detected \
        else None
    return {"slope": slope, "intercept": intercept, "temperature": tau, "r2": r2, "t_stat": abs(slope) / se,
            "n_fit": n, "line": line, "uses_entropy": p.entropy is not None, "detected": detected}


def truncation_offset(l: torch.Tensor) -> float | None:
    """The mean per-token log offset when l is one-sided (under 5% of |l|'s mass above 0) and clearly
    below 0 (more than 5 standard errors); else None."""
    n = l.numel()
    if n < _MIN_FIT_TOKENS:
        return None
    f64 = torch.float64
    total, positive = float(l.abs().sum(dtype=f64)), float(l.clamp(min=0).sum(dtype=f64))
    mean = float(l.sum(dtype=f64)) / n
    se = math.sqrt(max(float((l * l).sum(dtype=f64)) / n - mean * mean, 0.0) / n)
    if total <= 0:
        return None
    return mean if positive / total < 0.05 and mean < -5 * se else None


def noise_floor(p: _Pairs, keep: torch.Tensor) -> float:
    """Median |l| over the kept branching tokens (over all kept tokens when there are too few)."""
    sel = keep & (p.a < _BRANCHING)
    sel = sel if int(sel.sum()) >= _MIN_FIT_TOKENS else keep
    return float(_sample(p.l[sel]).abs().median()) if bool(sel.any()) else 0.0


def rounding_dtype(floor: float) -> str:
    """The number format whose rounding a noise floor is consistent with (tiny-transformer calibration:
    about 1.6 unit roundoffs; the boundaries sit at the geometric midpoints)."""
    ratio = floor / UNIT_ROUNDOFF["bf16"]
    if ratio < 1 / 512:
        return "fp32"
    if ratio < 0.5:
        return "fp16"
    if ratio < 16:
        return "bf16"
    return "coarser than bf16"


# ---------------------------------------------------------------------------------------------------------
# the findings and what to do about them


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


def _temperature(fit: dict[str, Any], stats: dict[str, float]) -> Finding:
    tau = fit["temperature"]
    level = _level(stats)
    return Finding(
        "temperature_mismatch", "warn" if level == "ok" else "bad",
        f"The sampler runs at {tau:.3g}x the trainer's temperature (log-ratio linear in log pi, slope "
        f"{fit['slope']:+.3f} = 1 - 1/tau, R^2 {fit['r2']:.2f}): divide the trainer's logits by the sampling "
        "temperature (or sample at the trainer's). " + _threshold_clause(stats),
        {"temperature": tau, "slope": fit["slope"], "intercept": fit["intercept"], "r2": fit["r2"],
         "n_fit": fit["n_fit"], "uses_entropy": fit["uses_entropy"], **stats})


def _truncation(offset: float, stats: dict[str, float]) -> Finding:
    level = _level(stats)
    return Finding(
        "sampler_truncation", "warn" if level == "ok" else "bad",
        f"The sampler renormalises over a top-p / top-k set the trainer does not: the log-ratio is one-sided, "
        f"{offset:+.4f} nats per token on average (the kept mass is {math.exp(offset):.3f}). Apply the same "
        "top-p / top-k to the trainer's logits, or have the sampler return its unprocessed log-probs. "
        + _threshold_clause(stats),
        {"log_offset": offset, "kept_mass": math.exp(offset), **stats})


def _catastrophic(p: _Pairs, bad: torch.Tensor) -> Finding:
    count = int(bad.sum())
    index = bad.nonzero()[:, 0]  # (count,)
    rows, pos = p.where(index)
    share_rollouts = len(set(rows.tolist())) / max(p.n_rollouts, 1)
    worst = p.l[index].abs().topk(min(count, 20)).indices
    low_prob = float((p.a[bad] < math.log(0.05)).double().mean())
    severity = "bad" if share_rollouts > VERL_VETO_FRACTION else "warn"
    return Finding(
        "catastrophic_tokens", severity,
        f"{count} token(s) ({count / p.l.numel():.2%} of loss tokens, in {share_rollouts:.1%} of rollouts) "
        f"have |log-ratio| > ln 20, {low_prob:.0%} of them on tokens the trainer gives under 5%: look for a "
        "kernel bug in the sampler at those tokens, and meanwhile reject their rollouts (a token band, verl's "
        f"veto at 1e-4 or a max criterion; verl calls a veto fraction above {VERL_VETO_FRACTION} too high).",
        {"count": count, "share": count / p.l.numel(), "rollout_share": share_rollouts, "low_prob_share": low_prob,
         "max_abs_log_ratio": float(p.l.abs()[bad].max()),
         "where": [[int(rows[k]), int(pos[k])] for k in worst.tolist()]})


def _precision(p: _Pairs, keep: torch.Tensor, stats: dict[str, float]) -> Finding:
    floor = noise_floor(p, keep)
    dtype = rounding_dtype(floor)
    level = _level(stats)
    advice = ("plain rounding noise; a geometric or token band absorbs it" if level == "ok" else
              "more than rounding alone explains (policy lag, a kernel difference): correct it (a geometric "
              "band or sequence TIS) and look for the source")
    return Finding(
        "precision_noise", level,
        f"The remaining mismatch is a noise floor of {floor:.2g} nats at branching tokens, consistent with "
        f"{dtype} rounding ({floor / UNIT_ROUNDOFF['bf16']:.2g} bf16 unit roundoffs): {advice}. "
        + _threshold_clause(stats),
        {"dtype": dtype, "noise_floor": floor, "roundoffs_bf16": floor / UNIT_ROUNDOFF["bf16"], **stats})


def _threshold_clause(stats: dict[str, float]) -> str:
    chi2 = stats["chi2_token"]  # mean of rho^2 - 1: below 0 only by sampling noise (a chi-square is at least 0)
    said = f"{chi2:.2e}" if chi2 >= 0 else f"0 (the estimate came out at {chi2:.1e}: noise, the true value is >= 0)"
    return (f"Batch: mean exp|l| {stats['mult_prob_error']:.4f} (NeMo-RL investigates above "
            f"{NEMO_MULT_PROB_ERROR}), KL {stats['kl_k1']:.2e} (verl: significant above {VERL_KL}), chi2 "
            f"{said} (verl: severe above {VERL_CHI2}).")
