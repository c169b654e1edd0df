"""A composition as prime-rl's `[trainer.loss]`: type "default" (DPPO + KL) or "ipo".

Both weigh every kept token by rho_t (untruncated), drop tokens by the probability difference pi_t - mu_t
(default: above dppo_mask_high when A > 0, below -dppo_mask_low when A <= 0; ipo: outside +-ipo_threshold) and
add kl_tau * l_t^2 on every loss token. Anything else needs prime-rl's `type = "custom"` loss (your own function).
"""

from __future__ import annotations

import math

from ..compose import Composition
from ._format import CannotExpress, Settings, toml

HEADER = ["prime-rl trainer loss (the [trainer.loss] table of rl.toml)"]
SUFFIX = "prime-rl.toml"
_CUSTOM = ('prime-rl\'s built-in losses weigh kept tokens by rho_t and drop them by probability difference; '
           'load this correction as [trainer.loss] type = "custom"')


def _kl_tau(comp: Composition) -> float:
    if comp.penalty is None:
        return 0.0
    if comp.penalty.statistic != "squared_log_ratio":
        raise CannotExpress(f"prime-rl's KL term is kl_tau * l^2, not {comp.penalty.statistic}")
    return comp.penalty.coef


def settings(comp: Composition) -> Settings:
    if not comp.weight.plain("token") or comp.log_ratio_clamp is not None:
        raise CannotExpress(f"{_CUSTOM} (this weight: {comp.weight.level}, clipped, banded or clamped)")
    kl_tau = _kl_tau(comp)
    crit = comp.criteria
    if any(c.statistic != "prob_diff" or c.agg != "token" for c in crit):
        raise CannotExpress(f"{_CUSTOM} (it has criteria on other statistics than the probability difference)")
    up = [c for c in crit if c.advantage == "positive" and c.low is None]
    down = [c for c in crit if c.advantage == "non-positive" and c.high is None]
    both = [c for c in crit if c.advantage is None]
    if len(up) + len(down) == len(crit) and len(up) <= 1 and len(down) <= 1:
        high = up[0].high if up else math.inf
        low = -down[0].low if down else math.inf
        return Settings(dict(type="default", dppo_mask_low=low, dppo_mask_high=high, adv_tau=comp.adv_tau,
                             kl_tau=kl_tau))
    if len(both) == 1 == len(crit) and both[0].low is not None and both[0].high is not None \
            and math.isclose(-both[0].low, both[0].high):
        return Settings(dict(type="ipo", ipo_threshold=both[0].high, adv_tau=comp.adv_tau, kl_tau=kl_tau))
    raise CannotExpress(f"{_CUSTOM} (its probability-difference criteria are neither DPPO's sign-conditioned pair "
                        "nor IPO's symmetric band)")


def write(s: Settings) -> list[str]:
    return toml("trainer.loss", s.keys)
