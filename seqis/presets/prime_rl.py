"""prime-rl's RL losses: the current default (DPPO + KL), IPO, and the seed's four sequence-level IS ablations.

    default   pd_t = pi_t - mu_t (probabilities); drop token t if A > 0 and pd_t > dppo_mask_high, or A <= 0 and
              pd_t < -dppo_mask_low (torch.where on A > 0: A = 0 takes the low test); weight rho_t on kept tokens
              (the ratio is not detached: its gradient is rho_t A, untruncated); plus kl_tau * l_t^2 on every loss
              token; sum / N, N = every loss token
    ipo       drop token t if |pd_t| > ipo_threshold; weight rho_t on kept tokens; plus kl_tau * l_t^2

Penalty gradient: d loss / d trainer_logprobs = -weights * adv_tau * A / N + 2 kl_tau l_t / N on loss tokens.
Docs vs code: docs/algorithms.md writes the policy-gradient term as min(rho, delta) * A (a truncation); the code
masks by probability difference conditioned on the advantage's sign and never truncates.
Source: PrimeIntellect-ai/prime-rl, src/prime_rl/trainer/rl/loss.py (default_loss_fn, ipo_loss_fn); defaults in
packages/prime-rl-configs/src/prime_rl/configs/trainer.py (DefaultLossConfig, IPOLossConfig).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..compose import Composition, Criterion, Penalty, Weight
from ..estimators import ESTIMATORS
from ..spec import Preset
from ..types import Config, knob
from ._preset import framework_estimator


@dataclass(frozen=True)
class DefaultLossConfig(Config):
    """[trainer.loss] type = "default"; prime-rl's names."""

    dppo_mask_low: float = knob(0.2, "Drop a token with A <= 0 whose probability fell by more than this.", ge=0.0,
                                ui=(0.01, 1.0), band=False)
    dppo_mask_high: float = knob(0.2, "Drop a token with A > 0 whose probability rose by more than this.", ge=0.0,
                                 ui=(0.01, 1.0))
    kl_tau: float = knob(1e-3, "Weight of the kl_tau * l^2 term on every loss token.", ge=0.0, ui=(0.0, 0.1))


@dataclass(frozen=True)
class IPOLossConfig(Config):
    """[trainer.loss] type = "ipo"; prime-rl's names."""

    ipo_threshold: float = knob(0.1, "Drop a token whose probability moved by more than this either way.",
                                ge=0.0, ui=(0.01, 1.0))
    kl_tau: float = knob(1e-3, "Weight of the kl_tau * l^2 term on every loss token.", ge=0.0, ui=(0.0, 0.1))


def _kl(kl_tau: float) -> Penalty | None:
    return Penalty(kl_tau, "squared_log_ratio") if kl_tau > 0 else None


def compose_default(cfg: DefaultLossConfig) -> Composition:
    criteria = (Criterion("prob_diff", "token", high=cfg.dppo_mask_high, advantage="positive"),
                Criterion("prob_diff", "token", low=-cfg.dppo_mask_low, advantage="non-positive"))
    return Composition(Weight("token"), criteria, penalty=_kl(cfg.kl_tau), adv_tau=cfg.adv_tau)


def compose_ipo(cfg: IPOLossConfig) -> Composition:
    criteria = (Criterion("prob_diff", "token", low=-cfg.ipo_threshold, high=cfg.ipo_threshold),)
    return Composition(Weight("token"), criteria, penalty=_kl(cfg.kl_tau), adv_tau=cfg.adv_tau)


SOURCE = "PrimeIntellect-ai/prime-rl: src/prime_rl/trainer/rl/loss.py"
SEED_SOURCE = "PrimeIntellect-ai/prime-rl (the seed, its sequence-level IS ablations): seqis/estimators/{}.py"
_DPPO = framework_estimator("prime-rl/default", compose_default, DefaultLossConfig, "prime-rl's DPPO + KL loss.")
_IPO = framework_estimator("prime-rl/ipo", compose_ipo, IPOLossConfig, "prime-rl's IPO loss.")

PRESETS = [
    Preset("prime-rl/default", "DPPO + KL (current default): rho_t, dropping tokens whose probability rose > 0.2 "
           "(A > 0) or fell > 0.2 (A <= 0), plus 1e-3 * l^2; the docs write min(rho, delta), the code never "
           "truncates.", f"{SOURCE} (default_loss_fn)", _DPPO, DefaultLossConfig()),
    Preset("prime-rl/ipo", "IPO: rho_t, dropping tokens whose probability moved more than 0.1 either way, plus "
           "1e-3 * l^2.", f"{SOURCE} (ipo_loss_fn)", _IPO, IPOLossConfig()),
    *(Preset(f"prime-rl/{name}", ESTIMATORS[name].summary, SEED_SOURCE.format(name), ESTIMATORS[name],
             ESTIMATORS[name].config(), exporter="prime-rl-legacy") for name in ("seq_tis", "seq_mis", "geo_mask",
                                                                                  "mis_po")),
]
