"""A composition as prime-rl's `[trainer.loss]`: type "ipo" (the default since #3418) or "icepop" (#3526); the
sign-conditioned DPPO pair as the removed type "default" of v0.6.0 - v0.8.0, with a comment saying so.

All weigh every kept token by rho_t (untruncated). ipo drops tokens whose probability difference pi_t - mu_t
leaves +-eps and adds kl_tau * l_t^2 on every loss token; icepop drops tokens whose ratio leaves
[ratio_low, ratio_high] and has no KL term; default dropped above dppo_mask_high when A > 0, below -dppo_mask_low
when A <= 0. Anything else needs prime-rl's `type = "custom"` loss (your own function).
"""

from __future__ import annotations

import math

from ..core.compose import Composition
from ._format import CannotExpress, Settings, toml

HEADER = ["prime-rl trainer loss (the [trainer.loss] table of rl.toml)"]
SUFFIX = "prime-rl.toml"
EDGE_SPACE = "log"  # IcePop keeps log(low) <= l_t <= log(high) (docs/presets.md, prime-rl)
_CUSTOM = ('prime-rl\'s built-in losses weigh kept tokens by rho_t and drop them by probability difference or '
           'ratio band; load this correction as [trainer.loss] type = "custom"')
_REMOVED = "# type = \"default\" (DPPO + KL) is prime-rl v0.6.0 - v0.8.0's; #3418 (2026-08-27) removed it"


def _kl_tau(comp: Composition) -> float:
    if comp.penalty is None:
        return 0.0
    if comp.penalty.statistic != "squared_log_ratio":
        raise CannotExpress(f"prime-rl's KL term is kl_tau * l^2, not {comp.penalty.statistic}")
    return comp.penalty.coef


def _icepop(comp: Composition) -> Settings | None:
    crit = comp.criteria
    if comp.penalty is not None or len(crit) != 1:
        return None
    c = crit[0]
    if (c.statistic, c.agg, c.advantage) != ("ratio", "token", None) or c.low is None or c.high is None:
        return None
    return Settings(dict(type="icepop", ratio_low=c.low, ratio_high=c.high, adv_tau=comp.adv_tau))


def settings(comp: Composition) -> Settings:
    if not comp.weight.plain("token") or comp.log_ratio_clamp is not None:
        raise CannotExpress(f"{_CUSTOM} (this weight: {comp.weight.level}, clipped, banded or clamped)")
    if (s := _icepop(comp)) is not None:
        return s
    kl_tau = _kl_tau(comp)
    crit = comp.criteria
    if any(c.statistic != "prob_diff" or c.agg != "token" for c in crit):
        raise CannotExpress(f"{_CUSTOM} (it has criteria on other statistics than the probability difference)")
    up = [c for c in crit if c.advantage == "positive" and c.low is None]
    down = [c for c in crit if c.advantage == "non-positive" and c.high is None]
    both = [c for c in crit if c.advantage is None]
    if crit and len(up) + len(down) == len(crit) and len(up) <= 1 and len(down) <= 1:
        high = up[0].high if up else math.inf
        low = -down[0].low if down else math.inf
        return Settings(dict(type="default", dppo_mask_low=low, dppo_mask_high=high, adv_tau=comp.adv_tau,
                             kl_tau=kl_tau))
    if len(both) == 1 == len(crit) and both[0].low is not None and both[0].high is not None \
            and math.isclose(-both[0].low, both[0].high):
        return Settings(dict(type="ipo", eps=both[0].high, adv_tau=comp.adv_tau, kl_tau=kl_tau))
    raise CannotExpress(f"{_CUSTOM} (its probability-difference criteria are neither IPO's symmetric band nor the "
                        "sign-conditioned DPPO pair of v0.6.0 - v0.8.0)")


def write(s: Settings) -> list[str]:
    return ([_REMOVED] if s.keys["type"] == "default" else []) + toml("trainer.loss", s.keys)
