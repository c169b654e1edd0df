"""The structure the file list promises, checked: no import cycle at any level (a package and its own modules
included, which import-linter's sibling contract does not see), no cache edited by hand, every estimator file with
its reference, and the layering contracts of pyproject.toml kept (`lint-imports`, also run by make test)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

from seqis import ESTIMATORS

ROOT = Path(__file__).resolve().parents[1]


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of a directed graph (module -> modules it imports directly)."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []

    def visit(v: str) -> None:  # recursive: the import graph is shallow (a few hundred modules)
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            out.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_cycle_finder_finds_a_cycle():
    assert sorted(map(sorted, strongly_connected({"a": {"b"}, "b": {"a"}, "c": {"a"}}))) == [["a", "b"], ["c"]]


def test_no_import_cycle_between_any_two_modules():
    g = grimp.build_graph("seqis", "app")
    edges = {m: g.find_modules_directly_imported_by(m) for m in g.modules}
    cycles = [sorted(c) for c in strongly_connected(edges) if len(c) > 1]
    assert cycles == [], f"import cycles: {cycles}"


def test_no_cache_is_invalidated_by_hand():
    hits = [f"{p.relative_to(ROOT)}:{i}" for p in sorted(ROOT.joinpath("seqis").rglob("*.py"))
            for i, line in enumerate(p.read_text().splitlines(), 1) if re.search(r"__dict__\s*[\[.]", line)]
    assert hits == []


@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_every_estimator_file_holds_its_formula(name):
    spec = ESTIMATORS[name]
    module = sys.modules[spec.compose.__module__]
    assert module.__file__.endswith(f"seqis/estimators/{name}.py")
    assert spec.reference is module.reference and spec.formula == module.LATEX
    assert spec.summary and spec.section("Trades") and spec.section("Source"), "its docstring says what it trades"
    lines = [ln for ln in module.reference.__code__.co_lines()]
    body = len({ln for *_, ln in lines if ln is not None}) - 1  # the def line aside
    assert 2 <= body <= 15, f"{name}'s reference is {body} lines: the formula, plain"


def test_the_layering_contracts_hold():
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    if lint is None:
        pytest.skip("import-linter is not installed (pip install -e '.[test]')")
    done = subprocess.run([lint], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:]


def test_no_module_is_over_600_lines():
    # a module a newcomer can read in one sitting: past 600 lines, a file holds more than one job (issue 41)
    long = {str(p.relative_to(ROOT)): n for folder in ("seqis", "app") for p in (ROOT / folder).rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 600}
    assert not long, f"modules over 600 lines: {long}"
