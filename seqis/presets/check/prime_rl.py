"""prime-rl's RL losses (src/prime_rl/trainer/rl/loss.py), whichever era the checkout is from.

Each loss is a per-sample function (or, since #3526, a loss object's .loss()) of 1-D tensors; compute_loss sums
them over the samples and divides by the batch's loss tokens (token-mean), as done here. Which function a preset
runs follows its config: ipo (IPOLoss or ipo_loss_fn; eps, formerly ipo_threshold; today's with
max_importance_ratio, before it with kl_tau), icepop (IcePopLoss), ppo (PPOLoss), cispo (CISPOLoss), and
default_loss_fn for the older defaults, whose knobs changed with each era: a checkout whose loss reads other knobs
than the preset's (AttributeError) does not have that preset's loss.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ...core.types import Batch
from ..prime_rl import CISPOLossConfig, IcePopLossConfig, PPOLossConfig
from . import Reference
from ._load import MissingCode, attrs, definitions, find, namespace

LOSS = "src/prime_rl/trainer/rl/loss.py"
# v0.4's knobs the preset does not set, at their defaults (its kl_tau, 0, entered the weight, not a penalty)
_EXTRA = dict(teacher_tau=0.0, ratio_type="token", sequence_clip_high=10.0, sequence_mask_low=0.0, kl_tau=0.0)


def load(root: Path, framework: str) -> Reference:
    ns = namespace()
    path = find(root, LOSS)
    definitions(path, ["_safe_mean", "LossOutputs"], ns,
                optional=("compute_importance_ratio_and_mismatch_kl", "_mismatch_kl_from_log_ratio",
                          "_capped_importance_ratio", "default_loss_fn", "ipo_loss_fn", "IPOLoss", "IcePopLoss",
                          "PPOLoss", "CISPOLoss"))
    return Reference(framework, (str(path),), lambda cfg, batch: _gradient(ns, cfg, batch))


def _loss_of(ns: dict, cfg):
    """The per-sample loss for this preset's config, from what the checkout has."""
    if type(cfg).__module__.startswith("seqis.estimators"):
        raise MissingCode("the seed's ablations are seqis's own estimators (prime-rl-legacy exports them)")
    knobs = cfg.as_dict()
    for config, loss in ((IcePopLossConfig, "IcePopLoss"), (PPOLossConfig, "PPOLoss"), (CISPOLossConfig, "CISPOLoss")):
        if isinstance(cfg, config):
            if loss not in ns:
                raise MissingCode(f"this prime-rl has no {loss}")
            return ns[loss](attrs(**knobs)).loss
    if "eps" in knobs:
        # ipo_threshold before #3418; score_centering (off by default) since the ratio cap
        config = attrs(**knobs, ipo_threshold=knobs["eps"], score_centering=False)
        if "IPOLoss" in ns:
            return ns["IPOLoss"](config).loss
        if "ipo_loss_fn" in ns:
            return lambda inputs: ns["ipo_loss_fn"](inputs, config)
        raise MissingCode("this prime-rl has no IPO loss")
    if "default_loss_fn" not in ns:
        raise MissingCode("this prime-rl has no default_loss_fn (removed by #3418)")
    config = attrs(**{**_EXTRA, **knobs})
    return lambda inputs: ns["default_loss_fn"](inputs, config)


def _gradient(ns: dict, cfg, batch: Batch) -> torch.Tensor:
    loss_fn = _loss_of(ns, cfg)
    logp = batch.trainer_logprobs.detach().clone().requires_grad_(True)
    adv = batch.advantages[:, None].expand_as(logp)
    total = logp.sum() * 0.0
    try:
        for b in range(logp.shape[0]):  # prime-rl's loss is per sample; compute_loss sums them
            inputs = attrs(trainer_logprobs=logp[b], inference_logprobs=batch.inference_logprobs[b],
                           teacher_logprobs=None, ref_logprobs=None, advantages=adv[b], loss_mask=batch.loss_mask[b],
                           loss_weights=None, trainer_mask_logprobs=None, inference_mask_logprobs=None)
            total = total + loss_fn(inputs).loss
    except AttributeError as why:  # the checkout's loss reads knobs this preset's era did not have
        raise MissingCode(f"this prime-rl's loss is another era's ({why})") from None
    (grad,) = torch.autograd.grad(total / batch.loss_mask.sum().clamp(min=1), logp)
    return grad
