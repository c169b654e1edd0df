"""TRL's GRPOTrainer (trl/trainer/grpo_trainer.py): its vLLM IS ratio, OPSM and VESPO, from TRL's own code.

The IS ratio is computed inline in _generate_and_score_completions: the `if self.use_vllm and
self.vllm_importance_sampling_correction:` block runs here as it is, with the trainer's log-probs as pi_old and the
sampler's. At the first minibatch coef_1 = exp(logp - pi_old) = 1, so the default loss ("dapo": per-token loss
summed over the batch's completion tokens and divided by their number, token-mean) has the gradient
-A * IS ratio * OPSM mask / N (get_off_policy_mask); VESPO's is -A * phi / N (get_gamma_weights).
"""

from __future__ import annotations

from pathlib import Path

import torch

from ...core.types import Batch
from . import Reference
from ._load import MissingCode, attrs, block, definitions, find, namespace

TRAINER = "trl/trainer/grpo_trainer.py"
IS_BLOCK = "self.use_vllm and self.vllm_importance_sampling_correction"


def load(root: Path, framework: str) -> Reference:
    ns = namespace()
    path = find(root, TRAINER)
    definitions(path, ["GRPOTrainer.get_off_policy_mask"], ns, optional=("GRPOTrainer.get_gamma_weights",))
    return Reference(framework, (str(path),), lambda cfg, batch: _gradient(ns, path, cfg, batch))


def _is_ratio(ns: dict, path: Path, cfg, batch: Batch) -> torch.Tensor:
    trainer = attrs(use_vllm=True, vllm_importance_sampling_correction=cfg.vllm_importance_sampling_correction,
                    vllm_importance_sampling_mode=cfg.vllm_importance_sampling_mode,
                    vllm_importance_sampling_clip_min=cfg.vllm_importance_sampling_clip_min,
                    vllm_importance_sampling_clip_max=cfg.vllm_importance_sampling_clip_max)
    mask = batch.loss_mask.to(batch.trainer_logprobs.dtype)
    local = dict(self=trainer, completion_mask=mask, tool_mask=None, old_per_token_logps=batch.trainer_logprobs,
                 sampling_per_token_logps=batch.inference_logprobs)
    return block(path, "GRPOTrainer._generate_and_score_completions", IS_BLOCK, ns, local)[
        "vllm_importance_sampling_ratio"]


def _gradient(ns: dict, path: Path, cfg, batch: Batch) -> torch.Tensor:
    mask = batch.loss_mask.to(batch.trainer_logprobs.dtype)
    adv = batch.advantages[:, None]  # (B, 1), as TRL's advantages.unsqueeze(1)
    coef = _is_ratio(ns, path, cfg, batch) if cfg.vllm_importance_sampling_correction else torch.ones_like(mask)
    if getattr(cfg, "loss_type", "dapo") == "vespo":
        if "get_gamma_weights" not in ns:
            raise MissingCode("this TRL has no VESPO (get_gamma_weights)")
        coef = ns["get_gamma_weights"](adv, torch.zeros_like(mask), mask, coef, cfg.vespo_k_pos, cfg.vespo_lambda_pos,
                                       cfg.vespo_k_neg, cfg.vespo_lambda_neg)
    if cfg.off_policy_mask_threshold is not None:
        logp = batch.trainer_logprobs
        keep = ns["get_off_policy_mask"](adv, logp, batch.inference_logprobs, mask, cfg.off_policy_mask_threshold)
        coef = coef * keep
    return -(coef * adv * mask) / mask.sum().clamp(min=1)
