"""ms-swift's and ART's presets against those frameworks' own code, on random ragged batches.

Both are installed without their dependencies by `make venv` (ms-swift==4.6.0; openpipe-art==0.5.23, whose
metadata asks for Python 3.12 while art/loss.py runs on 3.10+); a test skips, saying so, where one is missing.

- ms-swift: its GRPOTrainer methods `_apply_rollout_importance_sampling`, `_compute_sequence_level_ratios` and
  `_compute_off_policy_sequence_mask` are compiled from the installed swift/rlhf_trainers/grpo_trainer.py as they
  are (the module imports transformers, trl, accelerate, ...: only these three functions are taken, by name) and
  called on a stand-in `self` holding the trainer's arguments. The weight ms-swift multiplies into the per-token
  loss (times completion_mask, after OPSM) is the gradient coefficient seqis calls `weights`.
- ART: art/loss.py is imported from the installed package with its package __init__ skipped and two imports
  stubbed (pydantic's BaseModel as a plain attribute holder, art.dev's TrainConfig); its `loss_fn` runs, and the
  gradient of its policy loss in the trainer's log-probs is compared with seqis's under token-mean.

At the first minibatch (pi_theta = pi_old) the comparison is the whole correction. Batches hold empty rollouts,
zero advantages, and tokens at the +-20 clamp with both signs.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import math
import sys
import types
from pathlib import Path

import pytest
import torch

from seqis import PRESETS, Batch, run

SWIFT_METHODS = ("_apply_rollout_importance_sampling", "_compute_sequence_level_ratios",
                 "_compute_off_policy_sequence_mask")


def ragged_batch(seed: int, B: int = 9, T: int = 12, scale: float = 0.3, wild: bool = True,
                 dtype=torch.float64) -> Batch:
    """Ragged rollouts (row 0 empty), l ~ N(drift, scale^2), advantages of both signs with a zero; `wild` puts
    tokens at l = +25 and -20 in one rollout (its clamped mean is 0) and l = -30 in another; a token sits on
    ratio 2 exactly (ms-swift's default threshold, kept by its <=)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[0], lengths[1], lengths[2] = 0, 2, max(int(lengths[2]), 3)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    mu = -torch.rand(B, T, generator=g, dtype=torch.float64) * 2 - 0.05
    l = torch.randn(B, 1, generator=g, dtype=torch.float64) * scale + torch.randn(B, T, generator=g,
                                                                                  dtype=torch.float64) * scale
    if wild:
        l[1, :2] = torch.tensor([25.0, -20.0], dtype=torch.float64)
        l[2, 1] = -30.0
    l[3, 0], mu[3, 0] = math.log(2.0), -0.5  # (-0.5 + log 2) - (-0.5) is log 2 to the last bit
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    adv[4] = 0.0
    return Batch(trainer_logprobs=(mu + l).to(dtype), inference_logprobs=mu.to(dtype), advantages=adv.to(dtype),
                 loss_mask=mask)


def seqis_weights_and_grad(key: str, batch: Batch, cfg=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    b = Batch(trainer_logprobs=batch.trainer_logprobs.detach().clone().requires_grad_(True),
              inference_logprobs=batch.inference_logprobs, advantages=batch.advantages, loss_mask=batch.loss_mask)
    out = run(key, b, cfg)
    out.loss.backward()
    return out.weights, out.masks["kept"], b.trainer_logprobs.grad


# ---------------------------------------------------------------------------------------------------------
# ms-swift


@pytest.fixture(scope="module")
def swift():
    """ms-swift's three correction methods, compiled from the installed grpo_trainer.py with torch in scope."""
    spec = importlib.util.find_spec("swift")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("ms-swift is not installed (pip install --no-deps ms-swift==4.6.0; make venv does it)")
    path = Path(spec.submodule_search_locations[0]) / "rlhf_trainers" / "grpo_trainer.py"
    tree = ast.parse(path.read_text())
    trainer = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "GRPOTrainer"), None)
    found = [] if trainer is None else [n for n in trainer.body if isinstance(n, ast.FunctionDef)
                                        and n.name in SWIFT_METHODS]
    if len(found) != len(SWIFT_METHODS):
        pytest.skip(f"this ms-swift's GRPOTrainer lacks {set(SWIFT_METHODS) - {n.name for n in found}}")
    namespace = {"torch": torch}
    exec(compile(ast.Module(body=found, type_ignores=[]), str(path), "exec"), namespace)
    return namespace


