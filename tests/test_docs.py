"""The docs' recipes run as written: the estimator that docs/add-an-estimator.md writes in full is a working
estimator (its reference, the plain and the fast evaluator agree), loaded from the page's own text."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import torch

from seqis.core.spec import EstimatorSpec
from seqis.evaluators import fast
from seqis.evaluators.plain import evaluate

ROOT = Path(__file__).resolve().parents[1]


def test_the_add_an_estimator_recipe_is_a_working_estimator():
    text = (ROOT / "docs" / "add-an-estimator.md").read_text()
    code = re.search(r'```python\n("""Geometric IS.*?)```', text, re.S).group(1)
    module = types.ModuleType("seqis.estimators.my_estimator")
    module.__package__ = "seqis.estimators"
    sys.modules[module.__name__] = module
    try:
        exec(compile(code, "docs/add-an-estimator.md", "exec"), module.__dict__)
        spec = EstimatorSpec.of(module)
    finally:
        del sys.modules[module.__name__]
    assert spec.name == "my_estimator" and spec.section("Reduces to") == "geo_is as C -> inf."
    g = torch.Generator().manual_seed(0)
    B, T = 16, 24
    mask = torch.arange(T)[None, :] < torch.randint(1, T + 1, (B,), generator=g)[:, None]
    inference = -torch.rand(B, T, generator=g, dtype=torch.float64) * 2
    trainer = (inference + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)).requires_grad_()
    from seqis import Batch

    batch = Batch(trainer, inference, torch.randn(B, generator=g, dtype=torch.float64), mask)
    cfg = spec.config(cap=1.05)
    comp = spec.compose(cfg)
    weights, kept = spec.reference(batch, cfg)
    assert 0 < int(kept.sum()) < int(mask.sum()), "the cap drops some rollouts and keeps others"
    for out in (evaluate(comp, batch), fast.evaluate_many({comp: 1}, batch)[comp][0]):
        assert out.masks["kept"].equal(kept)
        torch.testing.assert_close(out.weights, weights)


def test_every_link_between_the_pages_leads_to_a_file():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not broken, "links to nothing:\n" + "\n".join(broken)
