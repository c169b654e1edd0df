"""verl's rollout correction and actor losses, imported from SOURCE_DIR with its heavy imports stubbed.

SOURCE_DIR holds the `verl` package (a checkout's root, or site-packages with `pip install --no-deps verl`). Its
package __init__ files are skipped (each package is a bare module with its path) and the modules the helper and
the loss touch only by name (DataProto, tensordict, transformers, omegaconf, the device helpers) are stubs; the
maths run is verl's: compute_rollout_correction_and_rejection_mask (rollout_corr_helper.py) and
compute_policy_loss_bypass_mode / compute_policy_loss_vanilla (core_algos.py). sys.modules is restored after.

The gradient is the actor loss's at the first minibatch (pi_theta = pi_old = the trainer), token-mean over every
loss token (global_batch_info.batch_num_tokens).
"""

from __future__ import annotations

import importlib
import sys
import types
from contextlib import contextmanager
from pathlib import Path

import torch

from ...core.types import Batch
from . import Reference
from ._load import MissingCode

PACKAGES = ["verl", "verl.utils", "verl.trainer", "verl.trainer.ppo", "verl.trainer.config", "verl.workers",
            "verl.workers.config"]
_OTHERS = ("tensordict", "transformers", "omegaconf")


class _Cfg(dict):
    """verl reads its configs both as attributes and with .get()."""

    def __getattr__(self, key):
        return self[key]


@contextmanager
def stubbed(root: Path):
    """verl's modules (helper, core, algorithm) importable from `root` without their dependencies."""
    if not (root / "verl" / "trainer" / "ppo" / "rollout_corr_helper.py").is_file():
        raise MissingCode(f"{root} holds no verl/trainer/ppo/rollout_corr_helper.py")
    saved = {n: sys.modules.get(n) for n in list(sys.modules) if n.startswith("verl") or n in _OTHERS}

    def module(name, path=None, **attrs):
        m = types.ModuleType(name)
        if path is not None:
            m.__path__ = [str(path)]
        for key, value in attrs.items():
            setattr(m, key, value)
        sys.modules[name] = m

    class DataProto:
        def __init__(self, batch):
            self.batch = batch

        @classmethod
        def from_dict(cls, tensors):
            return cls(dict(tensors))

    try:
        for name in [n for n in sys.modules if n.startswith("verl") or n in _OTHERS]:
            sys.modules.pop(name)
        for name in PACKAGES:  # packages without their __init__ (which would import ray, tensordict, ...)
            module(name, root.joinpath(*name.split(".")))
        module("verl.protocol", DataProto=DataProto)
        module("verl.workers.config.actor", PolicyLossConfig=dict)
        module("verl.utils.device", get_device_name=lambda: "cpu", get_torch_device=lambda: torch.cpu)
        module("verl.utils.import_utils", deprecated=lambda *a, **k: (lambda f: f))
        module("tensordict", TensorDict=dict)
        module("transformers", PreTrainedTokenizer=object)
        module("omegaconf", DictConfig=dict)
        for key in ("as_torch_index", "group_mean_std"):  # names verl.utils's __init__ would have given
            setattr(sys.modules["verl.utils"], key, None)
        try:
            algorithm = importlib.import_module("verl.trainer.config.algorithm")
            sys.modules["verl.trainer.config"].AlgoConfig = algorithm.AlgoConfig
            sys.modules["verl.workers.config"].ActorConfig = object
            helper = importlib.import_module("verl.trainer.ppo.rollout_corr_helper")
            core = importlib.import_module("verl.trainer.ppo.core_algos")
        except ImportError as why:  # a release whose imports moved: say so
            raise MissingCode(f"verl's helper could not be loaded with stubs: {why}") from None
        yield types.SimpleNamespace(helper=helper, core=core, algorithm=algorithm)
    finally:
        for name in [n for n in sys.modules if n.startswith("verl") or n in _OTHERS]:
            sys.modules.pop(name, None)
        sys.modules.update({k: v for k, v in saved.items() if v is not None})


def rollout_correction(cfg) -> dict:
    """A VerlConfig as verl's keys ('lower_upper' strings where verl takes them)."""
    lo, hi = cfg.rollout_is_threshold_lower, cfg.rollout_is_threshold
    rs_lo, rs_hi = cfg.rollout_rs_threshold_lower, cfg.rollout_rs_threshold
    return dict(rollout_is=cfg.rollout_is, rollout_is_threshold=hi if lo is None else f"{lo}_{hi}",
                rollout_is_batch_normalize=cfg.rollout_is_batch_normalize, rollout_rs=cfg.rollout_rs,
                rollout_rs_threshold=rs_hi if rs_lo is None else f"{rs_lo}_{rs_hi}", bypass_mode=cfg.bypass_mode,
                loss_type=cfg.loss_type, clip_ratio_low=cfg.clip_ratio, clip_ratio_high=cfg.clip_ratio,
                clip_ratio_c=cfg.clip_ratio_c)


def gradient(verl, rc: dict, batch: Batch) -> torch.Tensor:
    """d loss / d trainer_logprobs of verl's actor loss for rollout-correction settings `rc` (the keys of
    algorithm.rollout_correction, plus the actor's clip_ratio_low/high/c), at pi_theta = pi_old = the trainer."""
    mask = batch.loss_mask.to(torch.float64)
    adv = batch.advantages[:, None].expand_as(mask)
    log_prob = batch.trainer_logprobs.detach().clone().requires_grad_(True)
    actor = _Cfg(clip_ratio=0.2, clip_ratio_low=rc.get("clip_ratio_low", 0.2),
                 clip_ratio_high=rc.get("clip_ratio_high", 0.2), clip_ratio_c=rc.get("clip_ratio_c", 3.0),
                 global_batch_info=dict(batch_num_tokens=mask.sum()), policy_loss=_Cfg(rollout_correction=_Cfg(rc)))
    if rc["bypass_mode"]:
        loss, _ = verl.core.compute_policy_loss_bypass_mode(batch.inference_logprobs, log_prob, adv, mask,
                                                            "token-mean", actor)
    else:  # decoupled: IS weights and the rejected mask from (pi_old, mu), then PPO on pi_theta / pi_old
        weights, rejected, _ = verl.helper.compute_rollout_correction_and_rejection_mask(
            batch.trainer_logprobs, batch.inference_logprobs, mask, rollout_is=rc["rollout_is"],
            rollout_is_threshold=rc["rollout_is_threshold"],
            rollout_is_batch_normalize=rc["rollout_is_batch_normalize"], rollout_rs=rc["rollout_rs"],
            rollout_rs_threshold=rc["rollout_rs_threshold"])
        w = None if weights is None else weights.batch["rollout_is_weights"]
        loss, _ = verl.core.compute_policy_loss_vanilla(batch.trainer_logprobs, log_prob, adv, rejected, "token-mean",
                                                        actor, rollout_is_weights=w)
    (grad,) = torch.autograd.grad(loss, log_prob)
    return grad


def load(root: Path, framework: str) -> Reference:
    def grad(cfg, batch: Batch) -> torch.Tensor:
        with stubbed(root) as verl:
            return gradient(verl, rollout_correction(cfg), batch)

    with stubbed(root):  # fail now, not per preset, if this is not verl
        pass
    # bypass ppo_clip: verl's +-20 clamp stops the gradient of a token with l < -20; seqis keeps e^-20 * A / N there
    return Reference(framework, (str(root / "verl"),), grad, atol=1e-10)
