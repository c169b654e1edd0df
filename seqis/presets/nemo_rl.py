"""NeMo-RL's truncated importance sampling in ClippedPGLossFn (loss_fn.truncated_importance_sampling_type).

    IS weight   rho_t = nan_to_num(exp(l_t), posinf=0)  (needs use_importance_sampling_correction: true); with
                sequence_level_importance_ratios: true the product w_j = nan_to_num(exp(S_j), posinf=0) instead,
                on every token of the rollout (and the PPO ratio is GSPO's geometric one, 1 at the first
                minibatch; token_level_loss must be false: seq-mean-token-mean), and tis / icepop apply to w_j
    tis         clamp(rho_t, ratio_min or 0, ratio)
    icepop      rho_t * 1[ratio_min <= rho_t <= ratio]
    seq-mask-tis  rho_t * 1[ratio_min <= exp(S_j/T_j) <= ratio]  (raw token ratios: no truncation despite the name)

NeMo-RL sets no default bounds (both None; it asserts they are given). Used here: tis 2.0 (most example recipes,
e.g. examples/configs/recipes/llm/*dapo*; docs/guides/prorlv2.md shows 5.0), icepop 0.5..5.0 and seq-mask-tis
0.999..1.002 (docs/guides/prorlv2.md and the code comments' "ref bounds"); no recipe sets sequence-level weights
with a truncation, so seq-tis and seq-icepop take the token presets' bounds. Quirk not kept: a ratio that
overflows float32 (l > 88.7, or S > 88.7 at sequence level) becomes weight 0 in NeMo-RL, even under "tis"; seqis
caps it at e^40 before the clip. The token-level loss averages over every valid token (zeroed ones included).
Source: NVIDIA-NeMo/RL, nemo_rl/algorithms/loss/loss_functions.py (ClippedPGLossFn). Read at 7ea279a (2026-08-22).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..core.compose import Centering, Composition, Criterion, Weight
from ..core.spec import Preset
from ..core.types import Config, knob
from ._preset import framework_estimator


@dataclass(frozen=True)
class NemoRLConfig(Config):
    """loss_fn keys; NeMo-RL's names."""

    use_importance_sampling_correction: bool = knob(True, "Multiply the loss by the IS weight pi/mu.",
                                                    choices=(True, False))
    truncated_importance_sampling_type: str | None = knob(
        None, "tis (clamp), icepop (token band), seq-mask-tis (geometric band, raw token weights).", optional=True,
        choices=(None, "tis", "icepop", "seq-mask-tis"))
    truncated_importance_sampling_ratio: float | None = knob(None, "Upper bound.", optional=True, gt=0.0,
                                                             ui=(1.0, 10.0), log=True)
    truncated_importance_sampling_ratio_min: float | None = knob(None, "Lower bound (tis: defaults to 0).",
                                                                 optional=True, ge=0.0, ui=(0.0, 1.0))
    sequence_level_importance_ratios: bool = knob(False, "Weigh every token of a rollout by its product ratio "
                                                  "exp(S) (GSPO's setting).", choices=(False, True))
    seq_logprob_error_threshold: float | None = knob(None, "grpo.seq_logprob_error_threshold: drop a rollout whose "
                                                     "mean e^|l| exceeds this (out of the loss's token count too); "
                                                     "None = off.", optional=True, gt=0.0, ui=(1.0, 10.0), log=True)
    score_centering: bool = knob(False, "loss_fn.score_centering (nightly): subtract the sampler-expected score over "
                                 "the sampler's top-k head, f the token IS rule; the trainer's tail floored at 1e-6.",
                                 choices=(False, True))

    def __post_init__(self):
        super().__post_init__()
        kind, hi, lo = (self.truncated_importance_sampling_type, self.truncated_importance_sampling_ratio,
                        self.truncated_importance_sampling_ratio_min)
        if self.score_centering and (self.sequence_level_importance_ratios or kind == "seq-mask-tis"):
            raise ValueError("score_centering composes with a token-level IS rule (none, tis, icepop): its f weighs "
                             "every head token; sequence-level weights and seq-mask-tis have no per-token f")
        if kind is None:
            return
        if not self.use_importance_sampling_correction:
            raise ValueError("truncated_importance_sampling_type needs use_importance_sampling_correction: true")
        if hi is None:
            raise ValueError("truncated_importance_sampling_ratio must be set (NeMo-RL asserts it is positive)")
        if lo is not None and lo > hi:
            raise ValueError("truncated_importance_sampling_ratio_min must be <= truncated_importance_sampling_ratio")
        if kind != "tis" and lo is None:
            raise ValueError(f"truncated_importance_sampling_ratio_min must be set for {kind}")
        if kind == "seq-mask-tis" and self.sequence_level_importance_ratios:
            raise ValueError("seq-mask-tis is incompatible with sequence_level_importance_ratios (NeMo-RL asserts)")


