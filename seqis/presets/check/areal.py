"""AReaL's ppo_actor_loss_fn and apply_rejection_sampling (areal/utils/functional/functional.py).

The loss at the first minibatch, as grpo_loss_fn calls it: with use_decoupled_loss, proximal_logprobs is the
recomputed trainer (PPO's ratio 1) and old_logprobs the sampler's, so the behaviour weight is the correction;
without it (AReaL's default) both are the sampler's and PPO clips pi/mu. The rejection block is passed as an
attribute record: AReaL's RejectionSamplingConfig.__post_init__ (which also sets lower = 0 for clamp, done here
too) is not run. One micro-batch: the engine's loss_weight_fn scale is 1; the loss divides by the loss tokens.
The behaviour weight is exp of an l upcast to float32 (apply_rejection_sampling), hence rtol 1e-6.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ...core.types import Batch
from . import Reference
from ._load import MissingCode, attrs, definitions, find, namespace


def load(root: Path, framework: str) -> Reference:
    ns = namespace(RejectionSamplingConfig=object)
    data, functional = find(root, "areal/utils/data.py"), find(root, "areal/utils/functional/functional.py")
    actor = find(root, "areal/trainer/ppo/actor.py")
    definitions(data, ["KLEstimator"], ns)
    definitions(actor, [], ns, optional=("_apply_m2po_masking", "_get_m2po_loss_mask"))  # M2PO (#480)
    definitions(functional, ["_compute_sequence_level_ratio_and_advantages", "RejectionSamplingResult",
                             "_check_bounds", "apply_rejection_sampling", "ppo_actor_loss_fn"], ns,
                optional=("compute_binary_kl_divergence",))
    return Reference(framework, (str(data), str(functional), str(actor)), lambda cfg, batch: _gradient(ns, cfg, batch),
                     rtol=1e-6)


def _gradient(ns: dict, cfg, batch: Batch) -> torch.Tensor:
    mask = batch.loss_mask
    adv = batch.advantages[:, None].expand_as(batch.trainer_logprobs)
    logp = batch.trainer_logprobs.detach().clone().requires_grad_(True)
    mu = batch.inference_logprobs
    proximal = batch.trainer_logprobs.detach() if cfg.use_decoupled_loss else mu
    m2 = getattr(cfg, "m2_threshold", None)
    if m2 is not None:  # grpo_loss_fn narrows the loss mask first; ppo_actor_loss_fn then divides by what is left
        if "_apply_m2po_masking" not in ns:
            raise MissingCode("this AReaL has no M2PO (_apply_m2po_masking)")
        mask = ns["_apply_m2po_masking"](mu, proximal, mask, m2)
    rs = None
    if cfg.rejection_sampling and cfg.metric == "binary_kl" and "compute_binary_kl_divergence" not in ns:
        raise MissingCode("this AReaL has no binary_kl metric (KPop, #1405)")
    if cfg.rejection_sampling:
        lower = 0.0 if cfg.action == "clamp" and cfg.lower is None else cfg.lower
        rs = attrs(level=cfg.level, action=cfg.action, metric=cfg.metric, agg=cfg.agg, upper=cfg.upper, lower=lower)
    loss, _ = ns["ppo_actor_loss_fn"](logprobs=logp, proximal_logprobs=proximal, old_logprobs=mu, advantages=adv,
                                      eps_clip=cfg.eps_clip, loss_mask=mask, eps_clip_higher=cfg.eps_clip_higher,
                                      c_clip=cfg.c_clip, rejection_sampling=rs)
    (grad,) = torch.autograd.grad(loss, logp)
    return grad
