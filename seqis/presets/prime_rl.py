"""prime-rl's RL losses as they shipped: today's four (IPO, the default; IcePop; PPO; CISPO), every earlier default,
the seed's four.

    ipo        pd_t = |p_t - q_t| (probabilities, computed as e^max(log p, log q) * -expm1(min - max)); drop token t
               if pd_t > eps; weight min(rho_t, R) on kept tokens: the ratio's value capped at R =
               max_importance_ratio, its gradient kept (exp(min(sg(l), log R) + l - sg(l)): d/dl = the capped
               value), so the gradient is min(rho_t, R) A; no KL term; sum / N, N = every loss token. eps 0.3, R 1e4.
    ppo        -min(r A, clip(r, ratio_low, ratio_high) A), r = min(rho_t, R) with its gradient kept: A > 0 keeps
               the gradient r A while r <= ratio_high, A < 0 while r >= ratio_low (compared as exp(l) against the
               bound, the dtype's arithmetic); 0.8, 1.2, R 1e4
    cispo      -sg(clamp(rho_t, ratio_low, ratio_high)) A log pi_t (clamped in log space; ratio_low 0 = no lower
               clamp): every token keeps a gradient; (0, 5)
    icepop     keep token t iff ratio_low <= rho_t <= ratio_high (tested in log space, inclusive); weight rho_t;
               no KL term (opt-in since 2026-09-10, 0.2 and 5.0)
    ipo (old)  September 2026's IPO (#3586): |exp(trainer) - exp(inference)| > 0.3 dropped, rho_t uncapped, plus
               kl_tau * l_t^2 (0); August 2026's (#3418): eps 0.1, kl_tau 1e-3; March 2026's (v0.5.0): drop
               pd_t > ipo_mask_high or pd_t < -ipo_mask_low, whatever A's sign (0.2, 0.2), plus 1e-3 * l^2
    dppo       the April-August 2026 default: drop token t if A > 0 and pd_t > dppo_mask_high, or A <= 0 and
               pd_t < -dppo_mask_low (torch.where on A > 0: A = 0 takes the low test); weight rho_t; plus
               kl_tau * l_t^2 (0.2, 0.2, 1e-3)
    masked IS  the December 2025 - March 2026 default (v0.2 - v0.4): weight rho_t, dropping tokens with rho_t
               outside [0.125, 8], rollouts with exp(S/T) outside [0.1, 10] and rollouts with any rho_t > 100

Penalty gradient: d loss / d trainer_logprobs = -weights * adv_tau * A / N + 2 kl_tau l_t / N on loss tokens.
Loss value: seqis's loss is the surrogate -sum s_t w_t A_t log pi_t, whose gradient is prime-rl's; prime-rl's ipo and
ppo losses are -A min(rho, R) (and PPO's min), whose value differs (CISPO's is the same surrogate).
Edge arithmetic: the old IPO compared exp(trainer) - exp(inference), as the composition's prob_diff does. Today's IPO
computes |p - q| as e^max * -expm1(min - max): the same number up to rounding, so a token within an ulp or so of eps
can fall the other way; the composition has no such statistic (not expressed; test_prime_rl_losses.py shows where
the two differ). PPO's torch.minimum(A r, A clip(r)) splits the gradient in half where the two products round
equal with r an ulp or so outside the band (not expressed: the composition keeps or drops the token whole).
Metrics: prime-rl's ppo and cispo report `is_clipped` (the fraction of loss tokens whose ratio the clip reached, in
log space) and ppo `ratio_capped` (l > log R); seqis's own `is_clipped` counts rollouts with a truncated weight, so
these are `metrics(batch, cfg)` here, not the evaluator's. Not kept: the IPO's opt-in score_centering (its sampling
mask's logprobs; prime-rl's score-centering presets are named by their own settings).
Docs vs code: docs/algorithms.md wrote the DPPO term as min(rho, delta) * A; the code never truncated.
Source: PrimeIntellect-ai/prime-rl, src/prime_rl/trainer/rl/loss.py; defaults in
packages/prime-rl-configs/src/prime_rl/configs/trainer.py. Read at 559b447 (2026-08-21); #3418 (IPO the default,
ipo_threshold renamed eps), #3526 (IcePop) and #3586 (eps 0.3, kl_tau 0) from their merged pull requests; today's
ipo / ppo / cispo (IPOLoss, PPOLoss, CISPOLoss, _capped_importance_ratio) from the search index's newest stored copy
of loss.py and configs/trainer.py, newer than any fetchable snapshot (the index records no commit for them: `INDEX`
below), and tests/unit/train/rl/test_loss.py of the same copy for the test vectors.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..core.compose import Centering, Composition, Criterion, Penalty, Weight
from ..core.spec import Preset
from ..core.types import Batch, Config, knob
from ..estimators import ESTIMATORS, SEED_ESTIMATORS
from ._preset import framework_estimator

_KL = "Weight of the kl_tau * l^2 term on every loss token."
_CAP = "Cap the ratio's value on kept tokens (its gradient kept): the weight is min(rho, this)."


@dataclass(frozen=True)
class IPOLossConfig(Config):
    """[trainer.loss] type = "ipo" as it ships now (the default): prime-rl's names and defaults, no kl_tau."""

    eps: float = knob(0.3, "Drop a token whose probability moved by more than this either way.", ge=0.0,
                      ui=(0.01, 1.0))
    max_importance_ratio: float = knob(1e4, _CAP, ge=1.0, ui=(1.0, 1e4), log=True, finite=True)
    score_centering: bool = knob(False, "Score centering over the replayed sampling support: subtract sum_S q_v "
                                 "min(p_v / q_v, R) 1[|p_v - q_v| <= eps] grad log p_v (needs the support).",
                                 choices=(False, True))