def compose(cfg: NemoRLConfig) -> Composition:
    kind, hi, lo = (cfg.truncated_importance_sampling_type, cfg.truncated_importance_sampling_ratio,
                    cfg.truncated_importance_sampling_ratio_min)
    criteria = ()
    level = "sequence" if cfg.sequence_level_importance_ratios else "token"
    if not cfg.use_importance_sampling_correction:
        weight = Weight("none")
    elif kind is None:
        weight = Weight(level)
    elif kind == "tis":
        weight = Weight(level, clip=hi, clip_low=lo or 0.0)
    elif kind == "icepop":
        weight = Weight(level, band=(lo, hi))
    else:  # seq-mask-tis: geometric-mean gate, raw token weights
        weight, criteria = Weight("token"), (Criterion("ratio", "mean", low=lo, high=hi),)
    if cfg.seq_logprob_error_threshold is not None:  # grpo.py: sample_mask zeroed, so N loses the rollout too
        criteria = (*criteria, Criterion("exp_abs_log_ratio", "mean", high=cfg.seq_logprob_error_threshold,
                                         leaves_normaliser=True))
    return Composition(weight, criteria, adv_tau=cfg.adv_tau,
                       centering=_centering(cfg) if cfg.score_centering else None)


def _centering(cfg: NemoRLConfig) -> Centering:
    """compute_score_centering_term's f: 1 without IS, clamp(x, lo, hi) for tis (untruncated IS: clamp(x, 0, inf),
    the coefficient 0), the band for icepop; rho = (1 - Q_H) / max(1 - P_H, 1e-6): the trainer's tail only."""
    floors = dict(sampler_floor=None, trainer_floor=1e-6)
    kind, hi, lo = (cfg.truncated_importance_sampling_type, cfg.truncated_importance_sampling_ratio,
                    cfg.truncated_importance_sampling_ratio_min)
    if not cfg.use_importance_sampling_correction:
        return Centering("none", **floors)
    if kind == "icepop":
        return Centering("band", low=lo, high=hi, **floors)
    return Centering("clamp", low=lo or 0.0, high=math.inf if kind is None else hi, **floors)


ESTIMATOR = framework_estimator("nemo-rl", compose, NemoRLConfig, "NeMo-RL ClippedPGLossFn's truncated IS.")
SOURCE = "NVIDIA-NeMo/RL@7ea279a: nemo_rl/algorithms/loss/loss_functions.py (ClippedPGLossFn)"
_SEQ_LEVEL = dict(sequence_level_importance_ratios=True)
SC_SOURCE = ("NVIDIA-NeMo/RL@nightly: nemo_rl/algorithms/loss/score_centering.py (compute_score_centering_term), as "
             "its API page and docs/guides/score-centering.md state it. The code itself is not read: the newest "
             "stored snapshot of NVIDIA-NeMo/RL (7ea279a, 2026-08-22, every branch and PR ref) predates the paper and "
             "has no score centering, and no fork in the code index carries it (searched 2026-12-05)")
SC_VERSIONS = ("in NeMo-RL's nightly, after arXiv 2609.20807 of 2026-09-17 "
               "(loss_fn.score_centering, experimental, off by "
               "default); in no release yet")
_TIS = dict(truncated_importance_sampling_type="tis", truncated_importance_sampling_ratio=2.0)
_ICEPOP = dict(truncated_importance_sampling_type="icepop", truncated_importance_sampling_ratio=5.0,
               truncated_importance_sampling_ratio_min=0.5)
