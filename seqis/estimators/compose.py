"""The composable correction: every IS estimator and every framework's preset is one `Composition`.

A composition says, as plain data, what happens to each loss token's gradient:

    weight    w_t: the IS weight at one level (token rho_t, sequence exp S_j, geometric exp(S_j / T_j), prefix
              exp(sum_{s<=t} l_s), or none = 1); truncated min(max(w, clip_low), clip), and/or masked to a band
              w * 1[lo <= w <= hi] (outside the band the token or rollout is dropped); optionally divided by its
              batch mean (self-normalised, as verl's rollout_is_batch_normalize)
    criteria  rejection rules, chained (all must pass): a statistic (ratio rho, k1 = -l, k2 = l^2 / 2,
              k3 = rho - 1 - l, prob_diff = pi_t - mu_t) per token or aggregated over the rollout's loss tokens
              (sum, mean, max, min: a rollout-level rule drops the whole rollout), an inclusive band [low, high],
              optionally applied only where the advantage has a sign (PPO-clip, DPPO, OPSM)
    penalty   a term added to the loss: coef * sum_t s_t f(l_t) (prime-rl's KL: f = l^2), s_t the aggregation's
              normaliser; it adds coef * f'(l_t) * s_t to d loss / d log pi_t, beside -weights * adv_tau * A * s_t
    clamp     verl's, SkyRL's and slime's SAFETY_BOUND (20), as their code applies it: the weight's exponent is
              clamped to [-c, c] after aggregating the raw l (token l_t, sequence S_j, geometric S_j / T_j,
              prefix sum), the criteria see each token's clamped l (prob_diff excepted: probabilities are raw)

Bands are inclusive; a geometric or product ratio within the rounding of S_j / T_j of an edge is on it.

The gradient coefficient on a loss token is weights_t = w_t * 1[kept_t]; the loss is
-sum_t s_t * weights_t * adv_tau * A_t * log pi_t (+ the penalty). Export, summaries, the lab and the widgets
read these fields; nothing outside a registry entry branches on its name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

WEIGHT_LEVELS = ("none", "token", "sequence", "geometric", "prefix")
STATISTICS = ("ratio", "k1", "k2", "k3", "prob_diff")
AGGREGATES = ("token", "sum", "mean", "max", "min")
ADVANTAGE_SIGNS = ("positive", "negative", "non-negative", "non-positive")
PENALTIES = ("squared_log_ratio", "k3")


def _number(owner: str, name: str, v, *, low: float = -math.inf, open_low: bool = False,
            allow_inf: bool = True) -> None:
    """Refuse a value that is not a number in range, naming the field."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v):
        raise ValueError(f"{owner}.{name} must be a number, got {v!r}")
    if (v <= low) if open_low else (v < low):
        raise ValueError(f"{owner}.{name} must be {'>' if open_low else '>='} {low}, got {v}")
    if not allow_inf and math.isinf(v):
        raise ValueError(f"{owner}.{name} must be finite, got {v}")


def _choice(owner: str, name: str, v, choices: tuple) -> None:
    if v not in choices:
        raise ValueError(f"{owner}.{name} must be one of {', '.join(map(repr, choices))}; got {v!r}")


@dataclass(frozen=True)
class Weight:
    """The IS weight on each loss token (before adv_tau * A); every weight also keeps the e^40 cap."""

    level: str = "none"  # "none" | "token" | "sequence" | "geometric" | "prefix"
    clip: float | None = None  # truncation min(w, clip); None: none (inf: a truncation knob that is open)
    clip_low: float = 0.0  # lower clamp max(w, clip_low); 0: none
    band: tuple[float, float] | None = None  # w * 1[lo <= w <= hi], inclusive; outside it the gradient is dropped
    self_normalize: bool = False  # divide by the batch mean of the weight (token: over loss tokens; rollout: valid)

    def __post_init__(self):
        _choice("Weight", "level", self.level, WEIGHT_LEVELS)
        if self.clip is not None:
            _number("Weight", "clip", self.clip, low=0.0, open_low=True)
        _number("Weight", "clip_low", self.clip_low, low=0.0, allow_inf=False)
        if not self.clip_low < self.upper:
            raise ValueError(f"Weight.clip_low must be below Weight.clip, got {self.clip_low} >= {self.clip}")
        if self.band is not None:
            if not isinstance(self.band, tuple) or len(self.band) != 2:
                raise ValueError(f"Weight.band must be a (low, high) tuple or None, got {self.band!r}")
            _number("Weight", "band[0]", self.band[0], low=0.0, allow_inf=False)
            _number("Weight", "band[1]", self.band[1], low=0.0, open_low=True)
            if not self.band[0] < self.band[1]:
                raise ValueError(f"Weight.band low must be below high, got {self.band}")
        if self.level == "none" and (self.truncated or self.band is not None or self.self_normalize):
            raise ValueError("Weight.level 'none' takes no clip, band or self_normalize")
        if not isinstance(self.self_normalize, bool):
            raise ValueError(f"Weight.self_normalize must be True or False, got {self.self_normalize!r}")

    @property
    def truncated(self) -> bool:
        """Whether the weight has a truncation (its "clipped" mask and flags exist, even at an open clip)."""
        return self.clip is not None or self.clip_low != 0.0

    @property
    def upper(self) -> float:
        """The truncation's upper edge, inf without one."""
        return math.inf if self.clip is None else self.clip

    @property
    def per_rollout(self) -> bool:
        """One weight for all of a rollout's tokens (sequence, geometric) rather than one per token."""
        return self.level in ("sequence", "geometric")


