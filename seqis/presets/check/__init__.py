"""The maintainer's check: each preset against its framework's own code, on random ragged batches.

    python -m seqis.presets check skyrl ~/src/SkyRL          # a checkout, or a wheel unzipped
    rows = check("skyrl", "~/src/SkyRL")                       # the same as data: one Row per (preset, batch)

Each framework's module here loads the functions its presets reproduce from SOURCE_DIR (_load.py: no package
import, heavy dependencies never touched) and computes, with them, the gradient of the framework's loss in the
trainer's log-probs at the first minibatch (pi_theta = pi_old: PPO's own ratio is 1), normalised the way the
framework normalises (its `agg`). The check runs the preset in seqis on the same batch and compares. A preset whose
code is not in the checkout (another version of the framework) is reported as such, not failed.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from ...core.types import Batch, Config
from ...evaluators.plain import evaluate
from .. import PRESETS, presets_of
from ._load import MissingCode

# framework -> its module here (frameworks without one are checked by hand-computed cases in the tests)
CHECKED = {"verl": "verl", "skyrl": "skyrl", "openrlhf": "openrlhf", "areal": "areal", "trl": "trl",
           "prime-rl": "prime_rl", "slime": "slime", "miles": "slime"}


@dataclass(frozen=True)
class Reference:
    """A framework's own code, loaded: gradient(cfg, batch) -> (B, T) d loss / d trainer_logprobs, or raises
    MissingCode when this checkout lacks what that preset runs; agg(cfg): its normalisation, as seqis's agg."""

    framework: str
    files: tuple[str, ...]  # what was read
    gradient: Callable[[Config, Batch], torch.Tensor]
    agg: Callable[[Config], str] = lambda cfg: "token-mean"
    rtol: float = 1e-9  # float32 arithmetic inside the framework (SkyRL's exp) needs more
    atol: float = 1e-12


@dataclass(frozen=True)
class Row:
    key: str
    seed: int
    status: str  # "ok", "differs", "not in this checkout"
    max_abs_diff: float  # nan unless compared
    detail: str = ""


def ragged_batch(seed: int, B: int = 12, T: int = 16) -> Batch:
    """Float64 rollouts of lengths 0..T (one empty), per-rollout log-ratio scales from 0.01 to 1.5 so that bands
    at every preset's defaults both keep and drop, a token at l = +25 and one at -30 (beyond the +-20 clamps),
    advantages of both signs and some exactly 0. Log-probs stay <= 0 (probabilities in (0, 1]); padding holds
    finite junk, which frameworks that multiply by the mask need."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[0] = 0
    mask = torch.arange(T)[None, :] < lengths[:, None]
    scale = torch.tensor([0.01, 0.05, 0.1, 0.3, 0.6, 1.5], dtype=torch.float64)[torch.arange(B) % 6][:, None]
    drift = torch.randn(B, 1, generator=g, dtype=torch.float64) * scale / 4
    l = drift + torch.randn(B, T, generator=g, dtype=torch.float64) * scale
    inference = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3 - 0.05
    l[2, 0], inference[2, 0] = 25.0, -30.0  # trainer -5
    l[3, 1], inference[3, 1] = -30.0, -1.0
    trainer = inference + l
    over = trainer > 0  # keep pi <= 1: move both down, l unchanged
    inference = torch.where(over, inference - trainer - 0.01, inference)
    trainer = inference + l
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    adv[1::5] = 0.0
    return Batch(trainer_logprobs=trainer, inference_logprobs=inference, advantages=adv, loss_mask=mask)


def seqis_gradient(key: str, batch: Batch, cfg: Config | None, agg: str) -> torch.Tensor:
    """The preset's gradient by the plain evaluator (the definition; the registry's fast one is held to it)."""
    b = Batch(trainer_logprobs=batch.trainer_logprobs.detach().clone().requires_grad_(True),
              inference_logprobs=batch.inference_logprobs, advantages=batch.advantages, loss_mask=batch.loss_mask)
    evaluate(PRESETS[key].compose(cfg), b, agg).loss.backward()
    return b.trainer_logprobs.grad


def load(framework: str, source: str | Path) -> Reference:
    if framework not in CHECKED:
        raise ValueError(f"no check for {framework!r}: one of {', '.join(CHECKED)} (the others are checked by "
                         "hand-computed cases in tests/test_presets*.py)")
    module = importlib.import_module(f".{CHECKED[framework]}", __name__)
    return module.load(Path(source).expanduser(), framework)


def check(framework: str, source: str | Path, *, seeds: int = 3, keys: list[str] | None = None) -> list[Row]:
    """Every preset of `framework` (or `keys`) against the framework's code under `source`, one Row per batch."""
    ref = load(framework, source)
    rows = []
    for key, preset in presets_of(framework).items():
        if keys is not None and key not in keys:
            continue
        if preset.compose(preset.config).centering is not None:  # score centering: no checked wheel has it yet
            rows.append(Row(key, 0, "not in this checkout", math.nan, "score centering reads the sampler's head, "
                            "which no wheel checked here computes (tests/test_score_centering_presets.py holds it to "
                            "its framework's formula)"))
            continue
        for seed in range(seeds):
            batch = ragged_batch(seed)
            try:
                theirs = ref.gradient(preset.config, batch)
            except MissingCode as why:
                rows.append(Row(key, seed, "not in this checkout", math.nan, str(why)))
                break
            ours = seqis_gradient(key, batch, None, ref.agg(preset.config))
            diff = (ours - theirs.to(ours.dtype)).abs()
            tol = ref.atol + ref.rtol * theirs.abs().to(ours.dtype)
            bad = ~(diff <= tol)  # NaN in theirs counts as a difference
            worst = float(diff.nan_to_num(math.inf).max()) if diff.numel() else 0.0
            detail = ""
            if bad.any():
                r, t = (int(i) for i in bad.nonzero()[0])
                detail = (f"first at rollout {r}, token {t}: seqis {float(ours[r, t]):.6g}, "
                          f"theirs {float(theirs[r, t]):.6g}")
            rows.append(Row(key, seed, "differs" if bad.any() else "ok", worst, detail))
    return rows


def report(rows: list[Row]) -> str:
    lines = [f"{'preset':34} {'seed':>4}  {'status':22} {'max |diff|':>10}"]
    for r in rows:
        diff = "" if math.isnan(r.max_abs_diff) else f"{r.max_abs_diff:10.2e}"
        lines.append(f"{r.key:34} {r.seed:>4}  {r.status:22} {diff:>10}  {r.detail}")
    return "\n".join(lines)


__all__ = ["CHECKED", "MissingCode", "Reference", "Row", "check", "load", "ragged_batch", "report"]
