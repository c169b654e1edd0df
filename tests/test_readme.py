"""The README's ten-line example runs, and does what its comments say."""

import re
from pathlib import Path

import pytest
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


@pytest.mark.slow  # make test runs it; the fast suite stays under two minutes
def test_a_folder_named_seqis_beside_the_script_shadows_the_package_as_the_readme_says(tmp_path):
    """From a clone's parent folder `import seqis` finds the clone (no __init__.py: a namespace package), so no
    code of the package can run to explain it; the README says so, and `python -P` (the current folder off
    sys.path) or the repository's own folder import the package."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    (tmp_path / "seqis" / "seqis").mkdir(parents=True)  # a clone named seqis, as its parent folder sees it
    code = "from seqis import Batch; print(Batch.__module__)"
    shadowed = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    if shadowed.returncode == 0:  # installed as a regular package (pip install .): site-packages wins
        assert shadowed.stdout.strip() == "seqis.core.types"
    else:
        message = "cannot import name 'Batch' from 'seqis' (unknown location)"
        assert message in shadowed.stderr and message in (root / "README.md").read_text()
    for cwd, flags in ((tmp_path, ["-P"]), (root, [])):
        res = subprocess.run([sys.executable, *flags, "-c", code], cwd=cwd, capture_output=True, text=True,
                             timeout=120)
        assert res.returncode == 0 and res.stdout.strip() == "seqis.core.types", res.stderr
