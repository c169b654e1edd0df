"""The compiled evaluator (seqis/evaluators/compiled.py) gives the plain evaluator's outputs (the definition), to the
tolerances docs/reliability.md states, for every seed estimator and every preset it supports, on hypothesis-drawn
batches (test_evaluators' batches and comparison); a wrong formula in its graph fails that comparison; and each way
of not compiling (SEQIS_COMPILE=0, no torch.compile, a compile that raises then or later, a dtype it lacks) runs the
eager path and says why, once.

Compile cost: the graph compiles once per dtype and advantages' rank (float32 / float64, per rollout / per token: four
graphs, dynamic shapes), inductor's cache shared across the run (conftest's `inductor_cache`), few examples each.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import configs, examples
from test_evaluators import _any_disagreement, batches, same_output

from seqis import AGGREGATIONS, ESTIMATORS, PRESETS, Batch, run
from seqis.estimators import SEED_ESTIMATORS
from seqis.evaluators import compiled, compiled_status
from seqis.evaluators.plain import evaluate
from seqis.registry import resolve

SUPPORTED = [k for k in ESTIMATORS if compiled.supports(resolve(k))]
PRESETS_SUPPORTED = sorted(k for k in PRESETS if compiled.supports(resolve(k)))
# the graph serves batches of two or more rollouts and tokens; a size of 1 goes to the eager path
two_by_two = batches().filter(lambda b: min(b.loss_mask.shape) >= 2)


@pytest.fixture(scope="module", autouse=True)
def graph(inductor_cache):
    """The compiled path chosen for this module (SEQIS_COMPILE=1), its probe a small batch like the drawn ones (so
    the probe's graph is the one they use); the process's own choice restored afterwards."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SEQIS_COMPILE", "1")
        mp.setattr(compiled, "PROBE", (3, 5))
        mp.setattr(compiled, "_choice", None)
        mp.setattr(compiled, "_graphs", None)
        assert compiled_status() == "compiled (inductor, cpu, float32 and float64)" or torch.cuda.is_available()
        yield


def compiled_output(comp, batch: Batch, agg: str):
    got = compiled.evaluate_many({comp: 1}, batch, agg)
    assert comp in got, "the compiled path did not take a composition it supports"
    return got[comp][0]


def test_the_seed_estimators_are_compiled():
    assert set(SEED_ESTIMATORS) <= set(SUPPORTED)
    assert len(PRESETS_SUPPORTED) >= 30, PRESETS_SUPPORTED


@pytest.mark.parametrize("name", SUPPORTED)
@settings(max_examples=examples(6), deadline=None)
@given(batch=two_by_two, data=st.data())
def test_compiled_and_plain_agree_for_every_estimator_it_supports(name, batch, data):
    cfg = data.draw(configs(name, adv_taus=(1.0, 0.5)))
    agg = data.draw(st.sampled_from(AGGREGATIONS))
    comp = resolve(name, cfg)
    if not compiled.supports(comp):  # a knob that adds a part the graph lacks: the eager path's
        assert compiled.evaluate_many({comp: 1}, batch, agg) == {}
        return
    same_output(compiled_output(comp, batch, agg), evaluate(comp, batch, agg), batch, f"{name} compiled vs plain")


@pytest.mark.parametrize("key", PRESETS_SUPPORTED)
@settings(max_examples=examples(3), deadline=None)
@given(batch=two_by_two, agg=st.sampled_from(AGGREGATIONS))
def test_compiled_and_plain_agree_for_every_preset_it_supports(key, batch, agg):
    comp = resolve(key)
    same_output(compiled_output(comp, batch, agg), evaluate(comp, batch, agg), batch, f"{key} compiled vs plain")


def test_run_takes_the_compiled_path_and_the_eager_one_for_the_rest():
    batch = _batch(torch.float32)
    out = run("seq_tis", batch)
    assert type(out.loss.grad_fn).__name__ == "_LossBackward"  # the compiled path's loss node
    same_output(out, evaluate(resolve("seq_tis"), batch), batch, "run seq_tis")
    assert not compiled.supports(resolve("icepop"))  # a weight band: the fast evaluator's
    eager = run("icepop", batch)
    assert type(eager.loss.grad_fn).__name__ != "_LossBackward"
    same_output(eager, evaluate(resolve("icepop"), batch), batch, "run icepop")


