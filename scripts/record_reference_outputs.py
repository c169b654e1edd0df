"""Record every registry estimator's (or every preset's) outputs on fixed batches into an npz.

Run once on main (8c601da) BEFORE the composable-correction refactor (issue 12), so that test_reference_outputs.py
can prove the twelve estimators are unchanged to 1e-6 afterwards:

    PYTHONPATH=. python scripts/record_reference_outputs.py tests/data/reference_outputs.npz

and on main at b69b2b1 (before the plain evaluator and the fast one above it, issue 21) every preset at its
framework's defaults, so that test_reference_outputs.py can prove them unchanged too:

    PYTHONPATH=. python scripts/record_reference_outputs.py --presets tests/data/reference_outputs_presets.npz

Inputs are stored in the file too (the test does not regenerate them). Every batch keeps |l| < 40, so the
k3 metrics are not affected by the (old) cap at l = 40.
"""

import json
import math
import sys

import numpy as np
import torch

from seqis import AGGREGATIONS, ESTIMATORS, PRESETS, Batch, run

D = torch.float64

# one non-default config per estimator (adv_tau changed too), next to the defaults
VARIANTS = {
    "seq_tis": dict(seq_clip=5.0, adv_tau=0.7),
    "seq_mis": dict(geo_mask_low=0.9, geo_mask_high=1.1, adv_tau=0.7),
    "geo_mask": dict(geo_mask_low=0.8, geo_mask_high=1.5, token_clip=1.5, adv_tau=0.7),
    "mis_po": dict(token_mask_low=0.7, token_mask_high=1.3, geo_mask_low=0.9, geo_mask_high=1.2, adv_tau=0.7),
    "pg": dict(adv_tau=0.7),
    "seq_is": dict(adv_tau=0.7),
    "token_tis": dict(token_clip=1.2, adv_tau=0.7),
    "icepop": dict(token_mask_low=0.8, token_mask_high=1.5, adv_tau=0.7),
    "seq_mis_product": dict(seq_clip=1.5, adv_tau=0.7),
    "geo_is": dict(geo_clip=1.5, adv_tau=0.7),
    "prefix_is": dict(prefix_clip=3.0, adv_tau=0.7),
    "max_mask": dict(token_mask_low=0.8, token_mask_high=1.25, adv_tau=0.7),
}


def make(B, T, *, seed, scale, pad, per_token_adv, catastrophic=0, dtype=D):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, T + 1, (B,), generator=g)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    inference = -torch.rand(B, T, generator=g, dtype=D) * 3
    trainer = inference + scale * torch.randn(B, T, generator=g, dtype=D)
    for k in range(catastrophic):  # a few tokens far out of every band, in a few rollouts
        trainer[(7 * k) % B, k % T] += 5.0 if k % 2 else -5.0
    trainer = torch.where(mask, trainer, torch.tensor(pad, dtype=D))
    inference = torch.where(mask, inference, torch.tensor(math.nan, dtype=D))
    adv = torch.randn(B, T, generator=g, dtype=D) if per_token_adv else torch.randn(B, generator=g, dtype=D)
    return trainer.to(dtype), inference.to(dtype), adv.to(dtype), mask


BATCHES = {
    "ragged": make(8, 12, seed=0, scale=0.3, pad=-math.inf, per_token_adv=False),
    "token_adv": make(8, 12, seed=1, scale=0.05, pad=math.nan, per_token_adv=True),
    "catastrophic": make(32, 16, seed=2, scale=0.01, pad=0.0, per_token_adv=False, catastrophic=2),
    "wide": make(8, 12, seed=3, scale=3.0, pad=-math.inf, per_token_adv=False),
    "float32": make(8, 12, seed=4, scale=0.2, pad=math.nan, per_token_adv=True, dtype=torch.float32),
}


def corrections(presets: bool):
    """(name, variant name, config) of every registry estimator (defaults and VARIANTS) or every preset (its
    framework's defaults)."""
    if presets:
        return [(key, "default", p.config) for key, p in PRESETS.items()]
    return [(name, vname, spec.config(**knobs)) for name, spec in ESTIMATORS.items()
            for vname, knobs in (("default", {}), ("variant", VARIANTS[name]))]


def record(presets: bool = False) -> dict[str, np.ndarray]:
    arrays = {"variants": np.array(json.dumps({} if presets else VARIANTS))}  # the test reads the configs here
    if presets:  # what each key ran: the test compares a key only while its composition is the same
        arrays["compositions"] = np.array(json.dumps({k: repr(p.compose()) for k, p in PRESETS.items()}))
    for bname, (tl, il, adv, mask) in BATCHES.items():
        arrays[f"{bname}/input/trainer_logprobs"] = tl.numpy()
        arrays[f"{bname}/input/inference_logprobs"] = il.numpy()
        arrays[f"{bname}/input/advantages"] = adv.numpy()
        arrays[f"{bname}/input/loss_mask"] = mask.numpy()
        for name, vname, cfg in corrections(presets):
            key = f"{bname}/{name}/{vname}"
            for agg in AGGREGATIONS:
                t = tl.clone().requires_grad_()
                out = run(name, Batch(t, il, adv, mask), cfg, agg=agg)
                (g,) = torch.autograd.grad(out.loss, t)
                arrays[f"{key}/{agg}/loss"] = out.loss.detach().numpy()
                arrays[f"{key}/{agg}/grad"] = g.numpy()
                if agg != "token-mean":
                    continue
                arrays[f"{key}/weights"] = out.weights.numpy()
                for k, m in out.masks.items():
                    arrays[f"{key}/mask/{k}"] = m.numpy()
                for k, v in out.scalars().items():
                    arrays[f"{key}/metric/{k}"] = np.array(v)
                for k, v in out.rollouts.items():
                    arrays[f"{key}/rollout/{k}"] = v.detach().numpy()
    return arrays


if __name__ == "__main__":
    presets = "--presets" in sys.argv[1:]
    path = [a for a in sys.argv[1:] if a != "--presets"][0]
    arrays = record(presets)
    np.savez_compressed(path, **arrays)
    print(f"{len(arrays)} arrays -> {path}")
