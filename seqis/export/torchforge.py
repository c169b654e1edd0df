"""A composition as torchforge's loss class: ReinforceLoss (rho_t clamped to [0.1, 10], fixed in its code) or
SimpleGRPOLoss (no sampler weight). Neither takes a correction argument, so anything else is a loss of your own."""

from __future__ import annotations

from ..core.compose import Composition
from ._format import CannotExpress, Settings, adv_tau_note
from ._own import own_settings

HEADER = ["torchforge loss (forge.losses)"]
SUFFIX = "torchforge.py"
REINFORCE_BOUNDS = (0.1, 10.0)  # ReinforceLoss.forward's torch.clamp(importance_weights, min=0.1, max=10.0)
_MODULE = {"ReinforceLoss": "reinforce_loss", "SimpleGRPOLoss": "grpo_loss"}


def settings(comp: Composition) -> Settings:
    w, notes = comp.weight, []
    if comp.penalty is not None:
        raise CannotExpress("torchforge's KL term (SimpleGRPOLoss's beta) is to a reference model, not the sampler")
    no = ("torchforge's losses weigh by clamp(rho_t, 0.1, 10) (ReinforceLoss) or not at all (SimpleGRPOLoss), with "
          "no knob: write a loss of your own for this")
    if comp.criteria or w.band is not None or w.self_normalize:
        raise CannotExpress(no)
    if w.level == "none":
        loss = "SimpleGRPOLoss"
    elif w.level == "token" and (w.clip_low, w.upper) == REINFORCE_BOUNDS:
        loss = "ReinforceLoss"
        if comp.log_ratio_clamp is not None:
            notes.append(f"ReinforceLoss clamps no log-ratio (this correction: +-{comp.log_ratio_clamp})")
    else:
        raise CannotExpress(no)
    adv_tau_note(comp.adv_tau, notes)
    return Settings({"loss": loss}, notes)


def write(s: Settings) -> list[str]:
    loss = s.keys["loss"]
    return [f"from forge.losses.{_MODULE[loss]} import {loss}", f"loss_fn = {loss}()"]


def own_key(name: str, cfg=None) -> str:
    """TorchforgeConfig's one knob, the loss class, is what the snippet builds as loss_fn."""
    return "loss_fn" if name == "loss" else name


def own(cfg) -> Settings:
    return own_settings(cfg, lambda name: name)  # write() imports and builds keys["loss"]
