"""The layout's rule, read from the code: every import points down the layers, nothing imports in a
circle, and nothing outside an engine's folder reaches past its public surface (the package).

Layers, top to bottom (docs/layout.md, "Where things are"; ../shared/ARCHITECTURE.md), a folder each:

    lab                  lab/: the research instruments (python -m lab), outside the wheel
    jobs                 entry points and the benchmark (what a user runs to decide)
    job                  pipeline/job/: ray_job (read -> the processor -> Parquet), run (the run's paths, plan
                         and summary), rows, inputs, output_files, series, series_store
    llm                  pipeline/llm/: ray.data.llm's API (processor) and its stage: stage, actor_pool, schema,
                         sampling_params, row_values, checkpoint, progress, metrics
    engine builder       pipeline/engines/build (which engine), speculation (which mode it runs in)
    engines              pipeline/engines/vllm/, pipeline/engines/transformers/ (siblings)
    engine interface     pipeline/engines/base, stats
    loading              pipeline/loading/: model (resolved, converted, cached), drafters (name -> drafter + tables)
    config               pipeline/config/: settings and a module per section (names importable from
                         pipeline.config), typed, drafter_kinds, vllm_arguments, package_data; and
                         pipeline/storage (paths and URIs, files
                         written whole), which the job and the stage read
    drafters             drafters/ (engine-neutral: it imports nothing from pipeline/)
    primitives           drafters/primitives/ (sampling primitives, forward helpers, cache keys)

Every import counts, the ones inside functions and under TYPE_CHECKING too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("lab", "jobs", "pipeline", "drafters")
ENGINES = ("pipeline.engines.vllm", "pipeline.engines.transformers")

# Top first. A module belongs to the layer of the longest prefix it starts with (a prefix matches
# the module itself and everything below it).
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("lab", ("lab",)),  # the research instruments, outside the wheel: nothing of the product imports them
    ("jobs", ("jobs",)),
    ("job", ("pipeline.job",)),
    ("llm", ("pipeline.llm",)),
    ("engine builder", ("pipeline.engines.build", "pipeline.engines.speculation")),
    ("engines", ENGINES),
    ("engine interface", ("pipeline.engines.base", "pipeline.engines.stats", "pipeline.engines")),
    ("loading", ("pipeline.loading",)),
    ("config", ("pipeline.config", "pipeline")),
    ("drafters", ("drafters",)),
    ("primitives", ("drafters.primitives",)),
]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules() -> dict[str, Path]:
    return {module_name(path): path for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))}


def imported(path: Path, module: str, known: set[str]) -> set[str]:
    """The project modules `path` imports, each resolved to the module itself (a name imported from
    a package counts as that package's submodule when there is one)."""
    found = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from . import x, from .a import b
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in known)
    return {name for name in found if name.split(".")[0] in PACKAGES and name != module}


def layer_of(module: str) -> int:
    """The layer of the longest prefix the module starts with (drafters.primitives before drafters)."""
    matches = [
        (len(prefix), index)
        for index, (_, prefixes) in enumerate(LAYERS)
        for prefix in prefixes
        if module == prefix or module.startswith(prefix + ".")
    ]
    if matches:
        return max(matches)[1]
    raise AssertionError(
        f"{module} is in no layer: add it to LAYERS in tests/test_layers.py (and docs/layout.md's map)"
    )


def engine_of(module: str) -> str | None:
    return next((engine for engine in ENGINES if module == engine or module.startswith(engine + ".")), None)


def violations(graph: dict[str, set[str]]) -> list[str]:
    """Each import that breaks the rule, said in a line."""
    found = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            if layer_of(target) < layer_of(module):
                found.append(
                    f"{module} imports {target}: up from {LAYERS[layer_of(module)][0]!r} "
                    f"to {LAYERS[layer_of(target)][0]!r}"
                )
            own, theirs = engine_of(module), engine_of(target)
            if theirs is not None and own != theirs and target != theirs:
                found.append(
                    f"{module} imports {target}: an internal of the engine {theirs} "
                    f"(outside it, import its package {theirs})"
                )
    return found + [f"circle: {', '.join(group)} import each other" for group in circles(graph)]


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import each other, directly or through others (Tarjan's strongly
    connected components of more than one module), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def import_graph() -> dict[str, set[str]]:
    modules = project_modules()
    known = set(modules)
    return {
        module: {name for name in imported(path, module, known) if name in known or name in PACKAGES}
        for module, path in modules.items()
    }


