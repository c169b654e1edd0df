"""SkyRL's off-policy correction and policy losses, from skyrl/backends/skyrl_train/utils/.

The loss at the first minibatch: regular PPO's ratio exp(logp - pi_old) is 1 (its clip inactive), so the per-token
loss is -A * ratio, which apply_off_policy_correction multiplies by the TIS weight and masks; dppo and cispo run
their own functions (dppo_policy_loss, compute_policy_loss_cispo) against the rollout's log-probs. Advantages are
pre-divided by the loss tokens' count (loss_reduction token_mean) and reduce_loss sums: token-mean.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ...core.types import Batch
from . import Reference
from ._load import MissingCode, attrs, definitions, find, namespace

UTILS = "skyrl/backends/skyrl_train/utils/"
CORRECTION = ["off_policy_correction_enabled", "compute_tis_ratio", "compute_outlier_token_mask", "compute_token_mask",
              "compute_sequence_mask", "compute_off_policy_correction", "apply_off_policy_correction"]
LOSSES = ["reduce_loss", "rollout_is_policy_loss", "dppo_policy_loss", "compute_policy_loss_cispo"]
_OPC = ("tis_ratio_type", "token_tis_ratio_clip_high", "sequence_tis_ratio_clip_high", "sequence_mask_metric",
        "geo_mask_low", "geo_mask_high", "product_mask_low", "product_mask_high", "outlier_token_is_threshold_low",
        "outlier_token_is_threshold_high", "token_mask_is_threshold_low", "token_mask_is_threshold_high")


def load(root: Path, framework: str) -> Reference:
    ns = namespace(DictConfig=object, AlgorithmConfig=object)
    files = [find(root, UTILS + name) for name in ("torch_utils.py", "off_policy_correction_utils.py",
                                                     "ppo_utils.py")]
    definitions(files[0], ["masked_mean", "safe_exp_delta"], ns)
    definitions(files[1], CORRECTION, ns)
    definitions(files[2], LOSSES[:1], ns, optional=tuple(LOSSES[1:]))
    return Reference(framework, tuple(map(str, files)), lambda cfg, batch: _gradient(ns, cfg, batch), rtol=1e-6,
                     atol=1e-12)


def _gradient(ns: dict, cfg, batch: Batch) -> torch.Tensor:
    mask = batch.loss_mask.to(batch.trainer_logprobs.dtype)
    adv = batch.advantages[:, None] * mask / mask.sum().clamp(min=1)  # token_mean: A / N, summed by reduce_loss
    logp = batch.trainer_logprobs.detach().clone().requires_grad_(True)
    old, rollout = batch.trainer_logprobs.detach(), batch.inference_logprobs
    algo = attrs(off_policy_correction=attrs(**{k: getattr(cfg, k) for k in _OPC}), eps_clip_low=cfg.eps_clip_low,
                 eps_clip_high=cfg.eps_clip_high, dppo=attrs(dppo_type=getattr(cfg, "dppo_type", "binary_tv"),
                                               delta_low=cfg.delta_low, delta_high=cfg.delta_high),
                 cispo=attrs(cispo_eps_clip_low=cfg.cispo_eps_clip_low, cispo_eps_clip_high=cfg.cispo_eps_clip_high,
                             cispo_anchor=cfg.cispo_anchor))
    if cfg.policy_loss_type == "regular":
        per_token = -adv * torch.exp(logp - old)  # PPO at ratio 1
        loss, mask_after, _ = ns["apply_off_policy_correction"](per_token, old, rollout, mask,
                                                                algo.off_policy_correction)
        loss = ns["reduce_loss"](loss, mask_after)
    else:
        fn = {"dppo": "dppo_policy_loss", "cispo": "compute_policy_loss_cispo",
              "rollout_is": "rollout_is_policy_loss"}[cfg.policy_loss_type]
        if fn not in ns or (cfg.policy_loss_type == "cispo" and "cispo_anchor" not in ns[fn].__code__.co_names):
            raise MissingCode(f"this SkyRL has no {fn}" + (" with cispo_anchor" if fn in ns else ""))
        loss, _ = ns[fn](logp, old, adv, algo, loss_mask=mask, rollout_logprobs=rollout)
    (grad,) = torch.autograd.grad(loss, logp)
    return grad
