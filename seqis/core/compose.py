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
              prefix sum), the criteria see each token's clamped l (prob_diff and the binary KLs excepted:
              probabilities are raw); clamp_order "aggregate" (SkyRL, slime) makes a rollout's sum or mean ratio
              rule see its raw aggregate clamped instead; weight_clamp_order "token" (ms-swift, open-instruct)
              makes the weight's exponent the aggregate of each token's clamped l, with no clamp after it
              (l = (+25, -20), c = 20: mean 0, weight 1, where "aggregate" gives e^2.5)
    batch     a rule over the batch's loss tokens at once (AReaL's M2PO): drop the largest l_t^2 until the rest's
              mean is below a threshold; its dropped tokens leave the loss's normaliser

Statistics beyond the four KL estimators: exp_abs_log_ratio e^|l| (NeMo-RL's mult_prob_error),
abs_ratio_minus_one |rho - 1|, binary_kl max(KL_B(pi || mu), KL_B(mu || pi)) with probabilities clamped to
[1e-8, 1 - 1e-8] (AReaL's KPop), binary_kl_mu sign(pi - mu) * KL_B(mu || pi), with KL_B(mu || pi) =
mu log(mu / pi) + (1 - mu) log((1 - mu + 1e-8) / (1 - pi + 1e-8)) (SkyRL's one-sided DPPO: the sign says which way
the probability moved); KL_B is the KL of the two-outcome split "this token or any other"; logit_gradient
rho_t (1 - pi_t), Aleph Alpha Kolibri's bound on the sampled token's logit gradient (their rule: at most 2, a
Criterion("logit_gradient", high=2.0)). A criterion's band is
inclusive unless strict (SkyRL's rollout_is: lo < r < hi); a rule that leaves_normaliser (NeMo-RL's
seq_logprob_error) takes the tokens it drops out of the loss's token count N, so the kept weights scale by
N / N_after. A sequence weight with gamma (k+, lambda+, k-, lambda-) is TRL's VESPO phi(W) = exp(lambda + k log W -
lambda W), (k, lambda) by the advantage's sign, W the product of the token ratios each truncated at token_clip.

Bands are inclusive; a geometric or product ratio within the rounding of S_j / T_j of an edge is on it.
Edge space: a band on a ratio (a ratio criterion's, the weight's band) compares the log-ratio x with log C
("log", verl's and prime-rl's arithmetic), or exp(x) with C in the compute dtype ("ratio": TRL's, ms-swift's,
open-instruct's `exp(l) <= C`), exactly as written: no rounding tolerance. The two differ only for an x within
an ulp or so of log C (TRL: l = log 3 gives exp(l) = 3.0000000000000004 > 3 in float64, dropped; l <= log 3 keeps
it). The truncation min(w, C) is not a decision: it stays exp(min(x, log C)).

The gradient coefficient on a loss token is weights_t = w_t * 1[kept_t]; the loss is
-sum_t s_t * weights_t * adv_tau * A_t * log pi_t (+ the penalty). Export, summaries, the lab and the widgets
read these fields; nothing outside a registry entry branches on its name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

# verl, SkyRL and slime's MIS clamp log-ratios to [-20, 20] before exponentiating ("SAFETY_BOUND"), and so do
# the frameworks whose exporters write a clamp: the one value every preset and exporter reads
SAFETY_BOUND = 20.0

WEIGHT_LEVELS = ("none", "token", "sequence", "geometric", "prefix")
STATISTICS = ("ratio", "k1", "k2", "k3", "prob_diff", "exp_abs_log_ratio", "abs_ratio_minus_one", "binary_kl",
              "binary_kl_mu", "logit_gradient")
CLAMP_ORDERS = ("token", "aggregate")  # the clamp: each l_t first, or a rollout's aggregate (of the raw l)
EDGE_SPACES = ("log", "ratio")  # a ratio band's edges: x against log C, or exp(x) against C (the compute dtype)
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
    normalize_all: bool = False  # self_normalize of a rollout weight: the mean over every rollout, empty ones (0)
    token_clip: float | None = None  # sequence level: each token's ratio truncated at this before the product
    gamma: tuple[float, float, float, float] | None = None  # sequence: VESPO's (k+, lambda+, k-, lambda-) of exp S
    edge_space: str = "log"  # the band's edges: "log" (x against log C) or "ratio" (exp(x) against C: TRL)

    def __post_init__(self):
        _choice("Weight", "level", self.level, WEIGHT_LEVELS)
        _choice("Weight", "edge_space", self.edge_space, EDGE_SPACES)
        if self.edge_space == "ratio" and self.band is None:
            raise ValueError("Weight.edge_space 'ratio' takes a band (it says how the band's edges are compared)")
        if self.token_clip is not None:
            _number("Weight", "token_clip", self.token_clip, low=0.0, open_low=True)
        if self.gamma is not None:
            if not isinstance(self.gamma, tuple) or len(self.gamma) != 4:
                raise ValueError(f"Weight.gamma must be (k+, lambda+, k-, lambda-), got {self.gamma!r}")
            for i, v in enumerate(self.gamma):
                _number("Weight", f"gamma[{i}]", v, low=0.0, allow_inf=False)
        if self.normalize_all and not (self.self_normalize and self.per_rollout):
            raise ValueError("Weight.normalize_all takes a self-normalised sequence or geometric weight")
        if (self.token_clip is not None or self.gamma is not None) and (
                self.level != "sequence" or self.truncated or self.band is not None or self.self_normalize):
            raise ValueError("Weight.token_clip and Weight.gamma take a sequence weight without clip, band or "
                             "self_normalize")
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

    def plain(self, level: str | None = None) -> bool:
        """The ratio at its level (or at `level`) untouched: no clip, lower clamp, band or normalisation."""
        return ((level is None or self.level == level) and math.isinf(self.upper) and self.clip_low == 0.0
                and self.band is None and not self.self_normalize and self.token_clip is None and self.gamma is None)


@dataclass(frozen=True)
class Criterion:
    """A rejection rule: keep where low <= statistic <= high (inclusive; None opens a side)."""

    statistic: str = "ratio"  # "ratio" | "k1" | "k2" | "k3" | "prob_diff"
    agg: str = "token"  # "token" | "sum" | "mean" | "max" | "min" over the rollout's loss tokens
    low: float | None = None
    high: float | None = None
    advantage: str | None = None  # None, or only drop where A is "positive" | "negative" | "non-negative" | ...
    strict: bool = False  # open edges: keep where low < statistic < high
    leaves_normaliser: bool = False  # the tokens it drops leave the loss's token count N too
    edge_space: str = "log"  # a ratio's edges: "log" (x against log C) or "ratio" (exp(x) against C: ms-swift)

    def __post_init__(self):
        _choice("Criterion", "statistic", self.statistic, STATISTICS)
        _choice("Criterion", "edge_space", self.edge_space, EDGE_SPACES)
        if self.edge_space == "ratio" and self.statistic != "ratio":
            raise ValueError(f"Criterion.edge_space 'ratio' takes the ratio statistic ({self.statistic} is compared "
                             "in its own units)")
        for flag in ("strict", "leaves_normaliser"):
            if not isinstance(getattr(self, flag), bool):
                raise ValueError(f"Criterion.{flag} must be True or False, got {getattr(self, flag)!r}")
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

    @property
    def bounds(self) -> tuple[float, float]:
        """(low, high) with an open side as 0 (a ratio) or -inf, and inf."""
        return (self.low if self.low is not None else (0.0 if self.statistic == "ratio" else -math.inf),
                self.high if self.high is not None else math.inf)


@dataclass(frozen=True)
class Penalty:
    """coef * sum_t s_t f(l_t) over the loss tokens, added to the loss (s_t: the aggregation's normaliser)."""

    coef: float
    statistic: str = "squared_log_ratio"  # f(l) = l^2 ("squared_log_ratio") or rho - 1 - l ("k3")

    def __post_init__(self):
        _number("Penalty", "coef", self.coef, allow_inf=False)
        _choice("Penalty", "statistic", self.statistic, PENALTIES)


# where a band on a ratio acts: a token's rho_t (or its prefix ratio), a rollout's product exp(S_j) or geometric
# ratio exp(S_j / T_j), or every token of a rollout at once (a max / min rule: one token outside drops the rollout)
BAND_LEVELS = ("token", "prefix", "sequence", "geometric", "every")
_BAND_LEVEL = {"token": "token", "sum": "sequence", "mean": "geometric", "max": "every", "min": "every"}


@dataclass(frozen=True)
class Band:
    """A band [low, high] on a ratio (0 and inf: open sides) at one level (BAND_LEVELS), from the weight's band
    or a criterion, optionally acting only where the advantage has a sign."""

    level: str
    low: float
    high: float
    source: str  # "weight" | "criterion"
    advantage: str | None = None


@dataclass(frozen=True)
class PPOClip:
    """The PPO-clip pattern (ppo_clip_criteria): A > 0 keeps r <= 1 + eps_high, A < 0 keeps r >= 1 - eps_low
    (and r <= clip_c with dual clip), r = pi / mu per token; the gradient there is r * A."""

    eps_low: float
    eps_high: float
    clip_c: float | None  # None: no dual clip


def ppo_clip_criteria(eps_low: float, eps_high: float, clip_c: float | None = None) -> tuple[Criterion, ...]:
    """Where the PPO-clip loss -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A) has a gradient, r = pi / mu:
    A > 0 needs r <= 1 + eps_high, A < 0 needs r >= 1 - eps_low (and r <= c with dual clip c); the gradient
    there is r * A, so the weight is the token ratio itself."""
    up = Criterion("ratio", "token", high=1.0 + eps_high, advantage="positive")
    down = Criterion("ratio", "token", low=1.0 - eps_low, high=clip_c, advantage="negative")
    return up, down


@dataclass(frozen=True)
class BatchRule:
    """AReaL's M2PO: over all the batch's loss tokens, sorted by l_t^2 from the largest, drop the first k, k the
    first count whose remaining tokens' mean l^2 is below `threshold` (strictly; none such: all but the smallest);
    ties keep their order in the batch. The dropped tokens leave the loss's token count N (AReaL divides by the
    survivors)."""

    threshold: float

    def __post_init__(self):
        _number("BatchRule", "threshold", self.threshold, low=0.0, open_low=True, allow_inf=False)


CENTERING_RULES = ("none", "truncate", "band", "clamp")  # f of a score-centering term: 1, min(x, C), band, clamp


@dataclass(frozen=True)
class Centering:
    """Score centering (Marek & Ryabinin, arXiv 2609.20807): an additive per-token term over the sampler's top-k head H
    that subtracts the sampler-expected score, so a constant reward moves nothing. Per loss token t, q_v and p_v the
    sampler's and the trainer's probability of head token v (normalised over the whole vocabulary):

        rho_tail = max(1 - Q_H, sampler_floor) / max(1 - P_H, trainer_floor)   (a floor of None: 0, a mass is
                   never below 0; no floor either side and both tails 0 within rounding, the whole vocabulary in
                   H: alpha = 1; rho_tail = 0: alpha is its limit, lim f(x) / x, 1 for f = x)
        alpha    = rho_tail * f(1 / rho_tail)
        c_v      = sg(q_v f(p_v / q_v) - alpha p_v);   C_t = sum over v in H of c_v log p_v
        loss    += s_t * adv_tau * A_t * C_t            (s_t the aggregation's normaliser, every loss token)

    f is the token rule the correction uses: "none" 1, "truncate" min(x, high), "band" x 1[low <= x <= high], "clamp"
    clamp(x, low, high). exact=True: sampling was truncated and its support replayed (`Batch.topk_support`): the sum
    runs over the support with the trainer renormalised on it (p'_v = p_v / P_S), no tail model, c_v = sg(q_v
    f(p'_v / q_v) - p'_v) (the - p'_v adds sum p' grad log p' = 0 to the gradient, and makes c = 0 for f = x).
    prob_diff (exact only; prime-rl's IPO): f is also 0 on a support token whose probability moved more than this,
    |p'_v - q_v| > prob_diff (IPO's trust region applied to the head as to the sampled token)."""

    rule: str = "none"
    low: float | None = None
    high: float | None = None
    sampler_floor: float | None = 1e-6  # verl clamps both tail masses at 1e-6
    trainer_floor: float | None = 1e-6
    exact: bool = False
    prob_diff: float | None = None  # exact only: f zeroed where |p'_v - q_v| > prob_diff (prime-rl's IPO)

    def __post_init__(self):
        _choice("Centering", "rule", self.rule, CENTERING_RULES)
        if self.prob_diff is not None:
            _number("Centering", "prob_diff", self.prob_diff, low=0.0)
            if not self.exact:
                raise ValueError("Centering.prob_diff takes the exact variant (prime-rl's IPO centers over the "
                                 "replayed support); exact must be True")
        if self.rule in ("truncate", "band", "clamp"):
            _number("Centering", "high", self.high, low=0.0, open_low=True)
        if self.rule in ("band", "clamp"):
            _number("Centering", "low", self.low, low=0.0)
            if self.low > self.high:
                raise ValueError(f"Centering.low must be below Centering.high, got {self.low} > {self.high}")
        for name in ("sampler_floor", "trainer_floor"):
            if getattr(self, name) is not None:
                _number("Centering", name, getattr(self, name), low=0.0, allow_inf=False)

    def f(self, x):
        """The token rule on a ratio tensor x (the same rule the head and the tail's alpha read)."""
        if self.rule == "none":
            return x.new_ones(()).expand_as(x)
        if self.rule == "truncate":
            return x.clamp(max=self.high)
        if self.rule == "band":
            return x.where((x >= self.low) & (x <= self.high), x.new_zeros(()))
        return x.clamp(self.low, self.high)

    def head_rule(self, ratio, p, q):
        """f on the head's ratios p_v / q_v, zeroed where prob_diff's trust region drops the token (|p - q| above
        it; p, q the head's probabilities, the trainer's renormalised on the support in the exact variant)."""
        f = self.f(ratio)
        if self.prob_diff is None:
            return f
        return f.where((p - q).abs() <= self.prob_diff, f.new_zeros(()))

    def describe(self) -> str:
        f = {"none": "1", "truncate": f"min(x, {_fmt(self.high or 0)})",
             "band": f"x in [{_fmt(self.low or 0)}, {_fmt(self.high or 0)}]",
             "clamp": f"clamp(x, {_fmt(self.low or 0)}, {_fmt(self.high or 0)})"}[self.rule]
        if self.exact:
            trust = "" if self.prob_diff is None else f", 0 where |p - q| > {_fmt(self.prob_diff)}"
            return f"plus score centering over the replayed sampling support (f = {f}{trust})"
        floors = f"tail floors {self.sampler_floor} (sampler), {self.trainer_floor} (trainer)"
        return f"plus score centering over the sampler's top-k head (f = {f}; {floors})"


@dataclass(frozen=True)
class Composition:
    """One correction: a weight, chained rejection criteria, an optional penalty and log-ratio clamp."""

    weight: Weight = field(default_factory=Weight)
    criteria: tuple[Criterion, ...] = ()
    penalty: Penalty | None = None
    log_ratio_clamp: float | None = None  # c: weight exponents and criteria's l clamped to [-c, c] (verl: 20)
    adv_tau: float = 1.0
    clamp_order: str = "token"  # "aggregate": a rollout's sum / mean ratio rule sees clamp(aggregate of raw l)
    batch_rule: BatchRule | None = None  # M2PO
    weight_clamp_order: str = "aggregate"  # "token": the weight's exponent aggregates each clamped l_t (ms-swift)
    centering: Centering | None = None  # score centering over the sampler's top-k head (needs Batch's head)

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
        _choice("Composition", "clamp_order", self.clamp_order, CLAMP_ORDERS)
        _choice("Composition", "weight_clamp_order", self.weight_clamp_order, CLAMP_ORDERS)
        if self.batch_rule is not None and not isinstance(self.batch_rule, BatchRule):
            raise ValueError(f"Composition.batch_rule must be a BatchRule or None, got {self.batch_rule!r}")
        if self.centering is not None and not isinstance(self.centering, Centering):
            raise ValueError(f"Composition.centering must be a Centering or None, got {self.centering!r}")

    @property
    def unbiased(self) -> bool:
        """Plain sequence-level IS: the product weight untouched (no truncation, band, clamp or self-normalisation)
        and nothing rejected or added, so the gradient is unbiased under valid IS (up to the e^40 weight cap)."""
        w = self.weight
        return (w.level == "sequence" and w.plain() and not self.criteria and self.penalty is None
                and self.log_ratio_clamp is None and self.batch_rule is None and self.centering is None)

    @property
    def plain(self) -> bool:
        """Nothing but the weight: no rejection rule, penalty, clamp or centering term."""
        return (not self.criteria and self.penalty is None and self.log_ratio_clamp is None and self.batch_rule is None
                and self.centering is None)

    @property
    def token_rules(self) -> tuple[Criterion, ...]:
        """The criteria that decide token by token."""
        return tuple(c for c in self.criteria if not c.per_rollout)

    @property
    def rollout_rules(self) -> tuple[Criterion, ...]:
        """The criteria that decide a whole rollout (by a sum, mean, max or min over its loss tokens)."""
        return tuple(c for c in self.criteria if c.per_rollout)

    def ratio_bands(self) -> tuple[Band, ...]:
        """Every band on a ratio: the weight's band at its level, and each criterion on the ratio statistic at
        the level its aggregation acts on (max / min: "every"). Criteria on other statistics are not bands on a
        ratio (k1 is one on 1 / ratio; see the criteria themselves)."""
        out = []
        w = self.weight
        if w.band is not None:
            out.append(Band(w.level, w.band[0], w.band[1], "weight"))
        for c in self.criteria:
            if c.statistic == "ratio":
                out.append(Band(_BAND_LEVEL[c.agg], *c.bounds, "criterion", c.advantage))
        return tuple(out)

    def rollout_bands(self) -> tuple[Band, ...] | None:
        """The bands that decide whole rollouts, on the ratio and unconditioned: the product or geometric band of
        each sum / mean rule, one "every" band for the max / min rules together, the sequence weight's band.
        None when a rule is conditioned on the advantage's sign or a rollout rule is on another statistic (its
        verdict is not a band on a ratio)."""
        if any(c.advantage is not None for c in self.criteria):
            return None
        rules = self.rollout_rules
        if any(c.statistic != "ratio" for c in rules):
            return None
        bands = [Band(_BAND_LEVEL[c.agg], *c.bounds, "criterion") for c in rules if c.agg in ("sum", "mean")]
        every = [c for c in rules if c.agg in ("max", "min")]
        if every:  # max_t rho_t <= hi and min_t rho_t >= lo together: every token in [lo, hi]
            bands.append(Band("every", max(c.bounds[0] for c in every), min(c.bounds[1] for c in every),
                              "criterion"))
        if self.weight.level == "sequence" and self.weight.band is not None:
            bands.append(Band("sequence", *self.weight.band, "weight"))
        return tuple(bands)

    @property
    def catches_single_tokens(self) -> bool:
        """Whether one token outside a band on its ratio loses its gradient or its rollout's (a token rule, a
        max / min rule, a token weight's band), whatever the rollout's length."""
        return any(b.level in ("token", "prefix", "every") for b in self.ratio_bands())

    def truncation(self) -> tuple[str, float, float] | None:
        """(level, low, high) of the weight's truncation min(max(w, low), high); None without one."""
        w = self.weight
        return (w.level, w.clip_low, w.upper) if w.truncated else None

    def ppo_clip(self) -> tuple[PPOClip, tuple[Criterion, ...]] | None:
        """The PPO-clip pattern and the other criteria, when the composition has it (with the plain token ratio
        as its weight: PPO's gradient is r * A); else None."""
        up = [c for c in self.criteria if c.statistic == "ratio" and c.agg == "token" and c.advantage == "positive"
              and c.low is None and c.high is not None]
        down = [c for c in self.criteria if c.statistic == "ratio" and c.agg == "token"
                and c.advantage == "negative" and c.low is not None]
        if len(up) != 1 or len(down) != 1 or not self.weight.plain("token"):
            return None
        rest = tuple(c for c in self.criteria if c is not up[0] and c is not down[0])
        clean = lambda x: float(f"{x:.15g}")  # 1 - 0.8 is 0.2, not 0.19999999999999996
        return PPOClip(clean(1.0 - down[0].low), clean(up[0].high - 1.0), down[0].high), rest

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
                s += " (exp(x) compared with the edges)" if w.edge_space == "ratio" else ""
            if w.self_normalize:
                s += ", self-normalised" + (" over every rollout, empty ones included" if w.normalize_all else "")
            if w.token_clip is not None:
                s += f" of token ratios truncated at {_fmt(w.token_clip)}"
            if w.gamma is not None:
                s += " through VESPO's gamma (k, lambda) = ({}, {}) for A >= 0, ({}, {}) below".format(
                    *map(_fmt, w.gamma))
            parts.append(s)
        for c in self.criteria:
            where = "tokens" if c.agg == "token" else f"rollouts by {c.agg}"
            band = f"[{_fmt(c.low) if c.low is not None else '-inf'}, {_fmt(c.high) if c.high is not None else 'inf'}]"
            cond = f" when A is {c.advantage}" if c.advantage else ""
            if c.strict:
                band = "(" + band[1:-1] + ")"
            left = ", leaving the token count" if c.leaves_normaliser else ""
            space = " (exp(x) compared with the edges)" if c.edge_space == "ratio" else ""
            parts.append(f"drop {where} with {c.statistic} outside {band}{space}{cond}{left}")
        if self.batch_rule is not None:
            parts.append(f"drop the batch's largest l^2 until their mean is below {_fmt(self.batch_rule.threshold)}")
        if self.penalty is not None:
            parts.append(f"plus {_fmt(self.penalty.coef)} * {self.penalty.statistic} penalty")
        if self.log_ratio_clamp is not None:
            after = ", a rollout's sum or mean after aggregating" if self.clamp_order == "aggregate" else ""
            if self.weight_clamp_order == "token" and w.level in ("sequence", "geometric", "prefix"):
                after += ", each token's before the weight aggregates them"
            parts.append(f"log-ratios clamped to +-{_fmt(self.log_ratio_clamp)}{after}")
        if self.centering is not None:
            parts.append(self.centering.describe())
        return "; ".join(parts)


def _fmt(x: float) -> str:
    return "inf" if x == math.inf else f"{x:.6g}"