def without_package_edges(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Circles are looked for between modules: a module that imports a name from its own
    package's __init__, which imports it back, is no circle of code."""
    return {module: {t for t in targets if not module.startswith(t + ".")} for module, targets in graph.items()}


def test_every_import_points_down_and_no_module_imports_in_a_circle():
    graph = import_graph()
    assert len(graph) > 40, f"the scan found only {len(graph)} modules"
    problems = violations(without_package_edges(graph))
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(
    "module,source,expected",
    [
        # pipeline/ (outside the transformers engine) reaching into its internals
        (
            "pipeline.engines.stats",
            "from pipeline.engines.transformers.verification import Verdict",
            "an internal of the engine pipeline.engines.transformers",
        ),
        # a drafter importing the config above it (the registry, the settings)
        ("drafters.suffix.drafter", "from pipeline.config import DecoderConfig", "up from 'drafters' to 'config'"),
        # a drafter importing an engine
        ("drafters.context_ngram", "import pipeline.engines.base", "up from 'drafters' to 'engine interface'"),
        # a primitive importing a drafter
        ("drafters.primitives.sampling", "from drafters.base import Drafts", "up from 'primitives' to 'drafters'"),
        # one engine importing the other's internals
        (
            "pipeline.engines.vllm.proposer",
            "from pipeline.engines.transformers.tree import build_tree",
            "an internal of the engine pipeline.engines.transformers",
        ),
        # an import inside a function counts too
        (
            "pipeline.config.settings",
            "def f():\n    from pipeline.engines.build import build_engine",
            "up from 'config' to 'engine builder'",
        ),
        # the stage importing the job above it
        ("pipeline.llm.stage", "from pipeline.job.run import RunPaths", "up from 'llm' to 'job'"),
    ],
)
def test_an_import_that_breaks_the_rule_is_named(tmp_path, module, source, expected):
    graph = import_graph()
    path = tmp_path / "module.py"
    path.write_text(source + "\n")
    graph[module] = graph[module] | imported(path, module, set(graph))
    problems = violations(without_package_edges(graph))
    assert any(module in line and expected in line for line in problems), problems


def test_a_circle_is_found():
    graph = {
        "pipeline.config": {"pipeline.engines.stats"},
        "pipeline.engines.stats": {"drafters.primitives.sampling"},
        "drafters.primitives.sampling": {"pipeline.config"},
        "pipeline.llm.schema": set(),
    }
    assert circles(graph) == [["drafters.primitives.sampling", "pipeline.config", "pipeline.engines.stats"]]
    assert any(line.startswith("circle: ") for line in violations(graph))


MAX_MODULE_LINES = 500  # drafters/ and pipeline/: a module past it holds more than one thing
MAX_FUNCTION_LINES = 60  # everywhere: a function fits on a screen
MAX_PARAMETERS = 8  # everywhere: past it, a function takes a bundle (a config section, a State)
# Functions that replace a vLLM function take its signature, whatever its length.
VLLM_SIGNATURES = {
    "pipeline/engines/vllm/seeded_sampling.py:rejection_sample",
    "pipeline/engines/vllm/v2/speculator.py:propose",
}


def is_kernel(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """A Triton kernel or device function (`@triton.jit`): it takes its pointers and scalars one by one
    (a kernel cannot take a bundle), as vLLM's own do; its body is held to the length of any function."""
    return any(ast.unparse(decorator).startswith("triton.jit") for decorator in node.decorator_list)


def parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """The function's parameters, a method's self or cls left out (*args and **kwargs not counted)."""
    arguments = node.args
    names = [a.arg for a in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs)]
    return len(names) - (names[:1] in (["self"], ["cls"]))


def oversized(paths: list[Path]) -> list[str]:
    """Each module of drafters/ or pipeline/ over MAX_MODULE_LINES, and each function anywhere over
    MAX_FUNCTION_LINES or MAX_PARAMETERS, said in a line."""
    found = []
    for path in paths:
        source = path.read_text()
        name = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        lines = source.count("\n")
        if path.is_relative_to(ROOT) and name.parts[0] in ("drafters", "pipeline") and lines > MAX_MODULE_LINES:
            found.append(f"{name}: {lines} lines (at most {MAX_MODULE_LINES})")
        for node in ast.walk(ast.parse(source, str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                # a kernel's signature lists its pointers one a line: its body is what must fit
                length = node.end_lineno - (node.body[0].lineno if is_kernel(node) else node.lineno) + 1
                if length > MAX_FUNCTION_LINES:
                    found.append(f"{name}:{node.lineno} {node.name}: {length} lines (at most {MAX_FUNCTION_LINES})")
                count = parameters(node)
                if count > MAX_PARAMETERS and f"{name}:{node.name}" not in VLLM_SIGNATURES and not is_kernel(node):
                    found.append(f"{name}:{node.lineno} {node.name}: {count} parameters (at most {MAX_PARAMETERS})")
    return found


def test_modules_and_functions_fit():
    problems = oversized(list(project_modules().values()))
    assert not problems, "\n".join(problems)


def test_an_oversized_function_is_named(tmp_path):
    path = tmp_path / "long.py"
    path.write_text("def long():\n" + "    x = 1\n" * MAX_FUNCTION_LINES)
    assert oversized([path]) == [f"{path}:1 long: {MAX_FUNCTION_LINES + 1} lines (at most {MAX_FUNCTION_LINES})"]


def test_a_function_with_too_many_parameters_is_named(tmp_path):
    path = tmp_path / "wide.py"
    wide, fits = (", ".join(f"a{i}" for i in range(count)) for count in (MAX_PARAMETERS + 1, MAX_PARAMETERS))
    path.write_text(f"class C:\n    def wide(self, {wide}):\n        pass\n    def fits(self, {fits}):\n        pass\n")
    assert oversized([path]) == [f"{path}:2 wide: {MAX_PARAMETERS + 1} parameters (at most {MAX_PARAMETERS})"]


def test_every_file_the_code_and_readme_name_exists():
    """A path to a module or test named in the code, the tests, the README, the docs pages or
    pyproject.toml is a file of the tree (docs/measurements/ is a record: it names files as they were
    at its commits)."""
    import re

    named = re.compile(r"\b((?:pipeline|drafters|jobs|lab|tests)/[\w/]+\.py)\b")
    sources = [path for package in (*PACKAGES, "tests") for path in (ROOT / package).rglob("*.py")]
    docs = sorted((ROOT / "docs").glob("*.md"))
    stale = sorted(
        {
            f"{path.relative_to(ROOT)}: {name}"
            for path in [*sources, ROOT / "README.md", *docs, ROOT / "pyproject.toml"]
            for name in named.findall(path.read_text())
            if not (ROOT / name).is_file()
        }
    )
    assert not stale, "\n".join(stale)


def test_every_module_has_its_test_where_a_reader_looks():
    """A module's tests are at its mirrored path (pipeline/llm/stage.py: tests/pipeline/llm/test_stage.py),
    or in the test file docs/layout.md's "Where a module is tested" names for it, which exists."""
    import re

    table = (ROOT / "docs" / "layout.md").read_text().split("## Where a module is tested", 1)[1].split("\n## ", 1)[0]
    listed = dict(re.findall(r"^\| `([\w/]+\.py)` \| `([\w/]+\.py)`", table, re.M))
    modules = [
        path.relative_to(ROOT)
        for package in PACKAGES
        if package != "lab"
        for path in sorted((ROOT / package).rglob("*.py"))
        if path.name not in ("__init__.py", "__main__.py")
    ]
    mirrored = {str(m) for m in modules if (ROOT / "tests" / m.parent / f"test_{m.stem}.py").is_file()}
    untested = [str(m) for m in modules if str(m) not in mirrored and str(m) not in listed]
    assert not untested, f"no test file at the mirrored path, nor a row in docs/layout.md's table: {untested}"
    assert not [m for m, t in listed.items() if not (ROOT / t).is_file()], "a test file the table names is gone"
    assert not set(listed) & mirrored, "a module with its mirrored test file is listed too"
    assert not set(listed) - {str(m) for m in modules}, "the table lists a module that is gone"


# A section, and the modules that may read it. An engine's: the engine itself, the other engine's
# check that refuses it, the fingerprint (what decides a row's text), the config, and the
# processor and drafter loading that map the transformers engine's settings. The others: the
# engines and the job's modules that consume them (the fingerprint reads what decides a row's text).
SECTION_READERS = {
    "sampling": (
        "pipeline.config",
        "pipeline.engines.speculation",
        "pipeline.job.openai_batch",
        "pipeline.job.ray_job",
        "pipeline.job.rows",
        "pipeline.job.series",
    ),
    "drafting": (
        "pipeline.config",
        "pipeline.engines",
        "pipeline.job.ray_job",
        "pipeline.job.run",
        "pipeline.job.series_store",
        "pipeline.llm.actor_pool",
        "pipeline.loading.drafters",
    ),
    "input": ("pipeline.config", "jobs.generate", "pipeline.job.ray_job", "pipeline.job.rows", "pipeline.job.series"),
    "job": (
        "pipeline.config",
        "jobs.generate",
        "pipeline.job.ray_job",
        "pipeline.job.run",
        "pipeline.job.series_store",
    ),
    "vllm": (
        "pipeline.config",
        "pipeline.engines.vllm",
        "pipeline.engines.transformers.settings",
        "pipeline.job.series",
    ),
    "transformers": (
        "pipeline.config",
        "pipeline.engines.transformers",
        "pipeline.engines.vllm.settings",
        "pipeline.job.series",
        "pipeline.llm.processor",
        "pipeline.loading.drafters",
    ),
    # The model: the engines that load it, the drafters' tables built from it, the stage and the
    # actors that hold it, the run's paths and the series (its name is in a row's fingerprint and
    # its store), and the bench that writes a series' history as the job would.
    "model": (
        "pipeline.config",
        "pipeline.engines",
        "pipeline.loading.drafters",
        "pipeline.llm.actor_pool",
        "pipeline.llm.engine_slot",
        "pipeline.llm.stage",
        "pipeline.job.run",
        "pipeline.job.series",
        "pipeline.job.series_store",
        "jobs.benchmark.series_history",
    ),
    # Which engine, its restarts and its hang timeout: where the engine is built, the chooser that
    # knows what each engine can run, the actors and stage that restart it, the job's batch, the
    # fingerprint (the engine decides a row's text).
    "engine": (
        "pipeline.config",
        "pipeline.engines.build",
        "pipeline.engines.speculation",
        "pipeline.engines.vllm.engine",
        "pipeline.job.ray_job",
        "pipeline.job.series",
        "pipeline.llm.actor_pool",
        "pipeline.llm.stage",
    ),
    # The actors' resources and batches: the engines check their device and batch against them.
    "ray": (
        "pipeline.config",
        "pipeline.engines",
        "pipeline.job.ray_job",
        "pipeline.job.run",
        "pipeline.llm.actor_pool",
        "pipeline.llm.processor",
        "pipeline.llm.processor_config",
        "pipeline.llm.stage",
    ),
}


def test_each_section_is_read_by_its_consumers_only():
    """config.<section> is read where SECTION_READERS says, nowhere else in the product (a setting
    read outside its section's consumers couples the engines, or the job to an engine)."""
    found = []
    for module, path in project_modules().items():
        if module.startswith("lab"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (isinstance(node, ast.Attribute) and node.attr in SECTION_READERS):
                continue
            owner = node.value
            if not (
                (isinstance(owner, ast.Name) and owner.id == "config")
                or (isinstance(owner, ast.Attribute) and owner.attr == "config")
            ):
                continue
            if not any(module == p or module.startswith(p + ".") for p in SECTION_READERS[node.attr]):
                found.append(f"{module} reads config.{node.attr} (line {node.lineno})")
    assert not found, found