_SEQ = dict(truncated_importance_sampling_type="seq-mask-tis", truncated_importance_sampling_ratio=1.002,
            truncated_importance_sampling_ratio_min=0.999)

PRESETS = [
    Preset("nemo-rl/tis", "Token TIS clamp(rho_t, 0, 2); NeMo-RL has no default bound: 2 is what most of its "
           "example recipes use (prorlv2 docs: 5).", SOURCE, ESTIMATOR, NemoRLConfig(**_TIS),
           versions="since 2025-10-21 (NeMo-RL #1348)"),
    Preset("nemo-rl/icepop", "IcePop rho_t * 1[0.5 <= rho_t <= 5]; bounds from NeMo-RL's prorlv2 guide (no code "
           "default).", SOURCE, ESTIMATOR, NemoRLConfig(**_ICEPOP), versions="since 2026-02-07 (NeMo-RL #1809)"),
    Preset("nemo-rl/seq-mask-tis", "rho_t (untruncated, despite the name) on rollouts with 0.999 <= exp(S/T) <= "
           "1.002, else 0; bounds from NeMo-RL's prorlv2 guide.", SOURCE, ESTIMATOR, NemoRLConfig(**_SEQ),
           versions="since 2026-02-15 (NeMo-RL #1899)"),
    Preset("nemo-rl/seq-logprob-error", "The Nemotron recipes' setting: rollouts whose mean e^|l| (mult_prob_error) "
           "exceeds 2 dropped, out of the loss's token count too (the rest weigh N / N_kept more), on token TIS "
           "clamp(rho_t, 0, 5). Quirk (NeMo-RL #4171, pre-existing in grpo.py): the error multiplies by sample_mask's "
           "weights w where a 0/1 mask belongs, sum exp(w |l|) w / sum w, so a down-weighted rollout passes more "
           "easily; a Batch's mask is 0/1, where the two agree.", "NVIDIA-NeMo/RL@7ea279a: nemo_rl/algorithms/grpo.py "
           "(compute_and_apply_seq_logprob_error_masking)", ESTIMATOR,
           NemoRLConfig(truncated_importance_sampling_type="tis", truncated_importance_sampling_ratio=5.0,
                        seq_logprob_error_threshold=2.0), versions="since 2026-02-13 (NeMo-RL #1838)"),
    Preset("nemo-rl/tis-score-centering", "Token TIS clamp(rho_t, 0, 2) plus score centering over the sampler's top-k "
           "head (loss_fn.score_centering; f = clamp(x, 0, 2), alpha = clamp(1, 0, 2 rho)), the tail modelled as rho p "
           "with rho = (1 - Q_H) / max(1 - P_H, 1e-6): the trainer's tail floored, the sampler's not.", SC_SOURCE,
           ESTIMATOR, NemoRLConfig(**_TIS, score_centering=True), versions=SC_VERSIONS),
    Preset("nemo-rl/icepop-score-centering", "IcePop rho_t * 1[0.5 <= rho_t <= 5] plus score centering (f the same "
           "band; the unit tail coefficient kept only where 1 / rho is in it), rho = (1 - Q_H) / max(1 - P_H, 1e-6).",
           SC_SOURCE, ESTIMATOR, NemoRLConfig(**_ICEPOP, score_centering=True), versions=SC_VERSIONS),
    Preset("nemo-rl/seq-tis", "Sequence TIS clamp(exp(S), 0, 2) on every token (sequence_level_importance_ratios "
           "with tis; no code default: the token preset's 2; an exp(S) overflowing float32 weighs 0 there).",
           SOURCE, ESTIMATOR, NemoRLConfig(**_TIS, **_SEQ_LEVEL),
           versions="since 2025-10-21 (NeMo-RL #1348; sequence-level weights since 2025-08-27, #976)"),
    Preset("nemo-rl/seq-icepop", "exp(S) * 1[0.5 <= exp(S) <= 5] on every token (sequence_level_importance_ratios "
           "with icepop; the token preset's prorlv2 bounds).", SOURCE, ESTIMATOR,
           NemoRLConfig(**_ICEPOP, **_SEQ_LEVEL), versions="since 2026-02-07 (NeMo-RL #1809)"),
]