def swift_coefficient(swift, cfg, batch: Batch) -> torch.Tensor:
    """(B, T) what ms-swift multiplies into each token's loss: the rollout IS weight (rollout_log_ratio =
    old - rollout logps, old = the trainer at the first minibatch) times completion_mask after OPSM."""
    self = types.SimpleNamespace(rollout_importance_sampling_mode=cfg.rollout_importance_sampling_mode,
                                 rollout_importance_sampling_threshold=cfg.rollout_importance_sampling_threshold,
                                 off_policy_sequence_mask_delta=cfg.off_policy_sequence_mask_delta)
    for name in SWIFT_METHODS:
        setattr(self, name, types.MethodType(swift[name], self))
    mask = batch.loss_mask
    trainer, sampler = batch.trainer_logprobs.detach(), batch.inference_logprobs
    weights = torch.ones_like(trainer)
    if cfg.rollout_importance_sampling_mode is not None:
        weights = self._apply_rollout_importance_sampling(trainer - sampler, mask)
    if cfg.off_policy_sequence_mask_delta is not None:
        mask = mask & self._compute_off_policy_sequence_mask(trainer, sampler, mask, batch.advantages)[:, None]
    return weights * mask


SWIFT_CASES = [*(k for k in PRESETS if k.startswith("ms-swift/")), "opsm", "opsm_token_mask"]


def swift_case(case: str):
    if case.startswith("ms-swift/"):
        return case, PRESETS[case].config
    mode = "token_mask" if case == "opsm_token_mask" else None
    return "ms-swift/token_mask", PRESETS["ms-swift/token_mask"].config.replace(
        rollout_importance_sampling_mode=mode, off_policy_sequence_mask_delta=0.1)


