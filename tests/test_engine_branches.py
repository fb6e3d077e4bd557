"""Each engine owns its settings and its checks (pipeline/engines/<engine>/settings.py, its KIND):
nothing in pipeline/ or jobs/ outside pipeline/engines/build.py, the one place that maps
`engine.name` to an engine, compares an engine's name or looks a value up by it. A branch on the
name elsewhere means a setting or a check is in the wrong place."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENGINE_NAMES = ("vllm", "transformers")
BUILDER = "pipeline/engines/build.py"
# (file, function) of a branch kept for a caller that is not ours to move yet, each with why.
PENDING: set[tuple[str, str]] = set()  # (file, function) pairs allowed a branch for now: none


def names_an_engine(node: ast.AST) -> bool:
    """An engine's name as a literal ("vllm", or a tuple/list/set holding one), or `<x>.engine.name`."""
    if isinstance(node, ast.Constant):
        return node.value in ENGINE_NAMES
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(names_an_engine(element) for element in node.elts)
    return is_engine_name(node)


def is_engine_name(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "name"
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "engine"
    )


class BranchFinder(ast.NodeVisitor):
    """Each comparison with an engine's name, and each lookup keyed by `engine.name`, with the
    function it is in."""

    def __init__(self):
        self.functions: list[str] = []
        self.found: list[tuple[int, str, str]] = []  # (line, function, code)

    def visit_FunctionDef(self, node):
        self.functions.append(node.name)
        self.generic_visit(node)
        self.functions.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def note(self, node: ast.AST) -> None:
        self.found.append((node.lineno, self.functions[-1] if self.functions else "", ast.unparse(node)))

    def visit_Compare(self, node):
        if any(names_an_engine(operand) for operand in (node.left, *node.comparators)):
            self.note(node)
        self.generic_visit(node)

    def visit_Subscript(self, node):
        if is_engine_name(node.slice):
            self.note(node)
        self.generic_visit(node)

    def visit_Call(self, node):
        if isinstance(node.func, ast.Attribute) and node.func.attr == "get" and any(map(is_engine_name, node.args)):
            self.note(node)
        self.generic_visit(node)


def branches(source: str, name: str) -> list[str]:
    """Each branch on an engine's name in `source` (the file `name`), said in a line, but those PENDING."""
    finder = BranchFinder()
    finder.visit(ast.parse(source, name))
    return [
        f"{name}:{line} ({function or 'module'}): {code}"
        for line, function, code in finder.found
        if (name, function) not in PENDING
    ]


def test_no_branch_on_an_engine_name_outside_the_engine_builder():
    paths = [path for package in ("pipeline", "jobs") for path in sorted((ROOT / package).rglob("*.py"))]
    assert len(paths) > 40, f"the scan found only {len(paths)} modules"
    found = [
        line
        for path in paths
        if path.relative_to(ROOT).as_posix() != BUILDER
        for line in branches(path.read_text(), path.relative_to(ROOT).as_posix())
    ]
    assert not found, (
        "an engine's setting or check outside its engine (pipeline/engines/<engine>/settings.py, "
        "read through pipeline/engines/build.py):\n" + "\n".join(found)
    )


def test_the_pending_branches_are_still_there():
    """A PENDING entry whose branch has gone is taken out, so the list says what is left to move."""
    for file, function in PENDING:
        finder = BranchFinder()
        finder.visit(ast.parse((ROOT / file).read_text()))
        assert any(found == function for _, found, _ in finder.found), f"{file} {function}: no branch left, unlist it"


@pytest.mark.parametrize(
    "source",
    [
        "if config.engine.name == 'vllm':\n    pass",
        "ok = config.engine.name != 'transformers'",
        "x = self.engine == 'vllm'",  # a processor's engine keyword
        "x = method.engine in ('vllm', 'transformers')",
        "x = {'vllm': 16, 'transformers': 8}[config.engine.name]",
        "x = LIMITS.get(config.engine.name)",
        "def f(engine):\n    return 'transformers' in engine.kinds",
    ],
)
def test_a_branch_on_an_engine_name_is_found(source):
    assert branches(source, "example")


@pytest.mark.parametrize(
    "source",
    [
        "overrides = ['engine.name=vllm', f'engine.name={name}']",  # naming a setting, not branching on it
        "columns = {'engine': config.engine.name}",
        "ok = self.name == 'auto'",
        "ok = key in ENGINES",
    ],
)
def test_naming_an_engine_is_no_branch(source):
    assert not branches(source, "example")
