"""torchforge's policy losses (src/forge/losses): ReinforceLoss, the one that weighs by the sampler's ratio.

    ReinforceLoss   weight clamp(exp(trainer_log_probs - sampler_log_probs), 0.1, 10), detached, on every target
                    token: loss = sum_t -log pi_t * A_t * w_t * mask_t / max(sum_t mask_t, 1) (token-mean); the
                    bounds are fixed in the code (no knob), and no log-ratio is clamped (exp overflows to inf in
                    fp32 past l = 88.7 and the clamp then gives 10, as seqis does)
    SimpleGRPOLoss  exp(logp - sg(logp)) * A: no sampler weight at all (its KL term, beta 0.1, is to the reference
                    model); the GRPO app (apps/grpo/main.py) uses this one

Source: meta-pytorch/torchforge, src/forge/losses/reinforce_loss.py (ReinforceLoss.forward),
src/forge/losses/grpo_loss.py (SimpleGRPOLoss). Read at 6e77f0b3 (2025-11-15); the open PR #583 would make the
bounds constructor arguments and normalise per sequence (not merged).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.compose import Composition, Weight
from ..core.spec import Preset
from ..core.types import Config, knob
from ._preset import framework_estimator

REINFORCE_BOUNDS = (0.1, 10.0)  # ReinforceLoss.forward's torch.clamp(importance_weights, min=0.1, max=10.0)


@dataclass(frozen=True)
class TorchforgeConfig(Config):
    """Which of torchforge's loss classes runs (neither takes a correction argument)."""

    loss: str = knob("ReinforceLoss", "The loss class.", choices=("ReinforceLoss", "SimpleGRPOLoss"))


def compose(cfg: TorchforgeConfig) -> Composition:
    if cfg.loss == "SimpleGRPOLoss":
        return Composition(Weight("none"), adv_tau=cfg.adv_tau)
    lo, hi = REINFORCE_BOUNDS
    return Composition(Weight("token", clip=hi, clip_low=lo), adv_tau=cfg.adv_tau)


ESTIMATOR = framework_estimator("torchforge", compose, TorchforgeConfig, "torchforge's policy losses.")
SOURCE = "meta-pytorch/torchforge@6e77f0b3: src/forge/losses/reinforce_loss.py (ReinforceLoss)"

SHIPPED_REINFORCE = (  # when the framework shipped it (Preset.versions)
    'since 2025-09-18 (torchforge #175)'
)
SHIPPED_GRPO = (  # when the framework shipped it (Preset.versions)
    'since 2025-09-17 (torchforge #168)'
)

PRESETS = [
    Preset("torchforge/reinforce", "ReinforceLoss: weight clamp(rho_t, 0.1, 10) (fixed bounds, no log-ratio clamp; "
           "token-mean).", SOURCE, ESTIMATOR, TorchforgeConfig(), versions=SHIPPED_REINFORCE),
    Preset("torchforge/grpo", "SimpleGRPOLoss, the GRPO app's loss: no sampler weight (its KL term is to the "
           "reference model).", "meta-pytorch/torchforge@6e77f0b3: src/forge/losses/grpo_loss.py (SimpleGRPOLoss)",
           ESTIMATOR, TorchforgeConfig(loss="SimpleGRPOLoss"), versions=SHIPPED_GRPO),
]
