"""The twelve estimators give what they gave before they became compositions (issue 12), to 1e-6.

tests/data/reference_outputs.npz was written by `scripts/record_reference_outputs.py` on main at 8c601da (the
last commit before the composable correction), on five fixed batches (stored in the file: ragged with -inf
padding, per-token advantages with NaN padding, 32 rollouts with two catastrophic tokens (mis_po's sparse
form), wide log-ratios (scale 3), and a float32 one), with each estimator's defaults and one non-default
config, under every aggregation: loss and gradient per aggregation; weights, masks, metrics and per-rollout
values under token-mean. Every batch keeps |l| < 40, so the old k3 cap at l = 40 changed nothing there.

Metrics and masks that the estimator did not report then must still be there now with the same values;
metrics it reports now and did not then (every composition reports the whole contract) are not compared.
"""

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from seqis import AGGREGATIONS, ESTIMATORS, Batch, run

DATA = np.load(Path(__file__).parent / "data" / "reference_outputs.npz")
KEYS = [k for k in DATA.keys() if "/" in k]
BATCHES = sorted({k.split("/")[0] for k in KEYS})

# the non-default configs the recording used, as scripts/record_reference_outputs.py wrote them
VARIANTS = json.loads(str(DATA["variants"]))


def batch_of(name: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return tuple(torch.from_numpy(DATA[f"{name}/input/{k}"]) for k in
                 ("trainer_logprobs", "inference_logprobs", "advantages", "loss_mask"))


def close(got: torch.Tensor, want: np.ndarray, what: str) -> None:
    want = torch.from_numpy(np.asarray(want)).to(got.dtype) if got.dtype != torch.bool else torch.from_numpy(want)
    if got.dtype == torch.bool:
        assert got.equal(want), what
    else:
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6 * (1 + float(want.abs().max()) if want.numel()
                                                                      else 1), msg=what)


def test_the_recording_covers_every_estimator():
    assert {k.split("/")[1] for k in KEYS if "/input/" not in k} == set(ESTIMATORS)
    assert set(VARIANTS) == set(ESTIMATORS)


@pytest.mark.parametrize("batch_name", BATCHES)
@pytest.mark.parametrize("name", list(ESTIMATORS))
@pytest.mark.parametrize("variant", ["default", "variant"])
def test_outputs_are_unchanged(batch_name, name, variant):
    tl, il, adv, mask = batch_of(batch_name)
    cfg = ESTIMATORS[name].config(**(VARIANTS[name] if variant == "variant" else {}))
    key = f"{batch_name}/{name}/{variant}"
    for agg in AGGREGATIONS:
        t = tl.clone().requires_grad_()
        out = run(name, Batch(t, il, adv, mask), cfg, agg=agg)
        (g,) = torch.autograd.grad(out.loss, t)
        close(out.loss.detach(), DATA[f"{key}/{agg}/loss"], f"{key} {agg} loss")
        close(g, DATA[f"{key}/{agg}/grad"], f"{key} {agg} grad")
        if agg != "token-mean":
            continue
        close(out.weights, DATA[f"{key}/weights"], f"{key} weights")
        masks = [k.rsplit("/", 1)[1] for k in KEYS if k.startswith(f"{key}/mask/")]
        assert set(out.masks) == set(masks), key
        for m in masks:
            close(out.masks[m], DATA[f"{key}/mask/{m}"], f"{key} mask {m}")
        got = out.scalars()
        for k in (k for k in KEYS if k.startswith(f"{key}/metric/")):
            metric = k.rsplit("/", 1)[1]
            assert got[metric] == pytest.approx(float(DATA[k]), rel=1e-6, abs=1e-9), f"{key} {metric}"
            assert math.isfinite(got[metric])
        for k in (k for k in KEYS if k.startswith(f"{key}/rollout/")):
            close(out.rollouts[k.rsplit("/", 1)[1]], DATA[k], k)
