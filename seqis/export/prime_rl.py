"""A composition as prime-rl's `[trainer.loss]`: type "ipo" (the default), "ppo", "cispo" or "icepop" as they ship
now; an uncapped IPO with its kl_tau as the ipo of #3418 .. the ratio cap, and the sign-conditioned DPPO pair as the
removed type "default" of v0.6.0 - v0.8.0, each with a comment saying so.

ipo drops tokens whose probability difference pi_t - mu_t leaves +-eps and weighs kept tokens by min(rho_t,
max_importance_ratio); ppo is the clipped surrogate against the sampler, -min(r A, clip(r, ratio_low, ratio_high) A)
with r = min(rho_t, max_importance_ratio); cispo weighs every token by clamp(rho_t, ratio_low, ratio_high); icepop
drops tokens whose ratio leaves [ratio_low, ratio_high], weighing the others by rho_t. Before the cap, ipo weighed
kept tokens by rho_t and added kl_tau * l_t^2 on every loss token; default dropped above dppo_mask_high when A > 0,
below -dppo_mask_low when A <= 0. Anything else needs prime-rl's `type = "custom"` loss (your own function).
"""

from __future__ import annotations

import math

from ..core.compose import Composition
from ..presets.prime_rl import (
    CISPOLossConfig,
    DefaultLossConfig,
    IcePopLossConfig,
    IPOLossConfig,
    KLIPOLossConfig,
    MarchIPOConfig,
    PPOLossConfig,
)
from ._format import CannotExpress, Settings, toml, toml_tables
from ._own import own_settings

HEADER = ["prime-rl trainer loss (the [trainer.loss] table of rl.toml)"]
SUFFIX = "prime-rl.toml"
EDGE_SPACE = "log"  # IcePop keeps log(low) <= l_t <= log(high) (docs/presets.md, prime-rl)
_CUSTOM = ('prime-rl\'s built-in losses weigh kept tokens by rho_t (ipo: capped; cispo: clamped) and drop them by '
           'probability difference, ratio band or PPO\'s clip; load this correction as [trainer.loss] type = "custom"')
_REMOVED = "# type = \"default\" (DPPO + KL) is prime-rl v0.6.0 - v0.8.0's; #3418 (2026-08-27) removed it"
_BEFORE_CAP = ("# kl_tau and an uncapped ratio: prime-rl's ipo from #3418 (2026-08-27) until max_importance_ratio; "
               "today's ipo has no kl_tau and caps the ratio at max_importance_ratio (1e4)")


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


def _eps(comp: Composition) -> float | None:
    """IPO's eps: one symmetric probability-difference band on every token, else None."""
    crit = comp.criteria
    if len(crit) != 1:
        return None
    c = crit[0]
    if (c.statistic, c.agg, c.advantage) != ("prob_diff", "token", None) or c.low is None or c.high is None:
        return None
    return c.high if math.isclose(-c.low, c.high) else None


def _ppo(comp: Composition) -> tuple[float, float] | None:
    """(ratio_low, ratio_high) of PPO's clip against the sampler (A > 0 keeps r <= high, A < 0 keeps r >= low)."""
    up = [c for c in comp.criteria if c.advantage == "positive" and c.low is None]
    down = [c for c in comp.criteria if c.advantage == "negative" and c.high is None]
    if len(comp.criteria) != 2 or len(up) != 1 or len(down) != 1:
        return None
    if any((c.statistic, c.agg, c.strict, c.leaves_normaliser) != ("ratio", "token", False, False)
           for c in comp.criteria):
        return None
    return down[0].low, up[0].high


def _capped(comp: Composition) -> Settings:
    """A token weight clamped to [low, high]: cispo without criteria, ipo or ppo with max_importance_ratio."""
    w = comp.weight
    lo, hi = w.clip_low, w.upper
    if comp.penalty is not None:
        raise CannotExpress(f"{_CUSTOM} (today's ipo, ppo and cispo have no KL term)")
    if not comp.criteria:
        if not (lo <= 1.0 <= hi < math.inf):
            raise CannotExpress(f"{_CUSTOM} (cispo clamps the ratio to [ratio_low <= 1, 1 <= ratio_high < inf], "
                                f"not [{lo}, {hi}])")
        return Settings(dict(type="cispo", ratio_low=lo, ratio_high=hi, adv_tau=comp.adv_tau))
    if lo != 0.0 or not 1.0 <= hi < math.inf:
        raise CannotExpress(f"{_CUSTOM} (its ratio cap max_importance_ratio is finite, at least 1, with no lower "
                            "clamp)")
    if (eps := _eps(comp)) is not None:
        return Settings(dict(type="ipo", eps=eps, max_importance_ratio=hi, adv_tau=comp.adv_tau))
    if (band := _ppo(comp)) is not None and band[0] <= 1.0 <= band[1] < hi:
        return Settings(dict(type="ppo", ratio_low=band[0], ratio_high=band[1], max_importance_ratio=hi,
                             adv_tau=comp.adv_tau))
    raise CannotExpress(f"{_CUSTOM} (a capped ratio goes with IPO's symmetric probability band or PPO's clip "
                        "[ratio_low <= 1 <= ratio_high < max_importance_ratio])")


