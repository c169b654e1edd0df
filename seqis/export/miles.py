"""A composition as Miles command-line flags: slime's flags (see slime.py), with Miles's function paths.

Miles's PPO (compute_policy_loss, #1363) clamps its log-ratio to +-20: with --use-rollout-logprobs a token beyond
it has no gradient. The composition writes that as a ratio rejection [e^-20, e^20] on every token, read here as
Miles's own; a PPO-clip on pi/mu without it gets a NOTE."""

from __future__ import annotations

import math
from dataclasses import replace

from ..core.compose import SAFETY_BOUND, Composition
from . import slime
from ._format import CannotExpress, Settings, adv_tau_note
from ._own import own_settings

HEADER = ["Miles training flags (slime's, same code)"]
SUFFIX = "miles.sh"
PARTS = frozenset({"clamp_order", "normalize_all", "centering"})  # the later parts it writes (_parts.later_parts)
_ICEPOP = "miles.backends.training_utils.loss_hub.corrections.icepop_function"
_MIS = "examples.infra_features.train_infer_mismatch_helper.mis.compute_mis_weights_with_cp"


_BAND = (math.exp(-SAFETY_BOUND), math.exp(SAFETY_BOUND))


def settings(comp: Composition) -> Settings:
    if comp.centering is not None:
        return _centering(comp)
    band = [c for c in comp.criteria if (c.statistic, c.agg, c.advantage, c.low, c.high) == ("ratio", "token", None,
                                                                                           *_BAND)]
    comp = replace(comp, criteria=tuple(c for c in comp.criteria if c not in band))
    s = slime.settings(comp, icepop=_ICEPOP, mis=_MIS)
    if not band and comp.ppo_clip() is not None:
        s.notes.append("Miles clamps PPO's log-ratio at +-20: a token beyond it has no gradient")
    return s


write = slime.write


# Score centering in Miles (#3317, open; the preset: seqis/presets/miles.py SC_SOURCE). The flags are the ones the
# #3317 design's parser reads, nanjiangwill/miles@52a21b0 miles/utils/arguments.py (add_algo_arguments):
# --use-score-centering (store_true) and --score-centering-head-size (int, default 128), beside the TIS flags it shares
# with slime (--use-tis, --tis-clip, --tis-clip-low, --custom-tis-function-path: the built-in IcePop function, read
# by _importance_weights on both terms); --rollout-top-p / --rollout-top-k / --rollout-temperature (add_rollout_
# arguments: top-p below 1 or a positive top-k turns on sampling-support replay, i.e. exact centering; the modelled
# tail is refused otherwise at temperature != 1, miles/rollout/generate_utils/score_centering.py); --use-miles-router
# (radixark/miles@31f1ca9 add_router_arguments; the design's docs page docs/advanced/score-centering.md asks for it).
# radixark/miles@857598f carries another design (--loss-type score_centering, --score-centering-is none|tis|mis,
# --rollout-top-logprobs-num, both tails floored at 1e-6) that these presets do not model.
SC_HEAD = 128
_SC_FLAGS = {"--use-score-centering": True, "--score-centering-head-size": SC_HEAD, "--use-miles-router": True}
SC_REFUSALS = ["Miles's score centering (validate_score_centering_args) runs with --loss-type policy_loss, not GSPO;",
               "it refuses OPSM, OPD, unbiased KL, mismatch metrics, custom policy-loss reducers and prefill log-prob",
               "recomputation; the modelled tail needs --rollout-temperature 1 and no top-p / top-k / min-p"]
_MODELLED_TAIL = {"--rollout-top-p": 1.0, "--rollout-top-k": -1, "--rollout-temperature": 1.0}
_REPLAY_HOW = ("Miles centers over the replayed support when the rollout's sampling is truncated (--rollout-top-p "
               "below 1 or a positive --rollout-top-k: set your run's), over the modelled tail with --rollout-top-p 1 "
               "--rollout-top-k -1")
_REPLAY = f"Miles has no flag for it; {_REPLAY_HOW}"  # a NOTE: the snippet cannot carry the run's truncation


