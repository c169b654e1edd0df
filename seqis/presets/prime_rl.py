"""prime-rl's RL losses as they shipped: today's default (IPO), every earlier default, IcePop, the seed's four.

    ipo        pd_t = exp(trainer_t) - exp(inference_t) (probabilities); drop token t if |pd_t| > eps; weight
               rho_t on kept tokens (not detached, untruncated: its gradient is rho_t A); plus kl_tau * l_t^2 on
               every loss token; sum / N, N = every loss token. The default since 2026-09-18: eps 0.3, kl_tau 0.
    icepop     keep token t iff ratio_low <= rho_t <= ratio_high (tested in log space, inclusive); weight rho_t;
               no KL term (opt-in since 2026-09-10, 0.2 and 5.0)
    dppo       the April-August 2026 default: drop token t if A > 0 and pd_t > dppo_mask_high, or A <= 0 and
               pd_t < -dppo_mask_low (torch.where on A > 0: A = 0 takes the low test); weight rho_t; plus
               kl_tau * l_t^2 (0.2, 0.2, 1e-3)
    ipo (old)  March 2026's default (v0.5.0): drop token t if pd_t > ipo_mask_high or pd_t < -ipo_mask_low,
               whatever A's sign (0.2, 0.2), plus 1e-3 * l^2; August 2026's (#3418): |pd_t| > 0.1, plus 1e-3 * l^2
    masked IS  the December 2025 - March 2026 default (v0.2 - v0.4): weight rho_t, dropping tokens with rho_t
               outside [0.125, 8], rollouts with exp(S/T) outside [0.1, 10] and rollouts with any rho_t > 100

Penalty gradient: d loss / d trainer_logprobs = -weights * adv_tau * A / N + 2 kl_tau l_t / N on loss tokens.
Edge arithmetic: prime-rl compares exp(trainer) - exp(inference); the composition's prob_diff is computed the same
way (torch.exp of each log-prob, in float32 or float64), so a token exactly on a band edge falls the same side.
Docs vs code: docs/algorithms.md wrote the DPPO term as min(rho, delta) * A; the code never truncated.
Source: PrimeIntellect-ai/prime-rl, src/prime_rl/trainer/rl/loss.py; defaults in
packages/prime-rl-configs/src/prime_rl/configs/trainer.py. Read at 559b447 (2026-08-21); #3418 (IPO the default,
ipo_threshold renamed eps), #3526 (IcePop) and #3586 (eps 0.3, kl_tau 0) from their merged pull requests.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.compose import Composition, Criterion, Penalty, Weight
from ..core.spec import Preset
from ..core.types import Config, knob
from ..estimators import ESTIMATORS, SEED_ESTIMATORS
from ._preset import framework_estimator

_KL = "Weight of the kl_tau * l^2 term on every loss token."


@dataclass(frozen=True)
class IPOLossConfig(Config):
    """[trainer.loss] type = "ipo" (the default since #3418); prime-rl's names and #3586's defaults."""

    eps: float = knob(0.3, "Drop a token whose probability moved by more than this either way.", ge=0.0,
                      ui=(0.01, 1.0))
    kl_tau: float = knob(0.0, _KL, ge=0.0, ui=(0.0, 0.1))


@dataclass(frozen=True)
class IcePopLossConfig(Config):
    """[trainer.loss] type = "icepop" (#3526); prime-rl's names."""

    ratio_low: float = knob(0.2, "Drop a token whose ratio pi/mu is below this.", gt=0.0, ui=(0.01, 1.0))
    ratio_high: float = knob(5.0, "Drop a token whose ratio pi/mu is above this.", gt=0.0, ui=(1.0, 20.0), log=True)

    def __post_init__(self):
        super().__post_init__()
        if not self.ratio_low < self.ratio_high:
            raise ValueError(f"ratio_low must be below ratio_high, got {self.ratio_low} >= {self.ratio_high}")


@dataclass(frozen=True)
class DefaultLossConfig(Config):
    """[trainer.loss] type = "default" of April-August 2026 (removed by #3418); prime-rl's names."""

    dppo_mask_low: float = knob(0.2, "Drop a token with A <= 0 whose probability fell by more than this.", ge=0.0,
                                ui=(0.01, 1.0), band=False)
    dppo_mask_high: float = knob(0.2, "Drop a token with A > 0 whose probability rose by more than this.", ge=0.0,
                                 ui=(0.01, 1.0))
    kl_tau: float = knob(1e-3, _KL, ge=0.0, ui=(0.0, 0.1))


@dataclass(frozen=True)
class MarchIPOConfig(Config):
    """[loss] of v0.5.0 (#1930, March 2026): the IPO band with its two sides apart; prime-rl's names."""

    ipo_mask_low: float = knob(0.2, "Drop a token whose probability fell by more than this.", ge=0.0,
                               ui=(0.01, 1.0), band=False)
    ipo_mask_high: float = knob(0.2, "Drop a token whose probability rose by more than this.", ge=0.0, ui=(0.01, 1.0))
    kl_tau: float = knob(1e-3, _KL, ge=0.0, ui=(0.0, 0.1))


@dataclass(frozen=True)
class MaskedISConfig(Config):
    """[loss] of v0.2 - v0.4 (#1404, December 2025), ratio_type token; prime-rl's names (its kl_tau, default 0 and
    folded into the weight as rho * (A - kl_tau * l), is not a knob here)."""

    token_mask_low: float = knob(0.125, "Drop a token whose ratio is below this.", gt=0.0, ui=(0.01, 1.0))
    token_mask_high: float = knob(8.0, "Drop a token whose ratio is above this.", gt=0.0, ui=(1.0, 100.0), log=True)
    geo_mask_low: float = knob(0.1, "Drop a rollout whose geometric ratio is below this.", gt=0.0, ui=(0.01, 1.0))
    geo_mask_high: float = knob(10.0, "Drop a rollout whose geometric ratio is above this.", gt=0.0,
                                ui=(1.0, 100.0), log=True)
    sequence_mask_high: float = knob(100.0, "Drop a rollout with any token ratio above this.", gt=0.0,
                                     ui=(1.0, 1e4), log=True)


def _kl(kl_tau: float) -> Penalty | None:
    return Penalty(kl_tau, "squared_log_ratio") if kl_tau > 0 else None


def _prob_band(low: float, high: float) -> Criterion:
    return Criterion("prob_diff", "token", low=-low, high=high)


def compose_ipo(cfg: IPOLossConfig) -> Composition:
    return Composition(Weight("token"), (_prob_band(cfg.eps, cfg.eps),), penalty=_kl(cfg.kl_tau), adv_tau=cfg.adv_tau)


def compose_icepop(cfg: IcePopLossConfig) -> Composition:
    band = Criterion("ratio", "token", low=cfg.ratio_low, high=cfg.ratio_high)
    return Composition(Weight("token"), (band,), adv_tau=cfg.adv_tau)


def compose_dppo(cfg: DefaultLossConfig) -> Composition:
    criteria = (Criterion("prob_diff", "token", high=cfg.dppo_mask_high, advantage="positive"),
                Criterion("prob_diff", "token", low=-cfg.dppo_mask_low, advantage="non-positive"))
    return Composition(Weight("token"), criteria, penalty=_kl(cfg.kl_tau), adv_tau=cfg.adv_tau)


def compose_march_ipo(cfg: MarchIPOConfig) -> Composition:
    band = (_prob_band(cfg.ipo_mask_low, cfg.ipo_mask_high),)
    return Composition(Weight("token"), band, penalty=_kl(cfg.kl_tau), adv_tau=cfg.adv_tau)


def compose_masked_is(cfg: MaskedISConfig) -> Composition:
    criteria = (Criterion("ratio", "token", low=cfg.token_mask_low, high=cfg.token_mask_high),
                Criterion("ratio", "mean", low=cfg.geo_mask_low, high=cfg.geo_mask_high),
                Criterion("ratio", "max", high=cfg.sequence_mask_high))
    return Composition(Weight("token"), criteria, adv_tau=cfg.adv_tau)


REPO = "PrimeIntellect-ai/prime-rl"
LOSS = "src/prime_rl/trainer/rl/loss.py"
AT = f"{REPO}@559b447: {LOSS}"  # the commit read (2026-08-21)
SEED_SOURCE = "seqis@seed: seqis/estimators/{}.py (the seed: prime-rl's sequence-level IS ablations)"
_IPO = framework_estimator("prime-rl/ipo", compose_ipo, IPOLossConfig, "prime-rl's IPO loss.")
_ICEPOP = framework_estimator("prime-rl/icepop", compose_icepop, IcePopLossConfig, "prime-rl's IcePop loss.")
_DPPO = framework_estimator("prime-rl/dppo", compose_dppo, DefaultLossConfig, "prime-rl's DPPO + KL loss.")
_MARCH = framework_estimator("prime-rl/ipo_2026_03", compose_march_ipo, MarchIPOConfig, "prime-rl v0.5's IPO.")
_MASKED = framework_estimator("prime-rl/masked_is_2025_12", compose_masked_is, MaskedISConfig,
                              "prime-rl v0.2 - v0.4's masked IS.")
_TODAY = "since 2026-09-18 (prime-rl #3586: eps 0.3, kl_tau 0; IPO the default since #3418, 2026-08-27)"
_IPO_SUMMARY = ("rho_t, dropping tokens whose probability moved more than 0.3 either way (abs(exp(trainer) - "
                "exp(inference)) > 0.3), no KL term")

PRESETS = [
    Preset("prime-rl/default", f"IPO (the default: no [trainer.loss]): {_IPO_SUMMARY}.",
           f"{AT} (ipo_loss_fn); defaults per #3586, merged after the commit read", _IPO, IPOLossConfig(),
           versions=_TODAY),
    Preset("prime-rl/ipo", f"[trainer.loss] type = \"ipo\" at its defaults: {_IPO_SUMMARY}.",
           f"{AT} (ipo_loss_fn); defaults per #3586, merged after the commit read", _IPO, IPOLossConfig(),
           versions=_TODAY),
    Preset("prime-rl/icepop", "IcePop: rho_t on tokens with 0.2 <= rho_t <= 5 (inclusive, tested in log space), "
           "others dropped; no KL term.", f"{REPO}#3526: {LOSS} (IcePopLoss), merged after the commit read (559b447)",
           _ICEPOP, IcePopLossConfig(), versions="since 2026-09-10 (prime-rl #3526), opt-in"),
    Preset("prime-rl/dppo", "DPPO + KL (the default April-August 2026): rho_t, dropping tokens whose probability "
           "rose > 0.2 (A > 0) or fell > 0.2 (A <= 0), plus 1e-3 * l^2; the docs wrote min(rho, delta), the code "
           "never truncates.", f"{AT} (default_loss_fn)", _DPPO, DefaultLossConfig(),
           versions="2026-04-06 .. 2026-08-27 (prime-rl #2187 .. #3418; releases v0.6.0 - v0.8.0), except a few "
           "hours of 2026-08-11 at 0.1 (#3236, reverted by #3244)"),
    Preset("prime-rl/ipo_2026_08", "IPO at its first defaults (the default of late August 2026): rho_t, dropping "
           "tokens whose probability moved more than 0.1 either way, plus 1e-3 * l^2.",
           f"{AT} (ipo_loss_fn, IPOLossConfig: ipo_threshold 0.1, kl_tau 1e-3)", _IPO, IPOLossConfig(eps=0.1,
                                                                                                   kl_tau=1e-3),
           versions="the default 2026-08-27 .. 2026-09-18 (prime-rl #3418 .. #3586); opt-in as ipo_threshold "
           "since 2026-06-14 (#2798)"),
    Preset("prime-rl/ipo_2026_03", "IPO as v0.5.0 shipped it: rho_t, dropping tokens whose probability rose or "
           "fell by more than 0.2 whatever the advantage's sign, plus 1e-3 * l^2.",
           f"{REPO}@02bdca2: {LOSS} (default_loss_fn)", _MARCH, MarchIPOConfig(),
           versions="the default 2026-03-03 .. 2026-04-06 (prime-rl #1930 .. #2187; release v0.5.0)"),
    Preset("prime-rl/masked_is_2025_12", "Masked IS as v0.2 - v0.4 shipped it: rho_t, dropping tokens with rho_t "
           "outside [0.125, 8], rollouts with exp(S/T) outside [0.1, 10] and rollouts with any rho_t > 100.",
           f"{REPO}@v0.4.0: {LOSS} (default_loss_fn)", _MASKED, MaskedISConfig(), exporter="prime-rl-legacy",
           versions="the default 2025-12-19 .. 2026-03-03 (prime-rl #1404 .. #1930; releases v0.2 - v0.4.0)"),
    *(Preset(f"prime-rl/{name}", ESTIMATORS[name].summary, SEED_SOURCE.format(name), ESTIMATORS[name],
             ESTIMATORS[name].config(), exporter="prime-rl-legacy",
             versions="the seed's ablations (seqis's own), in prime-rl's pre-March-2026 [loss] table")
      for name in SEED_ESTIMATORS),
]