@pytest.mark.parametrize("case", SWIFT_CASES)
@pytest.mark.parametrize("seed", [0, 1])
def test_ms_swift_presets_weigh_as_ms_swift_does(swift, case, seed):
    key, cfg = swift_case(case)
    batch = ragged_batch(seed)  # tokens at +25 and -20 in one rollout: each clamped at 20 before the mean
    want = swift_coefficient(swift, cfg, batch)
    weights, kept, grad = seqis_weights_and_grad(key, batch, cfg)
    torch.testing.assert_close(weights.to(torch.float64), want, rtol=1e-12, atol=0.0)
    dropped = batch.loss_mask & (want == 0)
    assert torch.equal(kept, batch.loss_mask & ~dropped)
    # the gradient under token-mean is -weights * A / N, every loss token in N
    n = batch.loss_mask.sum()
    torch.testing.assert_close(grad, -want * batch.advantages[:, None] / n, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("key", ["ms-swift/token_truncate", "ms-swift/sequence_mask"])
def test_ms_swift_in_float32(swift, key):
    batch = ragged_batch(3, dtype=torch.float32)
    want = swift_coefficient(swift, PRESETS[key].config, batch)
    weights, _, _ = seqis_weights_and_grad(key, batch)
    torch.testing.assert_close(weights.to(torch.float32), want, rtol=2e-6, atol=1e-7)


def test_ms_swift_sequence_truncate_clamps_each_token_before_the_mean(swift):
    # l = (+25, -20): ms-swift's mean of the clamped l is 0 -> weight min(1, 2) = 1; the composition's clamped
    # mean of the raw l is 2.5 -> min(e^2.5, 2) = 2
    batch = ragged_batch(0, wild=True)
    want = swift_coefficient(swift, PRESETS["ms-swift/sequence_truncate"].config, batch)
    assert want[1, :2].tolist() == [1.0, 1.0]
    weights, _, _ = seqis_weights_and_grad("ms-swift/sequence_truncate", batch)
    torch.testing.assert_close(weights.to(torch.float64), want)


def test_ms_swift_decides_an_edge_in_ratio_space(swift):
    # l one ulp above log 2: exp(l) rounds to 2.0, so ms-swift's token_mask keeps the token (2.0 <= 2)
    batch = ragged_batch(0)
    batch.trainer_logprobs[3, 0] = batch.inference_logprobs[3, 0] + math.nextafter(math.log(2.0), 1.0)
    want = swift_coefficient(swift, PRESETS["ms-swift/token_mask"].config, batch)
    assert want[3, 0] == 2.0
    weights, _, _ = seqis_weights_and_grad("ms-swift/token_mask", batch)
    assert weights[3, 0] == 2.0


# ---------------------------------------------------------------------------------------------------------
# ART


class _Model:
    """pydantic.BaseModel as art/loss.py uses it: keyword fields kept as attributes."""

    model_config: dict = {}

    def __init__(self, **fields):
        self.__dict__.update(fields)


@pytest.fixture(scope="module")
def art_loss():
    """The installed art/loss.py, imported with art's package __init__ skipped and pydantic / art.dev stubbed;
    sys.modules is restored afterwards."""
    spec = importlib.util.find_spec("art")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("openpipe-art is not installed (pip install --no-deps --ignore-requires-python "
                    "openpipe-art==0.5.23; make venv does it)")
    root = spec.submodule_search_locations[0]
    names = ("art", "art.dev", "art.utils", "art.utils.group_aggregate", "art.loss", "pydantic")
    saved = {name: sys.modules.get(name) for name in names}

    def module(name, path=None, **attrs):
        m = types.ModuleType(name)
        if path is not None:
            m.__path__ = [path]
        m.__dict__.update(attrs)
        sys.modules[name] = m

    try:
        module("pydantic", BaseModel=_Model, ConfigDict=dict)
        module("art", root)
        module("art.utils", f"{root}/utils")
        module("art.dev", TrainConfig=dict)
        sys.modules["art"].dev = sys.modules["art.dev"]
        loss = importlib.import_module("art.loss")
        if not hasattr(loss, "LossInputs"):
            pytest.skip("this ART's loss_fn predates LossInputs (0.5.23's interface)")
        yield loss
    finally:
        for name in names:
            sys.modules.pop(name, None)
        sys.modules.update({k: v for k, v in saved.items() if v is not None})


def art_gradient(art_loss, config: dict, batch: Batch) -> torch.Tensor:
    """d policy_loss / d trainer_logprobs of ART's loss_fn; the trajectories' logprobs are the sampler's. ART
    aligns its inputs by shifting them one position left (shift_tensor), so they get a leading column."""
    B, T = batch.loss_mask.shape

    def shifted(x: torch.Tensor) -> torch.Tensor:  # (B, T) -> (B, T + 1), read back as (B, T) + a pad column
        return torch.cat([torch.zeros_like(x[:, :1]), x], dim=1)

    new = torch.cat([batch.trainer_logprobs.detach(), torch.zeros(B, 1, dtype=batch.trainer_logprobs.dtype)], 1)
    new.requires_grad_(True)
    groups = torch.arange(1, B + 1)[:, None].expand(B, T)
    inputs = dict(assistant_mask=shifted(batch.loss_mask), logprobs=shifted(batch.inference_logprobs),
                  advantages=shifted(batch.advantages[:, None].expand(B, T).to(new.dtype)),
                  weights=shifted(torch.ones(B, T, dtype=new.dtype)), group_ids=shifted(groups))
    out = art_loss.loss_fn(art_loss.LossInputs(inputs=inputs), new, None, None, config)
    (grad,) = torch.autograd.grad(out.policy_loss, new)
    return grad[:, :T]


def art_config(cfg) -> dict:
    """An ArtConfig as ART's experimental config dict (None fields left out: ART's defaults)."""
    return {k: v for k, v in cfg.as_dict().items() if k != "adv_tau" and v is not None}


ART_CASES = {
    "default": PRESETS["art/default"].config,
    "ppo": PRESETS["art/ppo"].config,
    "cispo_sequence": PRESETS["art/default"].config.replace(importance_sampling_level="sequence"),
    "cispo_capped": PRESETS["art/default"].config.replace(max_negative_advantage_importance_sampling_weight=2.0,
                                                          epsilon=0.5),
    "ppo_capped": PRESETS["art/ppo"].config.replace(max_negative_advantage_importance_sampling_weight=1.1,
                                                    epsilon_high=0.3),
}


@pytest.mark.parametrize("case", list(ART_CASES))
@pytest.mark.parametrize("seed", [0, 1])
def test_art_presets_give_arts_gradient(art_loss, case, seed):
    cfg = ART_CASES[case]
    key = "art/ppo" if cfg.ppo else "art/default"
    # PPO: a token beyond ART's +-20 clamp gets no gradient through the clamp (pinned below); CISPO's weight is
    # detached, so the clamp only bounds it and the wild tokens stay
    batch = ragged_batch(seed, wild=not cfg.ppo)
    want = art_gradient(art_loss, art_config(cfg), batch)
    _, _, grad = seqis_weights_and_grad(key, batch, cfg)
    # the sequence ratio's mean divides by T + 1e-8 (group_aggregate's eps): a relative 1e-8 / T in its exponent
    rtol = 1e-7 if cfg.importance_sampling_level == "sequence" else 1e-12
    torch.testing.assert_close(grad, want, rtol=rtol, atol=1e-15)


def test_art_ppo_gives_no_gradient_beyond_its_clamp(art_loss):
    """ART's PPO clamps l at +-20 before exp: a token with l = 25 and A < 0 (the unclipped side) gets zero
    gradient there, where seqis weighs it e^20 (the preset's summary says so)."""
    batch = ragged_batch(0, wild=True)
    batch.advantages[1] = -1.0
    want = art_gradient(art_loss, art_config(PRESETS["art/ppo"].config), batch)
    weights, _, _ = seqis_weights_and_grad("art/ppo", batch)
    assert want[1, 0] == 0.0 and weights[1, 0] == pytest.approx(math.exp(20.0))