SC_FLOORS = (0.0, 1e-6)  # _score_modeled_tail: the sampler's tail floored at 0, the trainer's at 1e-6


def _weight_rule(comp: Composition) -> tuple[str, float | None, float | None]:
    """The TIS rule Miles would apply to the sampled token and the head: none, clamp (--use-tis) or band (IcePop)."""
    w = comp.weight
    if w.level == "none":
        return "none", None, None
    if w.level != "token" or w.self_normalize or (w.band is not None and (w.truncated or w.clip_low > 0)):
        raise CannotExpress("Miles's score centering weighs by a token rule only: --use-tis (clamp) or the IcePop "
                            f"function (this weight: {w.level})")
    return ("band", *w.band) if w.band is not None else ("clamp", w.clip_low, w.upper)


def _centering(comp: Composition) -> Settings:
    """Score centering as Miles's flags, from a composition (another framework's preset, vime's): the same rule on
    the sampled token and the head (Miles applies --use-tis's to both), no rejection; a NOTE where the tail floors
    differ from Miles's."""
    sc = comp.centering
    if comp.criteria or comp.penalty is not None or sc.prob_diff is not None:
        raise CannotExpress("Miles's score centering composes with no rejection, penalty or trust region on the head")
    rule, lo, hi = _weight_rule(comp)
    same = (sc.rule, sc.low, sc.high) == (rule, lo, hi) or (rule, sc.rule) == ("clamp", "truncate") and (
        lo, sc.high) == (0.0, hi) or rule == sc.rule == "none"
    if not same:
        raise CannotExpress(f"Miles applies the sampled token's TIS rule to the head ({rule}); this correction's "
                            f"centering rule is {sc.describe()}")
    keys: dict = {}
    if rule != "none" and not (math.isfinite(lo) and math.isfinite(hi)):
        raise CannotExpress(f"Miles's score centering requires finite TIS bounds (this correction: [{lo}, {hi}])")
    if rule != "none":
        keys = {"--use-tis": True, **({"--custom-tis-function-path": _ICEPOP} if rule == "band" else {}),
                "--tis-clip": hi, "--tis-clip-low": lo}
    notes: list[str] = []
    if not sc.exact and (sc.sampler_floor, sc.trainer_floor) != SC_FLOORS:
        notes.append(f"Miles floors the sampler's tail mass at 0 and the trainer's at 1e-6 (this correction: sampler "
                     f"{sc.sampler_floor}, trainer {sc.trainer_floor})")
    if comp.log_ratio_clamp is not None:
        notes.append(f"Miles's TIS clamps no log-ratio (this correction: +-{comp.log_ratio_clamp})")
    adv_tau_note(comp.adv_tau, notes)
    return Settings({**keys, **_SC_FLAGS, **({} if sc.exact else _MODELLED_TAIL)}, notes,
                    comments=[*SC_REFUSALS, *([_REPLAY_HOW] if sc.exact else [])])


def own_key(name: str, cfg=None) -> str:
    return slime.own_key(name)


def own_value(name: str, v):
    return slime.own_value(name, v, _ICEPOP)


def own(cfg) -> Settings:
    """Miles's own preset: slime's flags with Miles's function paths; a score-centering preset's flags with the
    rollout sampling its mode needs."""
    if not hasattr(cfg, "use_sampling_support_replay"):
        return slime.own(cfg, _ICEPOP, _MIS)
    exact = cfg.use_sampling_support_replay  # no flag: the rollout's sampling decides (the docs page)
    where = ({"uncarried": {"use_sampling_support_replay": _REPLAY}} if exact else
             {"skip": {"use_sampling_support_replay":
                           "off: it is the --rollout-top-p 1 --rollout-top-k -1 written here"}})
    s = own_settings(cfg, own_key, value=own_value, extra={**_SC_FLAGS, **({} if exact else _MODELLED_TAIL)},
                     comments=tuple(SC_REFUSALS), **where)
    return s