@dataclass(frozen=True)
class KLIPOLossConfig(Config):
    """[trainer.loss] type = "ipo" before the ratio cap: #3418's (eps, kl_tau), at #3586's defaults."""

    eps: float = knob(0.3, "Drop a token whose probability moved by more than this either way.", ge=0.0,
                      ui=(0.01, 1.0))
    kl_tau: float = knob(0.0, _KL, ge=0.0, ui=(0.0, 0.1))


@dataclass(frozen=True)
class PPOLossConfig(Config):
    """[trainer.loss] type = "ppo": the token-level clipped surrogate against the sampler; prime-rl's names."""

    ratio_low: float = knob(0.8, "Lower clip of the ratio (at most 1): with A < 0 a token below it has no gradient.",
                            gt=0.0, ui=(0.5, 1.0))
    ratio_high: float = knob(1.2, "Upper clip of the ratio (at least 1): with A > 0 a token above it has no "
                             "gradient.", ge=1.0, ui=(1.0, 2.0), finite=True)
    max_importance_ratio: float = knob(1e4, _CAP, ge=1.0, ui=(2.0, 1e4), log=True, finite=True)

    def __post_init__(self):
        super().__post_init__()
        if not self.ratio_low <= 1.0:
            raise ValueError(f"ratio_low must be at most 1, got {self.ratio_low}")
        if not self.max_importance_ratio > self.ratio_high:
            # prime-rl allows equality; there the capped ratio of an A > 0 token above the band is the clip itself
            # and whether it keeps a gradient is decided by the rounding of exp(log R): not expressed here
            raise ValueError("max_importance_ratio must be above ratio_high, got "
                             f"{self.max_importance_ratio} <= {self.ratio_high}")


@dataclass(frozen=True)
class CISPOLossConfig(Config):
    """[trainer.loss] type = "cispo": the detached clamped ratio on log pi; prime-rl's names."""

    ratio_low: float = knob(0.0, "Lower clamp of the detached weight (0: none; at most 1).", ge=0.0, ui=(0.0, 1.0))
    ratio_high: float = knob(5.0, "Upper clamp of the detached weight (at least 1).", ge=1.0, ui=(1.0, 10.0),
                             finite=True)

    def __post_init__(self):
        super().__post_init__()
        if not self.ratio_low <= 1.0:
            raise ValueError(f"ratio_low must be at most 1, got {self.ratio_low}")


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
    cap = Weight("token", clip=cfg.max_importance_ratio)  # min(rho, R): the capped value, its gradient kept
    sc = (Centering("truncate", high=cfg.max_importance_ratio, exact=True, prob_diff=cfg.eps)
          if cfg.score_centering else None)  # IPOLoss.score_centering_loss: IPO's own weight on the support
    return Composition(cap, (_prob_band(cfg.eps, cfg.eps),), adv_tau=cfg.adv_tau, centering=sc)


