"""Loading a framework's own functions from a checkout or an unzipped wheel, without importing its package.

A framework's package imports ray, megatron, transformers, vLLM...; the functions a preset reproduces need only
torch. So each is read from its file's syntax tree and executed alone in a namespace that holds torch, math and
the few names its signature mentions (annotations are not evaluated). Its decorators go, except torch's own
(torch.no_grad): a registry decorator would import the framework. An inline block (TRL computes its IS ratio in
the middle of a 400-line method) is found by its `if` test and run as code with the locals it reads.
"""

from __future__ import annotations
import __future__

import ast
import math
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch

_FUTURE = __future__.annotations.compiler_flag


class MissingCode(LookupError):
    """The checkout lacks a file or function this check needs (another version of the framework)."""


def find(root: Path, rel: str) -> Path:
    """The file `rel` (its path inside the package) under `root`: a checkout, or a wheel unzipped (whose files
    may sit under name-version.data/purelib/)."""
    root = Path(root)
    direct = root / rel
    if direct.is_file():
        return direct
    hits = sorted(p for p in root.rglob(Path(rel).name) if p.as_posix().endswith(rel))
    if not hits:
        raise MissingCode(f"{rel} is not under {root}")
    return hits[0]


def namespace(**names: Any) -> dict:
    """What the extracted functions may name at call time: torch, math, typing's Optional / Tuple / List / Any."""
    base = dict(torch=torch, math=math, nn=torch.nn, F=torch.nn.functional, dist=torch.distributed,
                Optional=Optional, Tuple=tuple, List=list, Dict=dict, Any=Any, dataclass=dataclass, field=field,
                __name__=__name__)  # a module in sys.modules: dataclasses looks the name up
    base.update(names)
    return base


def _keep(decorator: ast.expr) -> bool:
    """torch.no_grad() and @dataclass stay; a framework's registry decorator, @staticmethod and torch.compile go."""
    node = decorator.func if isinstance(decorator, ast.Call) else decorator
    if isinstance(node, ast.Name) and node.id == "dataclass":
        return True
    while isinstance(node, ast.Attribute):
        node = node.value
    return isinstance(node, ast.Name) and node.id == "torch" and not _is_compile(decorator)


def _is_compile(decorator: ast.expr) -> bool:
    return "compile" in ast.unparse(decorator)


def _strip(node: ast.stmt) -> ast.stmt:
    if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
        node.decorator_list = [d for d in node.decorator_list if _keep(d)]
    return node


def _run(nodes: list[ast.stmt], path: Path, ns: dict) -> None:
    module = ast.fix_missing_locations(ast.Module(body=nodes, type_ignores=[]))
    exec(compile(module, str(path), "exec", flags=_FUTURE, dont_inherit=True), ns)


def definitions(path: Path, names: list[str], ns: dict, *, optional: tuple[str, ...] = ()) -> dict:
    """Execute the top-level functions and classes `names` (and those of `optional` that exist) of `path` into
    `ns`; a method is named "Class.method" and lands in ns under the method's name. Raises MissingCode for a
    required name the file lacks."""
    tree = ast.parse(Path(path).read_text())
    top = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    picked = []
    for name in [*names, *optional]:
        owner, _, method = name.partition(".")
        node = top.get(owner)
        if node is not None and method:
            node = next((m for m in node.body if isinstance(m, ast.FunctionDef) and m.name == method), None)
        if node is None:
            if name in optional:
                continue
            raise MissingCode(f"{path.name} has no {name}")
        picked.append(_strip(node))
    _run(picked, path, ns)
    return ns


def block(path: Path, function: str, test: str, ns: dict, local: dict) -> dict:
    """Run the body of the first `if <test>:` inside `function` (a method: "Class.method") with `local` as its
    variables; returns the variables afterwards."""
    tree = ast.parse(Path(path).read_text())
    owner, _, method = function.partition(".")
    scope = next((n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == (method or owner)), None)
    if scope is None:
        raise MissingCode(f"{path.name} has no {function}")
    found = [n for n in ast.walk(scope) if isinstance(n, ast.If) and ast.unparse(n.test) == test]
    node = min(found, key=lambda n: n.lineno, default=None)  # the first such `if` in the source
    if node is None:
        raise MissingCode(f"{path.name}: {function} has no `if {test}:`")
    env = {**ns, **local}
    _run(list(node.body), path, env)
    return env


def attrs(**values: Any) -> types.SimpleNamespace:
    """A config object a framework reads by attribute (its dataclass or DictConfig stands in for it)."""
    return types.SimpleNamespace(**values)
