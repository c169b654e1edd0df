"""AReaL's PPO actor: its real default (no behaviour weight) and the decoupled loss's rejection sampling.

    default    PPOActorConfig as shipped: use_decoupled_loss false, recompute_logprob false, rejection_sampling
               None. pi_old is then the sampler's log-probs, so the only correction is PPO's clip on pi/mu:
               A > 0 keeps r <= 1 + eps_clip_higher (or eps_clip), A < 0 keeps r >= 1 - eps_clip (and r <= c_clip
               with dual clipping), weight r (the PPO ratio's own gradient). With use_decoupled_loss true and no
               rejection_sampling block, pi_old is the recomputed trainer and the weight is 1 (nothing at all).
    decoupled  use_decoupled_loss true: PPO on pi_theta / pi_proximal (1 at the first minibatch) times
               behave_imp_weight = exp(l_t) (l in fp32, a non-finite l replaced by 0); level sequence + metric
               ratio: the geometric mean exp(S/T) on every token instead
    metric     ratio (aggregated in log space: sum -> exp S, mean -> exp(S/T), max -> max rho), kl_k1 = +l (the
               opposite sign to verl's), kl_k2 = l^2 / 2 (sum / mean / max taken on the metric)
    mask       drop tokens (level token) or rollouts (level sequence) whose metric leaves [lower, upper]
               (lower None = open; functional.py:180 compares the metric itself: the ratio's edges in ratio
               space, edge_space "ratio", in float32 as AReaL upcasts); clamp: the weight is clamped to
               [lower or 0, upper] instead

Rejection defaults (the block's fields): level token, action mask, metric ratio, agg mean, upper 5.0, lower None,
the old behave_imp_weight_cap 5 with token_mask, which every shipped recipe sets (examples/*/*.yaml). IcePop
(examples/math/gsm8k_icepop.yaml, #1405) is the same block with lower 0.5. Normalisation: every loss token
(token-mean). Not expressible (compose raises): metric kl_k3, which AReaL computes as exp(-l) - 1 + l (the reverse
k3), and clamp at sequence level with agg sum or max (it clamps only out-of-bounds rollouts).
Source: areal-project/AReaL (was inclusionAI/AReaL), areal/utils/functional/functional.py
(apply_rejection_sampling, ppo_actor_loss_fn), areal/api/cli_args.py (PPOActorConfig, RejectionSamplingConfig),
areal/trainer/ppo/actor.py (grpo_loss_fn). Read at cbff54d (2026-08-22).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.compose import BatchRule, Composition, Criterion, Weight, ppo_clip_criteria
from ..core.spec import Preset
from ..core.types import Config, knob
from ._preset import framework_estimator


@dataclass(frozen=True)
class ArealConfig(Config):
    """PPOActorConfig (the PPO clip, the decoupled loss) and its RejectionSamplingConfig; AReaL's names."""

    use_decoupled_loss: bool = knob(False, "Decoupled loss: pi_old is the recomputed trainer, the sampler's "
                                    "ratio the behaviour weight (else PPO clips pi/mu).", choices=(False, True))
    eps_clip: float = knob(0.2, "PPO's epsilon (without the decoupled loss: on pi/mu).", gt=0.0, ui=(0.05, 1.0),
                           inf=True)
    eps_clip_higher: float | None = knob(None, "PPO's upper epsilon; None = eps_clip.", optional=True, gt=0.0,
                                         ui=(0.05, 1.0), inf=True)
    c_clip: float | None = knob(None, "Dual clip for A < 0; None = off.", optional=True, gt=1.0, ui=(1.5, 10.0),
                                inf=True)
    rejection_sampling: bool = knob(False, "Set the rejection_sampling block (decoupled loss only).",
                                    choices=(False, True))
    level: str = knob("token", "Filter per token or per rollout.", choices=("token", "sequence"))
    action: str = knob("mask", "mask (drop) or clamp (bound the weight).", choices=("mask", "clamp"))
    metric: str = knob("ratio", "ratio, kl_k1 (+l), kl_k2 (l^2 / 2) or binary_kl (KPop: the larger KL of the "
                       "two-outcome split, both directions).", choices=("ratio", "kl_k1", "kl_k2", "binary_kl"))
    agg: str = knob("mean", "Rollout aggregation (level sequence).", choices=("sum", "mean", "max"))
    upper: float = knob(5.0, "Upper bound on the metric.", gt=0.0, ui=(1.0, 10.0), log=True)
    lower: float | None = knob(None, "Lower bound on the metric; None = open.", optional=True, ui=(0.0, 1.0))
    m2_threshold: float | None = knob(None, "M2PO (decoupled loss): drop the batch's largest l^2 until their mean "
                                      "is below this; None = off.", optional=True, gt=0.0, ui=(0.001, 1.0), log=True)

    def __post_init__(self):
        super().__post_init__()
        if self.action == "clamp" and self.metric != "ratio":
            raise ValueError("action=clamp only supports metric=ratio (AReaL raises too)")
        if self.level == "sequence" and self.action == "clamp" and not (self.metric == "ratio" and self.agg == "mean"):
            raise ValueError("level=sequence with action=clamp clamps only the rollouts outside the bounds: "
                             "expressible for metric=ratio, agg=mean only")


def _criterion(metric: str, agg: str, lower: float | None, upper: float) -> Criterion:
    """AReaL's bound on its metric, in the composition's statistics (k1 there is -l, so AReaL's +l band flips)."""
    if metric == "ratio":
        return Criterion("ratio", agg, low=lower, high=upper, edge_space="ratio")  # exp(agg) vs the bounds (:180)
    if metric == "kl_k2":
        return Criterion("k2", agg, low=lower, high=upper)
    if metric == "binary_kl":  # the larger of KL_B(pi || mu), KL_B(mu || pi), probabilities clamped to 1e-8
        return Criterion("binary_kl", agg, low=lower, high=upper)
    flipped = {"token": "token", "sum": "sum", "mean": "mean", "max": "min"}[agg]  # max of l = -min of -l
    return Criterion("k1", flipped, low=-upper, high=None if lower is None else -lower)