def compose_kl_ipo(cfg: KLIPOLossConfig) -> Composition:
    return Composition(Weight("token"), (_prob_band(cfg.eps, cfg.eps),), penalty=_kl(cfg.kl_tau), adv_tau=cfg.adv_tau)


def compose_ppo(cfg: PPOLossConfig) -> Composition:
    # -min(r A, clip(r) A) has the gradient r A where r is not clipped on the advantage's side; r = min(rho, R)
    up = Criterion("ratio", "token", high=cfg.ratio_high, advantage="positive", edge_space="ratio")
    down = Criterion("ratio", "token", low=cfg.ratio_low, advantage="negative", edge_space="ratio")
    return Composition(Weight("token", clip=cfg.max_importance_ratio), (up, down), adv_tau=cfg.adv_tau)


def compose_cispo(cfg: CISPOLossConfig) -> Composition:
    return Composition(Weight("token", clip=cfg.ratio_high, clip_low=cfg.ratio_low), adv_tau=cfg.adv_tau)


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


def clip_metrics(batch: Batch, cfg: PPOLossConfig | CISPOLossConfig) -> dict[str, torch.Tensor]:
    """prime-rl's own metrics of its ppo and cispo losses (PPOLoss, CISPOLoss), under its names: seqis's evaluators
    report a rollout-level `is_clipped` (rollouts with a truncated weight), so these are computed here, as prime-rl
    does, in the log-probs' dtype, over the batch's loss tokens (prime-rl: per sample, then averaged).

        is_clipped     ppo: fraction with A > 0 and l > log(ratio_high), or A < 0 and l < log(ratio_low) (A scaled
                       by adv_tau); cispo: fraction with l > log(ratio_high), or l < log(ratio_low) when ratio_low > 0
        ratio_capped   ppo only: fraction with l > log(max_importance_ratio)
    """
    m = batch.loss_mask  # (B, T)
    l = (batch.trainer_logprobs.detach() - batch.inference_logprobs)[m]  # (n,) loss tokens, row by row
    log = lambda x: l.new_tensor(x).log()  # noqa: E731  the bound's log in the dtype, as prime-rl takes it
    n = max(l.numel(), 1)
    if isinstance(cfg, PPOLossConfig):
        adv = cfg.adv_tau * (batch.advantages[:, None] if batch.advantages.dim() == 1 else batch.advantages)
        a = adv.expand_as(m)[m]  # (n,)
        clipped = ((a > 0) & (l > log(cfg.ratio_high))) | ((a < 0) & (l < log(cfg.ratio_low)))
        capped = l > log(cfg.max_importance_ratio)
        return {"is_clipped": clipped.sum().to(l.dtype) / n, "ratio_capped": capped.sum().to(l.dtype) / n}
    clipped = l > log(cfg.ratio_high)
    if cfg.ratio_low:
        clipped = clipped | (l < log(cfg.ratio_low))
    return {"is_clipped": clipped.sum().to(l.dtype) / n}


REPO = "PrimeIntellect-ai/prime-rl"
LOSS = "src/prime_rl/trainer/rl/loss.py"
AT = f"{REPO}@559b447: {LOSS}"  # the commit read (2026-08-21)
SEED_SOURCE = "seqis@seed: seqis/estimators/{}.py (the seed: prime-rl's sequence-level IS ablations)"
# today's ipo / ppo / cispo: the search index's newest stored copy, newer than any fetchable snapshot; the index
# records no commit for it, so its ids say which copy was read (loss.py, configs/trainer.py, test_loss.py)
INDEX = (f"{REPO}@index (a copy newer than 559b447 whose commit the search index does not record; ids 70272943118 "
         "loss.py, 70316872618 configs/trainer.py, 70102433806 tests/unit/train/rl/test_loss.py)")
NOW = f"{INDEX}: {LOSS}"
_IPO = framework_estimator("prime-rl/ipo", compose_ipo, IPOLossConfig, "prime-rl's IPO loss, its ratio capped.")
_KL_IPO = framework_estimator("prime-rl/ipo_2026_09", compose_kl_ipo, KLIPOLossConfig,
                              "prime-rl's IPO loss before the ratio cap.")