def settings(comp: Composition) -> Settings:
    w = comp.weight
    if w.level != "token" or w.band is not None or w.self_normalize or comp.log_ratio_clamp is not None:
        raise CannotExpress(f"{_CUSTOM} (this weight: {w.level}, banded, self-normalised or clamped)")
    if w.truncated:
        return _capped(comp)
    if (s := _icepop(comp)) is not None:
        return s
    kl_tau = _kl_tau(comp)
    crit = comp.criteria
    if any(c.statistic != "prob_diff" or c.agg != "token" for c in crit):
        raise CannotExpress(f"{_CUSTOM} (it has criteria on other statistics than the probability difference)")
    up = [c for c in crit if c.advantage == "positive" and c.low is None]
    down = [c for c in crit if c.advantage == "non-positive" and c.high is None]
    if crit and len(up) + len(down) == len(crit) and len(up) <= 1 and len(down) <= 1:
        high = up[0].high if up else math.inf
        low = -down[0].low if down else math.inf
        return Settings(dict(type="default", dppo_mask_low=low, dppo_mask_high=high, adv_tau=comp.adv_tau,
                             kl_tau=kl_tau))
    if (eps := _eps(comp)) is not None:
        return Settings(dict(type="ipo", eps=eps, adv_tau=comp.adv_tau, kl_tau=kl_tau))
    raise CannotExpress(f"{_CUSTOM} (its probability-difference criteria are neither IPO's symmetric band nor the "
                        "sign-conditioned DPPO pair of v0.6.0 - v0.8.0)")


# a preset's config class -> (its table, its type): the config records the knobs, the class which loss they set
_OWN_TABLE = {IPOLossConfig: ("trainer.loss", "ipo"), KLIPOLossConfig: ("trainer.loss", "ipo"),
              PPOLossConfig: ("trainer.loss", "ppo"), CISPOLossConfig: ("trainer.loss", "cispo"),
              IcePopLossConfig: ("trainer.loss", "icepop"), DefaultLossConfig: ("trainer.loss", "default"),
              MarchIPOConfig: ("loss", None)}
_MARCH = "# the [loss] table of v0.5.0 (#1930, March 2026): IPO's band with its sides apart, before [trainer.loss]"
# Score centering in prime-rl (IPOLoss.score_centering_loss): the keys of its docs page "Score centering" (the search
# index's copy, id 70285517586, commit not recorded; the preset's code: seqis/presets/prime_rl.py NOW): score_centering
# in [trainer.loss], an unfused output layer, the sampler's top-k recorded by the orchestrator, processed log-probs
SC_NEEDS = ["score centering (prime-rl's docs page) needs a positive rollout temperature, processed log-probs and an",
            "unfused output layer; a missing head on an RL token, or a head outside the replayed support, is an error"]
SC_TABLES = {"trainer.model.fused_lm_head_token_chunk_size": "disabled",
             "orchestrator.train.sampling.score_centering_top_k": 128,
             "inference.vllm.logprobs_mode": "processed_logprobs", "inference.vllm.max_logprobs": 128}


def own_key(name: str, cfg=None) -> str:
    """A prime-rl knob is the key of the same name in its loss table (adv_tau too: prime-rl has it)."""
    return f"{_OWN_TABLE[type(cfg)][0] if cfg is not None else 'trainer.loss'}.{name}"


def own(cfg) -> Settings:
    """prime-rl's own preset: its loss table with the type its config class is and every knob; score_centering only
    when on (with the tables it needs), the March IPO in v0.5.0's [loss] table."""
    table, kind = _OWN_TABLE[type(cfg)]
    sc = getattr(cfg, "score_centering", False)
    skip = {"score_centering": "off, prime-rl's default"} if hasattr(cfg, "score_centering") and not sc else {}
    lead = {"default": [_REMOVED], None: [_MARCH]}.get(kind, [_BEFORE_CAP] if hasattr(cfg, "kl_tau") else [])
    s = own_settings(cfg, lambda n: own_key(n, cfg), skip=skip, adv_tau_key=True,
                     extra=SC_TABLES if sc else {})
    keys = {**({f"{table}.type": kind} if kind else {}), **s.keys}
    needs = SC_NEEDS if sc else []
    return Settings(keys, s.notes, comments=[c.lstrip("# ") for c in lead] + s.comments + needs)


def write(s: Settings) -> list[str]:
    keys = s.keys
    if all("." in k for k in keys):  # an own preset's tables, every key in full
        return toml_tables(keys)
    lead = [_REMOVED] if keys["type"] == "default" else [_BEFORE_CAP] if "kl_tau" in keys else []
    return lead + toml("trainer.loss", keys)
