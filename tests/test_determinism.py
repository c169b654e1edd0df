"""Same batch, same knobs: two fresh processes give bitwise-identical losses, gradients, weights, masks and
metrics (no choice made by timing at run time, no global state that differs between processes)."""

import subprocess
import sys

import pytest

SCRIPT = r"""
import hashlib, torch
from seqis import ESTIMATORS, Batch, diagnostics, run
from seqis.samplers.scenarios import make_batch

h = hashlib.sha256()
def eat(x):
    if isinstance(x, torch.Tensor):
        h.update(x.detach().contiguous().cpu().numpy().tobytes())
    else:
        h.update(repr(x).encode())

for scenario in ("gaussian", "catastrophic", "precision"):
    batch = make_batch(scenario, seed=3, n_rollouts=64, max_len=512)
    batch = Batch(batch.trainer_logprobs.detach().clone().requires_grad_(), batch.inference_logprobs,
                  batch.advantages, batch.loss_mask)
    eat(sorted(diagnostics(batch).items()))
    for name in ESTIMATORS:
        out = run(name, batch)
        (grad,) = torch.autograd.grad(out.loss, batch.trainer_logprobs)
        for x in (out.loss, grad, out.weights, *(out.masks[k] for k in sorted(out.masks))):
            eat(x)
        for k in sorted(out.metrics):
            eat(out.metrics[k])
print(h.hexdigest())
"""


@pytest.mark.reproducibility
def test_two_fresh_processes_agree_bitwise():
    procs = [subprocess.Popen([sys.executable, "-c", SCRIPT], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]  # side by side: the same work at the same time
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err for _, err in outs]
    first, second = (out.strip() for out, _ in outs)
    assert len(first) == 64 and first == second