_PPO = framework_estimator("prime-rl/ppo", compose_ppo, PPOLossConfig, "prime-rl's PPO loss against the sampler.")
_CISPO = framework_estimator("prime-rl/cispo", compose_cispo, CISPOLossConfig, "prime-rl's CISPO loss.")
_ICEPOP = framework_estimator("prime-rl/icepop", compose_icepop, IcePopLossConfig, "prime-rl's IcePop loss.")
_DPPO = framework_estimator("prime-rl/dppo", compose_dppo, DefaultLossConfig, "prime-rl's DPPO + KL loss.")
_MARCH = framework_estimator("prime-rl/ipo_2026_03", compose_march_ipo, MarchIPOConfig, "prime-rl v0.5's IPO.")
_MASKED = framework_estimator("prime-rl/masked_is_2025_12", compose_masked_is, MaskedISConfig,
                              "prime-rl v0.2 - v0.4's masked IS.")
_TODAY = ("in the index's newest copy of prime-rl (after 2026-09-18; the change's pull request and date are not "
          "in the copy read)")
_SEPTEMBER = ("the default from 2026-09-18 (prime-rl #3586: eps 0.3, kl_tau 0) until the ratio cap, which the index's "
              "newest copy has (its pull request and date are not in the copy read)")
_IPO_SUMMARY = ("min(rho_t, 1e4) (the value capped, its gradient kept), dropping tokens whose probability moved more "
                "than 0.3 either way (abs(p - q) > 0.3, computed as e^max * -expm1(min - max)), no KL term")

PRESETS = [
    Preset("prime-rl/default", f"IPO (the default: no [trainer.loss]): {_IPO_SUMMARY}.",
           f"{NOW} (IPOLoss, _capped_importance_ratio; configs/trainer.py IPOLossConfig)", _IPO, IPOLossConfig(),
           versions=f"the default {_TODAY}; IPO the default since #3418, 2026-08-27"),
    Preset("prime-rl/ipo", f"[trainer.loss] type = \"ipo\" at its defaults: {_IPO_SUMMARY}.",
           f"{NOW} (IPOLoss, _capped_importance_ratio; configs/trainer.py IPOLossConfig)", _IPO, IPOLossConfig(),
           versions=f"max_importance_ratio {_TODAY}; type ipo since 2026-06-14 (#2798)"),
    Preset("prime-rl/ipo_score_centering", f"[trainer.loss] type = \"ipo\", score_centering = true: {_IPO_SUMMARY}; "
           "plus score centering over the replayed sampling support S (the trainer renormalised on it), c_v = q_v "
           "min(p_v / q_v, 1e4) 1[|p_v - q_v| <= 0.3] on every loss token, no tail; quirks: prime-rl adds no - p_v "
           "(the same gradient: sum p grad log p = 0 on S; its value differs), and a rollout without the sampler's "
           "support logprobs gets no centering (seqis refuses a batch without topk_support).",
           f"{NOW} (IPOLoss.score_centering_loss, sampling_mask_logprobs)", _IPO,
           IPOLossConfig(score_centering=True), versions=f"opt-in, {_TODAY}"),
    Preset("prime-rl/ipo_2026_09", "IPO as #3586 set it (the default from September 2026 until the ratio cap): "
           "rho_t uncapped, dropping tokens whose probability moved more than 0.3 either way (abs(exp(trainer) - "
           "exp(inference)) > 0.3), kl_tau 0.", f"{AT} (ipo_loss_fn); defaults per #3586, merged after the commit "
           "read", _KL_IPO, KLIPOLossConfig(), versions=_SEPTEMBER),
    Preset("prime-rl/ppo", "[trainer.loss] type = \"ppo\": -min(r A, clip(r, 0.8, 1.2) A) against the sampler, r = "
           "min(rho_t, 1e4) with its gradient kept: gradient r A unless A > 0 and r > 1.2 or A < 0 and r < 0.8 "
           "(exp(l) against the bound).", f"{NOW} (PPOLoss; configs/trainer.py PPOLossConfig)", _PPO,
           PPOLossConfig(), versions=f"opt-in, {_TODAY}"),
    Preset("prime-rl/cispo", "[trainer.loss] type = \"cispo\": sg(clamp(rho_t, 0, 5)) A log pi_t (clamped in log "
           "space), every token keeps a gradient.", f"{NOW} (CISPOLoss; configs/trainer.py CISPOLossConfig)",
           _CISPO, CISPOLossConfig(), versions=f"opt-in, {_TODAY}"),
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
           f"{AT} (ipo_loss_fn, IPOLossConfig: ipo_threshold 0.1, kl_tau 1e-3)", _KL_IPO,
           KLIPOLossConfig(eps=0.1, kl_tau=1e-3),
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