@dataclass(frozen=True)
class Criterion:
    """A rejection rule: keep where low <= statistic <= high (inclusive; None opens a side)."""

    statistic: str = "ratio"  # "ratio" | "k1" | "k2" | "k3" | "prob_diff"
    agg: str = "token"  # "token" | "sum" | "mean" | "max" | "min" over the rollout's loss tokens
    low: float | None = None
    high: float | None = None
    advantage: str | None = None  # None, or only drop where A is "positive" | "negative" | "non-negative" | ...

    def __post_init__(self):
        _choice("Criterion", "statistic", self.statistic, STATISTICS)
        _choice("Criterion", "agg", self.agg, AGGREGATES)
        if self.advantage is not None:
            _choice("Criterion", "advantage", self.advantage, ADVANTAGE_SIGNS)
        floor = 0.0 if self.statistic == "ratio" else -math.inf
        for side in ("low", "high"):
            v = getattr(self, side)
            if v is not None:
                _number("Criterion", side, v, low=floor)
        if self.low is None and self.high is None:
            raise ValueError(f"Criterion on {self.statistic} needs a low or a high edge, got neither")
        if self.low is not None and self.high is not None and not self.low < self.high:
            raise ValueError(f"Criterion.low must be below Criterion.high, got {self.low} >= {self.high}")

    @property
    def per_rollout(self) -> bool:
        return self.agg != "token"


@dataclass(frozen=True)
class Penalty:
    """coef * sum_t s_t f(l_t) over the loss tokens, added to the loss (s_t: the aggregation's normaliser)."""

    coef: float
    statistic: str = "squared_log_ratio"  # f(l) = l^2 ("squared_log_ratio") or rho - 1 - l ("k3")

    def __post_init__(self):
        _number("Penalty", "coef", self.coef, allow_inf=False)
        _choice("Penalty", "statistic", self.statistic, PENALTIES)


@dataclass(frozen=True)
class Composition:
    """One correction: a weight, chained rejection criteria, an optional penalty and log-ratio clamp."""

    weight: Weight = field(default_factory=Weight)
    criteria: tuple[Criterion, ...] = ()
    penalty: Penalty | None = None
    log_ratio_clamp: float | None = None  # c: weight exponents and criteria's l clamped to [-c, c] (verl: 20)
    adv_tau: float = 1.0

    def __post_init__(self):
        if not isinstance(self.weight, Weight):
            raise ValueError(f"Composition.weight must be a Weight, got {type(self.weight).__name__}")
        if not isinstance(self.criteria, tuple) or not all(isinstance(c, Criterion) for c in self.criteria):
            raise ValueError("Composition.criteria must be a tuple of Criterion")
        if self.penalty is not None and not isinstance(self.penalty, Penalty):
            raise ValueError(f"Composition.penalty must be a Penalty or None, got {type(self.penalty).__name__}")
        if self.log_ratio_clamp is not None:
            _number("Composition", "log_ratio_clamp", self.log_ratio_clamp, low=0.0, open_low=True)
        _number("Composition", "adv_tau", self.adv_tau, low=0.0, open_low=True, allow_inf=False)

    @property
    def unbiased(self) -> bool:
        """Plain sequence-level IS: the product weight untouched (no truncation, band, clamp or self-normalisation)
        and nothing rejected or added, so the gradient is unbiased under valid IS (up to the e^40 weight cap)."""
        w = self.weight
        return (w.level == "sequence" and (w.clip is None or w.clip == math.inf) and w.clip_low == 0.0
                and w.band is None and not w.self_normalize and not self.criteria and self.penalty is None
                and self.log_ratio_clamp is None)

    def describe(self) -> str:
        """One line in words, e.g. 'sequence weight truncated at 2; drop rollouts with mean ratio outside
        [0.5, 2]'."""
        w = self.weight
        parts = []
        if w.level == "none":
            parts.append("weight 1")
        else:
            s = f"{w.level} weight"
            if w.truncated:
                lo, hi = _fmt(w.clip_low), _fmt(w.upper)
                s += f" truncated to [{lo}, {hi}]" if w.clip_low else f" truncated at {hi}"
            if w.band is not None:
                s += f" masked to [{_fmt(w.band[0])}, {_fmt(w.band[1])}]"
            if w.self_normalize:
                s += ", self-normalised"
            parts.append(s)
        for c in self.criteria:
            where = "tokens" if c.agg == "token" else f"rollouts by {c.agg}"
            band = f"[{_fmt(c.low) if c.low is not None else '-inf'}, {_fmt(c.high) if c.high is not None else 'inf'}]"
            cond = f" when A is {c.advantage}" if c.advantage else ""
            parts.append(f"drop {where} with {c.statistic} outside {band}{cond}")
        if self.penalty is not None:
            parts.append(f"plus {_fmt(self.penalty.coef)} * {self.penalty.statistic} penalty")
        if self.log_ratio_clamp is not None:
            parts.append(f"log-ratios clamped to +-{_fmt(self.log_ratio_clamp)}")
        return "; ".join(parts)


def _fmt(x: float) -> str:
    return "inf" if x == math.inf else f"{x:.6g}"