def compose(cfg: ArealConfig) -> Composition:
    if not cfg.use_decoupled_loss:  # pi_old = mu: PPO-clip on pi/mu, the rejection block sees ratio 1 (inert)
        high = cfg.eps_clip if cfg.eps_clip_higher is None else cfg.eps_clip_higher
        return Composition(Weight("token"), ppo_clip_criteria(cfg.eps_clip, high, cfg.c_clip), adv_tau=cfg.adv_tau)
    m2po = None if cfg.m2_threshold is None else BatchRule(cfg.m2_threshold)  # before the rejection (grpo_loss_fn)
    if not cfg.rejection_sampling:
        return Composition(Weight("none"), adv_tau=cfg.adv_tau, batch_rule=m2po)
    geometric = cfg.level == "sequence" and cfg.metric == "ratio"
    level = "geometric" if geometric else "token"
    if cfg.action == "clamp":
        return Composition(Weight(level, clip=cfg.upper, clip_low=cfg.lower or 0.0), adv_tau=cfg.adv_tau,
                           batch_rule=m2po)
    agg = cfg.agg if cfg.level == "sequence" else "token"
    return Composition(Weight(level), (_criterion(cfg.metric, agg, cfg.lower, cfg.upper),), adv_tau=cfg.adv_tau,
                       batch_rule=m2po)


ESTIMATOR = framework_estimator("areal", compose, ArealConfig, "AReaL's PPO actor and its rejection sampling.")
AT = "areal-project/AReaL@cbff54d: areal/utils/functional/functional.py"
SOURCE = f"{AT} (apply_rejection_sampling)"
_RS = dict(use_decoupled_loss=True, rejection_sampling=True)
_BLOCK = "since 2026-04-20 (AReaL #1088, rejection_sampling); before, behave_imp_weight_mode "

PRESETS = [
    Preset("areal/default", "AReaL's real default: no behaviour weight (rejection_sampling None, no decoupled "
           "loss), so pi_old is the sampler and PPO's clip on pi/mu (eps 0.2) is the only correction: A > 0 keeps "
           "r <= 1.2, A < 0 keeps r >= 0.8, weight r.", f"{AT} (ppo_actor_loss_fn); areal/api/cli_args.py "
           "(PPOActorConfig)", ESTIMATOR, ArealConfig(),
           versions="since 2026-04-20 (AReaL #1088: rejection_sampling None); use_decoupled_loss false throughout"),
    Preset("areal/token_mask", "rho_t, tokens with rho_t > 5 dropped (the rejection_sampling block's defaults, "
           "which every shipped recipe sets with use_decoupled_loss true).", SOURCE, ESTIMATOR, ArealConfig(**_RS),
           versions=_BLOCK + "token_mask (the decoupled loss's default)"),
    Preset("areal/token_truncate", "min(rho_t, 5) per token (action clamp).", SOURCE, ESTIMATOR,
           ArealConfig(**_RS, action="clamp"), versions=_BLOCK + "token_truncate"),
    Preset("areal/sequence_mask", "The geometric mean exp(S/T) as every token's weight, rollouts with it above 5 "
           "dropped (level sequence).", SOURCE, ESTIMATOR, ArealConfig(**_RS, level="sequence"),
           versions="since 2026-03-03 (AReaL #930, sequence_mask), rejection_sampling since 2026-04-20 (#1088)"),
    Preset("areal/sequence_truncate", "min(exp(S/T), 5) on every token (level sequence, action clamp).", SOURCE,
           ESTIMATOR, ArealConfig(**_RS, level="sequence", action="clamp"),
           versions="since 2026-03-03 (AReaL #930, sequence_truncate), rejection_sampling since 2026-04-20 (#1088)"),
    Preset("areal/kpop", "KPop (examples/math/gsm8k_kpop.yaml): rho_t on tokens whose larger binary KL, "
           "max(KL_B(pi || mu), KL_B(mu || pi)) with probabilities clamped to [1e-8, 1 - 1e-8], is <= 2; AReaL's "
           "own config validation (_VALID_METRICS) refuses metric binary_kl at cbff54d, its function computes it.",
           SOURCE, ESTIMATOR, ArealConfig(**_RS, metric="binary_kl", upper=2.0),
           versions="since 2026-06-15 (AReaL #1405)"),
    Preset("areal/m2po", "M2PO (examples/math/gsm8k_m2po.yaml): drop the batch's largest l^2 until the rest's mean is "
           "below 0.04, the rest weigh rho_t with rho_t > 5 dropped; the loss divides by M2PO's survivors (their "
           "weights scale by N / N_kept).", "areal-project/AReaL@cbff54d: areal/trainer/ppo/actor.py "
           "(_apply_m2po_masking, grpo_loss_fn)", ESTIMATOR, ArealConfig(**_RS, m2_threshold=0.04),
           versions="since 2025-10-31 (AReaL #480); with rejection_sampling since 2026-04-20 (#1088)"),
    Preset("areal/icepop", "IcePop (examples/math/gsm8k_icepop.yaml): rho_t on tokens with 0.5 <= rho_t <= 5 "
           "(inclusive), others dropped.", SOURCE, ESTIMATOR, ArealConfig(**_RS, lower=0.5),
           versions="since 2026-06-15 (AReaL #1405, as rejection_sampling with lower 0.5)"),
]