def test_a_composition_named_twice_gets_two_loss_nodes():
    batch = _batch(torch.float64)
    outs = compiled.evaluate_many({resolve("seq_mis"): 2}, batch)[resolve("seq_mis")]
    assert len(outs) == 2 and outs[0].loss is not outs[1].loss
    g = [torch.autograd.grad(o.loss, batch.trainer_logprobs)[0] for o in outs]
    assert g[0].equal(g[1])


def test_a_wrong_formula_in_the_graph_fails(monkeypatch):
    # the graph's truncation made one clip too lax: min(w, 1.1 C) instead of min(w, C)
    comp = resolve("seq_tis")
    check = lambda batch: same_output(compiled_output(comp, batch, "token-mean"), evaluate(comp, batch), batch,
                                      "seq_tis")
    assert not _any_disagreement(check), "the compiled path agrees"
    real = compiled.weight

    def lax(x, k):
        k = k.clone()
        k[compiled.K["log_cap"]] += math.log(1.1)
        return real(x, k)
    monkeypatch.setattr(compiled, "weight", lax)
    assert _any_disagreement(check), "a wrong formula in the graph must fail the comparison"


# ------------------------------------------------------------------------------------------------------
# the eager path, and the status that says why


def _batch(dtype, B=6, T=9, seed=0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    mask = torch.arange(T)[None, :] < torch.randint(1, T + 1, (B,), generator=g)[:, None]
    inference = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    trainer = inference + 0.5 * torch.randn(B, T, generator=g, dtype=torch.float64)
    return Batch(trainer.to(dtype).requires_grad_(), inference.to(dtype),
                 torch.randn(B, generator=g, dtype=torch.float64).to(dtype), mask)


@pytest.fixture
def fresh(monkeypatch):
    """No choice made yet in this process; returns a counter of the choices made."""
    monkeypatch.setattr(compiled, "_choice", None)
    monkeypatch.setattr(compiled, "_graphs", None)
    made = []
    decide = compiled._decide
    monkeypatch.setattr(compiled, "_decide", lambda s: made.append(s) or decide(s))
    return made


def _runs_eager(batch: Batch, name: str = "seq_tis") -> None:
    assert compiled.evaluate_many({resolve(name): 1}, batch) == {}
    out = run(name, batch)
    assert type(out.loss.grad_fn).__name__ != "_LossBackward"
    same_output(out, evaluate(resolve(name), batch), batch, f"{name} eager")


def test_seqis_compile_0_runs_eager_and_says_so_once(monkeypatch, fresh):
    monkeypatch.setenv("SEQIS_COMPILE", "0")
    assert compiled_status() == "eager: SEQIS_COMPILE=0"
    _runs_eager(_batch(torch.float32))
    assert compiled_status() == "eager: SEQIS_COMPILE=0"
    assert fresh == ["0"], "the choice is made once per process"


def test_auto_on_a_host_without_cuda_runs_eager(monkeypatch, fresh):
    monkeypatch.delenv("SEQIS_COMPILE", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert compiled_status().startswith("eager: auto on a host without CUDA")
    _runs_eager(_batch(torch.float32))


def test_a_bad_setting_runs_eager_and_names_it(monkeypatch, fresh):
    monkeypatch.setenv("SEQIS_COMPILE", "yes")
    assert compiled_status() == "eager: SEQIS_COMPILE='yes' is neither 0 nor 1"
    _runs_eager(_batch(torch.float32))


def test_no_torch_compile_runs_eager(monkeypatch, fresh):
    monkeypatch.setenv("SEQIS_COMPILE", "1")
    monkeypatch.delattr(torch, "compile")
    assert compiled_status() == "eager: this torch has no torch.compile"
    _runs_eager(_batch(torch.float64))
    assert fresh == ["1"]


def test_a_compile_that_raises_runs_eager_and_says_why(monkeypatch, fresh):
    monkeypatch.setenv("SEQIS_COMPILE", "1")

    def no_compiler(fn, **kwargs):  # torch.compile is lazy: the compiler fails at the first call
        def call(*args):
            raise RuntimeError("InvalidCxxCompiler: No working C++ compiler found\nmore lines")
        return call
    monkeypatch.setattr(torch, "compile", no_compiler)
    assert compiled_status() == "eager: compile failed: RuntimeError: InvalidCxxCompiler: No working C++ compiler found"
    _runs_eager(_batch(torch.float32))
    assert fresh == ["1"]


def test_a_later_compile_that_raises_falls_back_once(monkeypatch):
    monkeypatch.setattr(compiled, "_choice", compiled.Choice(("cpu",), "compiled (inductor, cpu, float32)"))

    def fails(*args):
        raise RuntimeError("a new graph for float64 failed")
    monkeypatch.setattr(compiled, "_graphs", {"rows": fails, "tokens": fails})
    batch = _batch(torch.float64)
    with pytest.warns(RuntimeWarning, match="compile failed: RuntimeError: a new graph for float64 failed"):
        out = run("seq_tis", batch)
    same_output(out, evaluate(resolve("seq_tis"), batch), batch, "after the failure")
    assert compiled_status() == "eager: compile failed: RuntimeError: a new graph for float64 failed"
    _runs_eager(_batch(torch.float32))  # every batch from then on, without another warning


def test_past_its_variants_a_new_kind_of_batch_runs_eager(monkeypatch):
    # torch.compile would run the graph uncompiled past its recompile limit: a new kind goes to the eager path
    batch = _batch(torch.float32)
    monkeypatch.setattr(compiled, "_variants", {"rows": set(), "tokens": set()})
    monkeypatch.setattr(compiled, "VARIANTS", 1)
    assert compiled.evaluate_many({resolve("seq_tis"): 1}, batch) != {}  # the first kind: compiled
    _runs_eager(_batch(torch.float64))  # a second kind of the rows graph: eager
    assert compiled.evaluate_many({resolve("seq_tis"): 1}, _batch(torch.float32, B=5, T=7)) != {}  # the first kind


def test_a_dtype_or_size_it_lacks_runs_eager():
    assert compiled_status().startswith("compiled")
    _runs_eager(_batch(torch.bfloat16))
    _runs_eager(_batch(torch.float32, B=1))
    _runs_eager(_batch(torch.float32, T=1))


def test_a_graph_that_disagrees_with_its_eager_run_is_not_used(monkeypatch, fresh):
    # the probe runs each compiled graph beside the same code run eagerly; here the "compiled" rows graph is wrong
    monkeypatch.setenv("SEQIS_COMPILE", "1")
    real = compiled.forward_rows

    def wrong(t, q, m, adv, k):
        loss, metrics, rows, *rest = real(t, q, m, adv, k)
        return (loss, metrics, rows * 1.01, *rest)
    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: wrong if fn is real else fn)
    assert compiled_status().startswith("eager: compile failed: Disagrees: the compiled rows graph disagrees")
    _runs_eager(_batch(torch.float32))


ON_ANOTHER_CPU = """
import os, torch
from seqis import run
from seqis.evaluators import compiled, compiled_status
from seqis.evaluators.plain import evaluate
from seqis.estimators import SEED_ESTIMATORS
from seqis.registry import resolve
from test_compiled import _batch
from test_evaluators import same_output
assert torch.backends.cpu.get_cpu_capability() == os.environ["ATEN_CPU_CAPABILITY"].upper(), "capability not taken"
assert compiled_status().startswith("compiled"), compiled_status()
for seed in range(3):
    batch = _batch(torch.float32, B=7, T=13, seed=seed)  # padded rows: -inf and NaN log-probs off the mask
    for name in SEED_ESTIMATORS:
        got = compiled.evaluate_many({resolve(name): 1}, batch)
        assert got, f"{name} not compiled"
        same_output(got[resolve(name)][0], evaluate(resolve(name), batch), batch, f"{name} seed {seed}")
print("agree")
"""


@pytest.mark.parametrize("capability", ["avx2", "default"])
def test_the_compiled_path_agrees_on_another_cpu(capability, tmp_path_factory):
    # these hosts differ (AVX-512, AVX2): torch's dispatch and inductor's vector code at another width, in a process
    # of its own with a cache of its own (inductor's cache is not keyed by the capability: conftest's inductor_cache)
    import os
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, ATEN_CPU_CAPABILITY=capability, SEQIS_COMPILE="1",
               TORCHINDUCTOR_CACHE_DIR=str(tmp_path_factory.getbasetemp().parent / f"inductor-cache-{capability}"),
               PYTHONPATH=os.pathsep.join([str(root), str(root / "tests")]))
    done = subprocess.run([sys.executable, "-c", ON_ANOTHER_CPU], env=env, capture_output=True, text=True,
                          timeout=600, cwd=root)
    assert done.returncode == 0 and done.stdout.strip().endswith("agree"), done.stderr[-3000:]
