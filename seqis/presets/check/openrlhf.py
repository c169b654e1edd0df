"""OpenRLHF's PolicyLoss (openrlhf/models/loss.py), either flag set: is_correction_level / _mode / _gating
(0.11, #1339) or the former enable_vllm_is_correction / vllm_is_correction_type.

The loss at the first minibatch: old_log_probs is the trainer's (PPO's ratio 1), rollout_log_probs the sampler's;
token-mean (masked sum / every loss token), except GSPO's per-rollout mean (seq-mean-token-mean), whose divisor
is the rollout's token count + 1e-8 (aggregate_loss): a relative 1e-8 / T, hence rtol 1e-7.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import torch

from ...core.types import Batch
from . import Reference
from ._load import definitions, find, namespace

_FORMER = {("token", "clip"): "tis", ("token", "mask"): "icepop", ("seq", "mask"): "seq-mask-tis"}


def load(root: Path, framework: str) -> Reference:
    ns = namespace()
    utils, loss = find(root, "openrlhf/models/utils.py"), find(root, "openrlhf/models/loss.py")
    definitions(utils, ["masked_mean"], ns)
    definitions(loss, ["aggregate_loss", "PolicyLoss"], ns)
    return Reference(framework, (str(utils), str(loss)), lambda cfg, batch: _gradient(ns, cfg, batch),
                     agg=lambda cfg: "seq-mean-token-mean" if cfg.policy_loss_type == "gspo" else "token-mean",
                     rtol=1e-7)


def _policy_loss(ns: dict, cfg):
    cls = ns["PolicyLoss"]
    common = dict(clip_eps_low=cfg.eps_clip_low, clip_eps_high=cfg.eps_clip_high, dual_clip=cfg.dual_clip,
                  policy_loss_type=cfg.policy_loss_type)
    threshold = [cfg.is_correction_threshold_low, cfg.is_correction_threshold_high]
    if "is_correction_level" in inspect.signature(cls.__init__).parameters:
        return cls(**common, is_correction_level=cfg.is_correction_level, is_correction_mode=cfg.is_correction_mode,
                   is_correction_gating="ratio", is_correction_threshold=threshold)
    on = cfg.is_correction_level != "off"
    kind = _FORMER.get((cfg.is_correction_level, cfg.is_correction_mode), "tis")
    return cls(**common, enable_vllm_is_correction=on, vllm_is_truncated_threshold=threshold if on else None,
               vllm_is_correction_type=kind)


def _gradient(ns: dict, cfg, batch: Batch) -> torch.Tensor:
    mask = batch.loss_mask.to(batch.trainer_logprobs.dtype)
    adv = batch.advantages[:, None].expand_as(mask)
    logp = batch.trainer_logprobs.detach().clone().requires_grad_(True)
    out = _policy_loss(ns, cfg)(logp, batch.trainer_logprobs.detach(), adv, action_mask=mask,
                                rollout_log_probs=batch.inference_logprobs)
    (grad,) = torch.autograd.grad(out[0], logp)
    return grad
