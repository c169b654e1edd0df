"""Synthetic rollout batches shaped like an LLM's, with a chosen kind of trainer/sampler mismatch.

A batch is built in five steps, all vectorised over (B, T) and drawn from one explicit
`torch.Generator` on the CPU (so a seed gives the same batch on any device; it is moved at the end):

1. Lengths. "fixed" (every rollout max_len tokens), "uniform" (min_len..max_len) or "long_tail":
   min_len + span * min(1, exp(log(1/8) + Z)), Z ~ N(0, 1): the median rollout is an eighth of the
   span, and about 2% run into max_len, as real rollouts cut at max_tokens do.
2. The sampler's log-probs, shaped like an LLM's. Most tokens are near-certain: log mu ~ -1e-3..-1e-2
   (log-uniform in magnitude). A fraction `branch_frac` are branching tokens, where the model chose
   between real alternatives: log mu from branch_logp_high down to branch_logp_low (-1 to -8 by
   default), log-uniform in magnitude, so -1..-2 is common and -8 is rare.
3. GRPO advantages. Rollouts come in groups of G (group_id = j // G; the last group may be short).
   Rewards are binary: 1[c z_len + sqrt(1 - c^2) eps > Phi^-1(1 - success_rate)], z_len the rollout's
   standardised log-length and c = reward_length_corr (negative: long rollouts fail more). The
   advantage is reward - group mean, divided by the group's std + 1e-6 when norm_std is on.
4. The mismatch l_t = log pi(y_t) - log mu(y_t), one scenario per config class (SCENARIOS):
     gaussian      l ~ N(-s^2/2, s^2): a valid IS model (E_mu[rho] = 1, per-token KL(mu||pi) = s^2/2)
     drift         l = log r on every token: Li's deterministic drift, NOT a valid IS model
                   (E_mu[rho] = r != 1); it shows how a product ratio r^T explodes with length
     catastrophic  background noise plus a small fraction of tokens with |l| ~ cat_size, mostly on
                   branching (low-probability) tokens, both signs
     precision     l ~ N(-sigma_t^2/2, sigma_t^2), sigma_t = eps * (1 - p_t): a logit perturbation of
                   size eps moves log p_t by about eps (1 - p_t), so near-certain tokens barely move and
                   low-probability tokens move most; eps per preset (fp16 / bf16 / fp8), calibrated so
                   the per-token KL lands where engines are measured (at the defaults: fp16 6e-6,
                   bf16 4e-4, fp8 7e-3; engines are measured at 5e-4 to 1e-2)
     policy_lag    a small softmax policy over V tokens in C contexts samples the rollouts (mu); the
                   trainer's pi is the same policy K gradient steps later; both log-probs are exact
                   log-softmaxes (the base log-probs of step 2 are not used: the policy makes its own)
     fp8_logits    the same kind of policy, the sampler's logits rounded to fp8 e4m3 (the largest at
                   logit_offset), the trainer's exact: the fp8-rollout setting where score centering was shown
                   to matter (verl #8010: bypass_pg collapsed, bypass_pg_sc did not)

5. The sampler's head (seqis.samplers.heads; head_k = 0: none): the sampler's top-k of its table where the
   scenario has one (policy_lag, fp8_logits), else a consistent synthetic head; it draws from its own generator,
   so every other field is what it was before heads.

   Both log-probs stay <= 0: the LLM-like value of step 2 is the larger of the two, and the other sits
   |l| below it (log mu = base - max(l, 0), log pi = base + min(l, 0), so log pi - log mu = l exactly).

    from seqis.samplers.scenarios import make_batch, SCENARIOS
    batch = make_batch("gaussian", seed=0, s=0.05, max_len=4096)     # defaults, with overrides
    batch = make_batch(SCENARIOS["precision"](preset="fp8"), seed=1, device="cuda")

MODEL_SCENARIOS are made by a real model instead: `make_batch("tiny_lm", seed=0, top_p=0.9)` samples the tiny
transformer through a faulty sampler (temperature, top-p / top-k, off-by-one, kernel bug, bf16 / fp16), with
the truth in its metadata (seqis.samplers.faults); `make_batch("lm_chat32k", seed=0, temperature=0.8)` samples one
of seqis.samplers.generators' recurrent LMs (256 to 32k tokens) the same way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from ..core.types import Batch, Knobs, knob, knobs
from .faults import TinyLMFaultConfig
from .generators import PRESETS as GENERATOR_PRESETS
from .heads import HEAD_K, head_fields, head_generator, synthetic_head, top_k_head

MAX_LEN = 32768  # the longest rollout a scenario may ask for
_CERTAIN_LOGP = (1e-3, 1e-2)  # |log mu| of a near-certain token, log-uniform between these


# ---------------------------------------------------------------------------------------------------------
# configs: knobs declared once; the explorer builds its controls from them


@dataclass(frozen=True)
class ScenarioConfig(Knobs):
    """Lengths, LLM-like sampler log-probs and GRPO groups: the fields every scenario shares."""

    name: ClassVar[str] = ""

    n_rollouts: int = knob(256, "B: rollouts in the batch.", ge=1, ui=(8, 2048), log=True)
    group_size: int = knob(8, "G: rollouts per prompt (a GRPO group); the baseline is the group's mean reward.",
                           ge=1, ui=(1, 64))
    lengths: str = knob("long_tail", "Rollout lengths: all max_len, uniform in [min_len, max_len], or long-tailed "
                        "(most short, a few at max_len).", choices=("fixed", "uniform", "long_tail"))
    max_len: int = knob(1024, "Longest rollout, in tokens (the batch is padded to the longest drawn).", ge=1,
                        ui=(16, MAX_LEN), log=True)
    min_len: int = knob(16, "Shortest rollout, in tokens (uniform and long_tail lengths).", ge=1, ui=(1, 4096),
                        log=True)
    branch_frac: float = knob(0.1, "Fraction of branching tokens (a real choice); the rest are near-certain "
                              "(log-prob -1e-3..-1e-2).", ge=0.0, ui=(0.0, 0.5))
    branch_logp_low: float = knob(-8.0, "Lowest log-prob of a branching token.", ui=(-16.0, -1.0))
    branch_logp_high: float = knob(-1.0, "Highest log-prob of a branching token (log-uniform in between).",
                                   ui=(-4.0, -0.05))
    success_rate: float = knob(0.5, "Fraction of rollouts with reward 1 (rewards are 0/1).", gt=0.0,
                               ui=(0.05, 0.95))
    reward_length_corr: float = knob(0.0, "Correlation of the reward's latent with log-length (negative: long "
                                     "rollouts fail more).", ge=-1.0, ui=(-1.0, 1.0))
    norm_std: bool = knob(False, "Divide each advantage by its group's reward std (GRPO's normalisation).",
                          choices=(False, True))
    head_k: int = knob(HEAD_K, "K: the sampler's top-k head each token carries (score centering reads it; 0: none).",
                       ge=0, ui=(0, 64))

    def __post_init__(self):
        for f in knobs(self):  # ints stay ints: 1024.0 from a slider is 1024, 1024.5 is refused
            v = getattr(self, f.name)
            if isinstance(f.default, int) and not isinstance(f.default, bool) and isinstance(v, float):
                if not v.is_integer():
                    raise ValueError(f"{f.name} must be a whole number, got {v}")
                object.__setattr__(self, f.name, int(v))
        super().__post_init__()
        if self.max_len > MAX_LEN:
            raise ValueError(f"max_len must be at most {MAX_LEN}, got {self.max_len}")
        if self.min_len > self.max_len:
            raise ValueError(f"min_len must be at most max_len, got {self.min_len} > {self.max_len}")
        if not self.branch_logp_high < 0:
            raise ValueError(f"branch_logp_high must be below 0 (a log-prob), got {self.branch_logp_high}")
        if not self.success_rate < 1:
            raise ValueError(f"success_rate must be below 1, got {self.success_rate}")
        if not self.reward_length_corr <= 1:
            raise ValueError(f"reward_length_corr must be in [-1, 1], got {self.reward_length_corr}")


@dataclass(frozen=True)
class GaussianConfig(ScenarioConfig):
    """Valid-IS noise: l ~ N(-s^2/2, s^2) on every token, so E[rho] = 1 and the per-token KL is s^2/2."""

    name: ClassVar[str] = "gaussian"
    s: float = knob(0.05, "s: std of the per-token log-ratio (per-token KL = s^2/2).", ge=0.0, ui=(0.0, 0.5))


@dataclass(frozen=True)
class DriftConfig(ScenarioConfig):
    """Deterministic drift l = log r on every token (Li's illustration): NOT a valid IS model, E[rho] = r."""

    name: ClassVar[str] = "drift"
    ratio: float = knob(1.001, "r: every token's ratio pi/mu; the product ratio is r^T.", gt=0.0,
                        ui=(0.99, 1.01))


@dataclass(frozen=True)
class CatastrophicConfig(ScenarioConfig):
    """Catastrophic tokens: a small fraction with |l| ~ cat_size, mostly on low-probability tokens, both signs."""

    name: ClassVar[str] = "catastrophic"
    cat_frac: float = knob(1e-3, "Fraction of tokens that are catastrophic.", ge=0.0, ui=(1e-5, 0.05), log=True)
    cat_size: float = knob(10.0, "Typical |l| of a catastrophic token (log-normal around it, within x/÷ e).", gt=0.0,
                           ui=(1.0, 30.0))
    cat_on_branch: float = knob(0.9, "Share of catastrophic tokens that fall on branching (low-probability) tokens.",
                                ge=0.0, ui=(0.0, 1.0))
    cat_positive: float = knob(0.5, "Share of catastrophic tokens with l > 0 (the trainer likes the token more).",
                               ge=0.0, ui=(0.0, 1.0))
    s: float = knob(0.02, "Std of the valid-IS background noise on every other token.", ge=0.0, ui=(0.0, 0.2))

    def __post_init__(self):
        super().__post_init__()
        for name in ("cat_frac", "cat_on_branch", "cat_positive"):
            if getattr(self, name) > 1:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")


# eps: size of the logit perturbation, calibrated to measured engine mismatch rather than derived from the
# mantissa (fp16 keeps 3 more mantissa bits than bf16, so its eps is 8x smaller).
PRECISION_EPS = {"fp16": 0.0125, "bf16": 0.1, "fp8": 0.4}


@dataclass(frozen=True)
class PrecisionConfig(ScenarioConfig):
    """Precision noise that grows as the token's probability falls: sigma_t = eps (1 - p_t), eps per preset."""

    name: ClassVar[str] = "precision"
    preset: str = knob("bf16", "The sampler's number format; sets eps (fp16 0.0125, bf16 0.1, fp8 0.4).",
                       choices=tuple(PRECISION_EPS))
    noise_scale: float = knob(1.0, "Multiplies the preset's eps.", ge=0.0, ui=(0.1, 10.0), log=True)


@dataclass(frozen=True)
class PolicyLagConfig(ScenarioConfig):
    """Policy lag: a small softmax policy samples, the trainer holds the same policy K gradient steps later."""

    name: ClassVar[str] = "policy_lag"
    lag: int = knob(4, "K: gradient steps between the sampler's weights and the trainer's.", ge=0, ui=(0, 32))
    lr: float = knob(0.1, "Learning rate of each step (logits move by about lr per step).", gt=0.0,
                     ui=(0.005, 0.5), log=True)
    vocab: int = knob(64, "V: the policy's vocabulary.", ge=2, ui=(2, 512), log=True)
    contexts: int = knob(256, "C: contexts (states) the policy conditions on; each token's context is random.",
                         ge=1, ui=(1, 4096), log=True)


@dataclass(frozen=True)
class Fp8LogitsConfig(ScenarioConfig):
    """An fp8 sampler: a softmax policy whose logits the sampler rounds to e4m3 (3 mantissa bits), the trainer not."""

    name: ClassVar[str] = "fp8_logits"
    vocab: int = knob(64, "V: the policy's vocabulary.", ge=2, ui=(2, 512), log=True)
    contexts: int = knob(256, "C: contexts (states) the policy conditions on; each token's context is random.",
                         ge=1, ui=(1, 4096), log=True)
    logit_offset: float = knob(16.0, "Each context's largest logit before the sampler rounds (softmax does not see a "
                               "shift; rounding does: e4m3's spacing is 2 from 16 to 32; at 16 the per-token KL is "
                               "about 2e-3).", ge=0.0, ui=(0.0, 32.0))


SCENARIOS: dict[str, type[ScenarioConfig]] = {
    c.name: c for c in (GaussianConfig, DriftConfig, CatastrophicConfig, PrecisionConfig, PolicyLagConfig,
                        Fp8LogitsConfig)
}
# scenarios generated by a real model rather than the four steps above: the config's make(seed=, device=,
# dtype=) builds the batch (tiny_lm: the tiny transformer with a faulty sampler, seqis.samplers.faults; lm_*: the
# recurrent LMs of seqis.samplers.generators, which the diagnosis was not tuned on)
MODEL_SCENARIOS: dict[str, type[Knobs]] = {c.name: c for c in (TinyLMFaultConfig, *GENERATOR_PRESETS)}


def describe(name: str) -> str:
    """One line about a scenario, for a caption."""
    return _scenario_class(name).__doc__.strip().splitlines()[0]


def config(scenario: str | ScenarioConfig, **overrides) -> ScenarioConfig:
    """A scenario's config: its defaults (or the config given) with overrides applied and validated."""
    cfg = _scenario_class(scenario)() if isinstance(scenario, str) else scenario
    if not isinstance(cfg, (ScenarioConfig, *MODEL_SCENARIOS.values())):
        raise ValueError(f"scenario must be a name ({', '.join([*SCENARIOS, *MODEL_SCENARIOS])}) or a "
                         f"ScenarioConfig, got {cfg!r}")
    unknown = sorted(set(overrides) - {f.name for f in knobs(cfg)})
    if unknown:
        raise ValueError(f"{cfg.name} has no knob {', '.join(unknown)}; its knobs: "
                         f"{', '.join(f.name for f in knobs(cfg))}")
    return cfg.replace(**overrides) if overrides else cfg


def _scenario_class(name) -> type[Knobs]:
    known = {**SCENARIOS, **MODEL_SCENARIOS}
    if name not in known:
        raise ValueError(f"unknown scenario {name!r}; known: {', '.join(known)}")
    return known[name]


# ---------------------------------------------------------------------------------------------------------
# the shared steps: lengths, LLM-like log-probs, GRPO advantages


def sample_lengths(cfg: ScenarioConfig, g: torch.Generator) -> torch.Tensor:
    """(B,) int64 rollout lengths."""
    B, lo, hi = cfg.n_rollouts, cfg.min_len, cfg.max_len
    if cfg.lengths == "fixed":
        return torch.full((B,), hi, dtype=torch.int64)
    if cfg.lengths == "uniform":
        return torch.randint(lo, hi + 1, (B,), generator=g)
    z = torch.randn(B, generator=g, dtype=torch.float64)  # (B,)
    frac = torch.exp(math.log(1 / 8) + z).clamp(max=1.0)  # (B,) median 1/8, ~2% hit the cap
    return (lo + (hi - lo) * frac).round().to(torch.int64)


def llm_logprobs(cfg: ScenarioConfig, B: int, T: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T) float64 LLM-like log-probs, and the (B, T) bool mask of branching tokens."""
    branch = torch.rand(B, T, generator=g, dtype=torch.float64) < cfg.branch_frac  # (B, T)
    u = torch.rand(B, T, generator=g, dtype=torch.float64)  # (B, T)
    # |log p| log-uniform in [a, b]: a near-certain token's range, or the branching range
    a = torch.where(branch, -cfg.branch_logp_high, _CERTAIN_LOGP[0]).log()  # (B, T)
    b = torch.where(branch, -cfg.branch_logp_low, _CERTAIN_LOGP[1]).log()  # (B, T)
    return -torch.exp(a + u * (b - a)), branch


def grpo_advantages(cfg: ScenarioConfig, lengths: torch.Tensor, g: torch.Generator):
    """(B,) advantages, (B,) 0/1 rewards and (B,) group ids, from rewards correlated with log-length."""
    B = lengths.numel()
    group_id = torch.arange(B) // cfg.group_size  # (B,)
    log_len = lengths.clamp(min=1).to(torch.float64).log()  # (B,)
    z_len = (log_len - log_len.mean()) / log_len.std(correction=0).clamp(min=1e-12)  # (B,) 0 if all equal
    c = cfg.reward_length_corr
    latent = c * z_len + math.sqrt(1 - c * c) * torch.randn(B, generator=g, dtype=torch.float64)  # (B,)
    threshold = torch.special.ndtri(torch.tensor(1 - cfg.success_rate, dtype=torch.float64))
    reward = (latent > threshold).to(torch.float64)  # (B,)

    n_groups = int(group_id[-1]) + 1
    count = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, group_id, torch.ones(B, dtype=torch.float64))
    mean = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, group_id, reward) / count  # (n_groups,)
    adv = reward - mean[group_id]  # (B,)
    if cfg.norm_std:
        sq = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, group_id, adv * adv)  # (n_groups,)
        std = (sq / (count - 1).clamp(min=1)).sqrt()  # (n_groups,) unbiased, as GRPO's torch.std
        adv = adv / (std[group_id] + 1e-6)
    return adv, reward, group_id


def split_log_ratio(base: torch.Tensor, l: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(trainer, inference) log-probs whose difference is exactly l, both <= base <= 0: the larger of
    the two is the LLM-like base value, the other sits |l| below it."""
    return base + l.clamp(max=0), base - l.clamp(min=0)


# ---------------------------------------------------------------------------------------------------------
# the mismatch scenarios: each returns (trainer, inference) log-probs, (B, T) float64


def _gaussian(cfg: GaussianConfig, base, branch, g):
    l = cfg.s * torch.randn(base.shape, generator=g, dtype=torch.float64) - cfg.s**2 / 2  # (B, T)
    return split_log_ratio(base, l)


def _drift(cfg: DriftConfig, base, branch, g):
    return split_log_ratio(base, torch.full_like(base, math.log(cfg.ratio)))


def _catastrophic(cfg: CatastrophicConfig, base, branch, g):
    shape = base.shape
    l = cfg.s * torch.randn(shape, generator=g, dtype=torch.float64) - cfg.s**2 / 2  # (B, T) background
    # per-token chance of a catastrophe, so that cat_on_branch of them land on branching tokens
    q = min(max(cfg.branch_frac, 1e-12), 1 - 1e-12)
    p_branch = min(1.0, cfg.cat_frac * cfg.cat_on_branch / q)
    p_certain = min(1.0, cfg.cat_frac * (1 - cfg.cat_on_branch) / (1 - q))
    p = torch.where(branch, p_branch, p_certain)  # (B, T)
    cat = torch.rand(shape, generator=g, dtype=torch.float64) < p  # (B, T)
    z = torch.randn(shape, generator=g, dtype=torch.float64).clamp(-2.0, 2.0)  # (B, T)
    size = cfg.cat_size * torch.exp(0.5 * z)  # (B, T) within x/÷ e (1.6 typical)
    sign = torch.where(torch.rand(shape, generator=g, dtype=torch.float64) < cfg.cat_positive, 1.0, -1.0)
    return split_log_ratio(base, torch.where(cat, sign * size, l))


def _precision(cfg: PrecisionConfig, base, branch, g):
    sigma = PRECISION_EPS[cfg.preset] * cfg.noise_scale * (-torch.expm1(base))  # (B, T) eps (1 - p_t)
    l = sigma * torch.randn(base.shape, generator=g, dtype=torch.float64) - sigma**2 / 2  # (B, T)
    return split_log_ratio(base, l)


def context_logits(cfg, g: torch.Generator) -> torch.Tensor:
    """(C, V) logits of a small softmax policy over cfg.vocab tokens in cfg.contexts contexts, LLM-like.

    A fraction branch_frac of the contexts are branching (logits uniform in [branch_logp_low, 0]); the rest
    are near-certain (one token, the others sharing 1e-3..1e-2 of the mass), in a random order per context.
    """
    C, V = cfg.contexts, cfg.vocab
    branchy = torch.rand(C, 1, generator=g, dtype=torch.float64) < cfg.branch_frac  # (C, 1)
    flat = cfg.branch_logp_low * torch.rand(C, V, generator=g, dtype=torch.float64)  # (C, V)
    eps = math.log(_CERTAIN_LOGP[0]) + math.log(10) * torch.rand(C, 1, generator=g, dtype=torch.float64)
    peaked = eps - math.log(V - 1) + 0.5 * torch.randn(C, V, generator=g, dtype=torch.float64)  # (C, V)
    peaked[:, 0] = 0.0  # token 0 is the near-certain one; a shuffle below hides it
    logits = torch.where(branchy, flat, peaked)  # (C, V)
    perm = torch.rand(C, V, generator=g).argsort(-1)  # (C, V) a random order per context
    return logits.gather(-1, perm)


def lagged_policies(cfg: PolicyLagConfig, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(C, V) log-softmax of the sampler's policy (step 0, `context_logits`) and the trainer's (K steps later).
    Each step is a gradient ascent step on sum_c log pi(y*_c | c) for a fixed random target y*_c:
    logits += lr (onehot(y*) - pi)."""
    logits = context_logits(cfg, g)  # (C, V)
    C, V = logits.shape
    target = torch.randint(V, (C,), generator=g)  # (C,)
    onehot = torch.nn.functional.one_hot(target, V).to(torch.float64)  # (C, V)
    theta = logits.clone()
    for _ in range(cfg.lag):  # K steps over a (C, V) table; no loop over rollouts or tokens
        theta = theta + cfg.lr * (onehot - theta.softmax(-1))
    return logits.log_softmax(-1), theta.log_softmax(-1)


def _from_tables(log_mu: torch.Tensor, log_pi: torch.Tensor, shape, g: torch.Generator):
    """Tokens drawn from the sampler's (C, V) table in random contexts: (trainer, inference) (B, T) log-probs and
    the tables with each token's context (the exact head's source)."""
    B, T = shape
    C, V = log_mu.shape
    context = torch.randint(C, (B, T), generator=g)  # (B, T)
    # sample y ~ mu(. | context) for every token at once: one search in the contexts' stacked CDFs,
    # context c's CDF shifted up by c, so the query c + u lands in context c's slot
    cdf = log_mu.exp().cumsum(-1)  # (C, V)
    cdf = cdf / cdf[:, -1:]  # exact 1 at the end of each row
    stacked = (cdf + torch.arange(C, dtype=torch.float64)[:, None]).flatten()  # (C V,)
    u = torch.rand(B, T, generator=g, dtype=torch.float64)  # (B, T)
    idx = torch.searchsorted(stacked, (context + u).flatten()).clamp(max=C * V - 1)  # (B T,)
    return log_pi.flatten()[idx].view(B, T), log_mu.flatten()[idx].view(B, T), (log_mu, log_pi, context)


def _policy_lag(cfg: PolicyLagConfig, base, branch, g):
    log_mu, log_pi = lagged_policies(cfg, g)  # (C, V) each
    return _from_tables(log_mu, log_pi, base.shape, g)


def e4m3(x: torch.Tensor) -> torch.Tensor:
    """x rounded to fp8 e4m3 (3 mantissa bits, saturating at +-448), back in x's dtype."""
    return x.float().to(torch.float8_e4m3fn).to(x.dtype)


def _fp8_logits(cfg: Fp8LogitsConfig, base, branch, g):
    logits = context_logits(cfg, g)  # (C, V)
    z = logits - logits.amax(-1, keepdim=True) + cfg.logit_offset  # the largest logit at logit_offset
    return _from_tables(e4m3(z).log_softmax(-1), z.log_softmax(-1), base.shape, g)


_MISMATCH = {"gaussian": _gaussian, "drift": _drift, "catastrophic": _catastrophic,
             "precision": _precision, "policy_lag": _policy_lag, "fp8_logits": _fp8_logits}
# a synthetic head's per-slot log-ratio std (seqis.samplers.heads.synthetic_head), from the other slots' sampler
# probabilities q: each scenario's own mismatch at that probability (drift's ratio is the sampled token's alone)
_HEAD_SIGMA = {"gaussian": lambda cfg: lambda q: cfg.s, "drift": lambda cfg: lambda q: 0.0,
               "catastrophic": lambda cfg: lambda q: cfg.s,
               "precision": lambda cfg: lambda q: PRECISION_EPS[cfg.preset] * cfg.noise_scale * (1 - q)}


def _head(cfg: ScenarioConfig, trainer, inference, tables, mask, seed: int):
    """The batch's head: exact from the sampler's table where the scenario has one, else synthetic (drawn on the
    loss tokens only, -1 / 0 elsewhere); None at K = 0."""
    if not cfg.head_k:
        return None
    if tables is None:
        parts = synthetic_head(trainer[mask][None], inference[mask][None], _HEAD_SIGMA[cfg.name](cfg), cfg.head_k,
                               head_generator(seed))  # (1, N, K) each
        return tuple(x.new_full((*mask.shape, cfg.head_k), -1 if i == 0 else 0).index_put_((mask,), x[0])
                     for i, x in enumerate(parts))
    log_mu, log_pi, context = tables
    ids, logq, logp = top_k_head(log_mu, log_pi, cfg.head_k)  # (C, K) each
    return ids[context], logq[context], logp[context]


# ---------------------------------------------------------------------------------------------------------
# the batch


def make_batch(
    scenario: str | ScenarioConfig,
    *,
    seed: int = 0,
    device=None,
    dtype: torch.dtype = torch.float32,
    **overrides,
) -> Batch:
    """A synthetic batch: `scenario` is a name in SCENARIOS (its defaults, with `overrides` applied) or a
    config. Drawn on the CPU from torch.Generator(seed), then moved to `device`: the same seed gives the
    same batch everywhere. Metadata: group_id, reward, length (the rollout's loss-token count)."""
    cfg = config(scenario, **overrides)
    if isinstance(cfg, tuple(MODEL_SCENARIOS.values())):  # a scenario that builds its own batch
        return cfg.make(seed=seed, device=device, dtype=dtype)
    g = torch.Generator(device="cpu").manual_seed(int(seed))

    lengths = sample_lengths(cfg, g)  # (B,)
    B, T = cfg.n_rollouts, int(lengths.max())
    mask = torch.arange(T)[None, :] < lengths[:, None]  # (B, T) loss tokens
    base, branch = llm_logprobs(cfg, B, T, g)  # (B, T)
    advantages, reward, group_id = grpo_advantages(cfg, lengths, g)  # (B,) each
    trainer, inference, *tables = _MISMATCH[cfg.name](cfg, base, branch, g)  # (B, T) each, the sampler's table
    head = _head(cfg, trainer, inference, tables[0] if tables else None, mask, seed)

    zero = torch.zeros((), dtype=torch.float64)
    return Batch(
        trainer_logprobs=torch.where(mask, trainer, zero).to(device=device, dtype=dtype),  # (B, T)
        inference_logprobs=torch.where(mask, inference, zero).to(device=device, dtype=dtype),  # (B, T)
        advantages=advantages.to(device=device, dtype=dtype),  # (B,)
        loss_mask=mask.to(device),  # (B, T)
        metadata={"group_id": group_id.tolist(), "reward": reward.tolist(), "length": lengths.tolist()},
        **head_fields(head, mask, device, dtype),
    )
