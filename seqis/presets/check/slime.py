"""slime's corrections, and Miles's (the same code under other paths): --use-tis (vanilla_tis_function,
icepop_function), the MIS example's compute_mis_weights, and OPSM (compute_opsm_mask with compute_policy_loss).

The loss at the first minibatch: compute_policy_loss on ppo_kl = pi_old - logp, pi_old the trainer's (ratio 1) or,
with --use-rollout-logprobs (OPSM's preset), the sampler's (PPO-clip on pi/mu); times the correction's weights;
then slime's sum_of_sample_mean: each rollout's masked sum over its original token count (rejected tokens leave the
numerator only), summed. slime divides that by its global batch size elsewhere; here by the non-empty rollouts,
seqis's seq-mean-token-mean (a constant factor apart when a rollout is empty). Per-sample lists, as slime's
functions take them. Miles's compute_policy_loss exponentiates in float32 (#1363): rtol 1e-6.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ...core.types import Batch
from . import Reference
from ._load import MissingCode, attrs, definitions, find, namespace

PATHS = {  # framework -> (the TIS functions' file, OPSM's and compute_policy_loss's, the MIS example's)
    "slime": ("slime/backends/megatron_utils/loss.py", "slime/utils/ppo_utils.py",
              "examples/train_infer_mismatch_helper/mis.py"),
    "miles": ("miles/backends/training_utils/loss_hub/corrections.py",
              "miles/backends/training_utils/loss_hub/math_utils.py",
              "examples/infra_features/train_infer_mismatch_helper/mis.py")}
MIS = ["masked_sum", "masked_mean", "masked_min", "masked_max", "metrics_append", "calculate_veto_mask", "truncate",
       "clip", "mask", "add_ppl_metrics", "compute_mis_weights"]


def load(root: Path, framework: str) -> Reference:
    ns = namespace(Namespace=object)
    tis, ppo, mis = (find(root, p) for p in PATHS[framework])
    definitions(tis, ["vanilla_tis_function", "icepop_function"], ns)
    definitions(ppo, ["compute_opsm_mask", "compute_policy_loss"], ns,
                optional=("_safe_clamp_log_ratio", "_safe_exp_neg_ppo_kl"))  # Miles's clamp (#1363)
    definitions(mis, MIS, ns)
    for name in ("_LOG_RATIO_EXP_CLAMP",):  # a module constant the clamp reads
        ns.setdefault(name, _constant(ppo, name))
    return Reference(framework, (str(tis), str(ppo), str(mis)), lambda cfg, batch: _gradient(ns, cfg, batch),
                     agg=lambda cfg: "seq-mean-token-mean", rtol=1e-6)


def _constant(path: Path, name: str):
    """A module-level constant `name = <literal>` of the file, or None."""
    import ast

    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            return ast.literal_eval(node.value)
    return None


def _gradient(ns: dict, cfg, batch: Batch) -> torch.Tensor:
    knobs = cfg.as_dict()
    logp = batch.trainer_logprobs.detach().clone().requires_grad_(True)
    mask = batch.loss_mask.to(logp.dtype)
    B = logp.shape[0]
    rows = lambda x: [x[b] for b in range(B)]  # noqa: E731  (slime's per-sample lists)
    adv = batch.advantages[:, None].expand_as(logp)
    trainer, rollout = rows(batch.trainer_logprobs.detach()), rows(batch.inference_logprobs)
    masks = rows(mask)
    opsm = "opsm_delta" in knobs
    old = batch.inference_logprobs if opsm else batch.trainer_logprobs.detach()  # --use-rollout-logprobs
    eps_high = knobs.get("eps_clip_high") or knobs.get("eps_clip", 0.2)
    pg, _ = ns["compute_policy_loss"]((old - logp).flatten(), adv.flatten(), knobs.get("eps_clip", 0.2), eps_high,
                                      eps_clip_c=knobs.get("eps_clip_c"))
    kept = masks
    if opsm:
        args = attrs(opsm_delta=cfg.opsm_delta)
        opsm_mask, _ = ns["compute_opsm_mask"](args, rows(logp.detach()), rows(old), rows(adv), masks)
        pg = pg * opsm_mask
    elif "tis_function" in knobs:
        fn = ns["icepop_function" if cfg.tis_function == "icepop" else "vanilla_tis_function"]
        args = attrs(tis_clip=cfg.tis_clip, tis_clip_low=cfg.tis_clip_low)
        pg, kept, _ = fn(args, pg_loss=pg, train_log_probs=trainer, rollout_log_probs=rollout, loss_masks=masks)
    elif "tis_level" in knobs:
        args = attrs(use_tis=True, **knobs)
        weights, kept, _ = ns["compute_mis_weights"](args, train_log_probs=trainer, rollout_log_probs=rollout,
                                                     loss_masks=masks)
        pg = pg * torch.cat(weights)
    else:
        raise MissingCode(f"no slime correction for {type(cfg).__name__}")
    per_rollout = pg.view(B, -1)
    total = sum((per_rollout[b] * kept[b]).sum() / masks[b].sum().clamp(min=1) for b in range(B))
    (grad,) = torch.autograd.grad(total / (mask.sum(-1) > 0).sum().clamp(min=1), logp)
    return grad
