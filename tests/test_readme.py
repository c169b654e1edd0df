"""The README's ten-line example runs, and does what its comments say."""

import re
from pathlib import Path

import torch


def test_readme_example_runs():
    text = (Path(__file__).parent.parent / "README.md").read_text()
    block = re.search(r"## The library in ten lines\s+```python\n(.*?)```", text, flags=re.S).group(1)
    scope: dict = {}
    exec(compile(block, "README.md", "exec"), scope)
    out, batch, trainer = scope["out"], scope["batch"], scope["trainer"]
    N = batch.loss_mask.sum()
    torch.testing.assert_close(trainer.grad, -out.weights * batch.advantages[:, None] / N)
    assert set(scope["many"]) == {"seq_tis", "seq_mis", "geo_mask", "mis_po"}
