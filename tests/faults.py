"""Engine failures injected into running jobs and processors (tests of pipeline/llm/stage.py's engine
restarts). `install` is Ray's worker_process_setup_hook: in every worker process it arranges that
when the vLLM engine's feeder is imported, its step reads the fault written to
$NGRAMMYS_TEST_FAULTS/fault.json (by `inject`) and fails as told:

  {"kind": "raise", "at": N}   the N-th step of the first engine to reach it raises (once in the run)
  {"kind": "hang", "at": N}    the N-th step of the first engine to reach it never returns (once)
  {"kind": "always", "at": N}  the N-th step of every engine raises (a crash loop)

A test in one process calls `patch(feeder_module)` itself.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import itertools
import json
import os
import sys
import time
from pathlib import Path

FEEDER = "pipeline.engines.vllm.feeder"
INJECTED = "injected fault: the engine step failed"


def inject(directory: Path, kind: str | None, at: int = 1) -> None:
    """Sets the fault the next engines meet (None: none); `directory` is $NGRAMMYS_TEST_FAULTS."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "claimed").unlink(missing_ok=True)
    (directory / "fault.json").write_text(json.dumps({"kind": kind, "at": at}))


def fault(directory: Path) -> dict:
    path = directory / "fault.json"
    return json.loads(path.read_text()) if path.is_file() else {"kind": None}


def claim(directory: Path) -> bool:
    """True in the first caller only, of any process: a fault that happens once in a run."""
    try:
        os.close(os.open(directory / "claimed", os.O_CREAT | os.O_EXCL))
        return True
    except FileExistsError:
        return False


def patch(module) -> None:
    """Wraps the feeder's step with the fault of $NGRAMMYS_TEST_FAULTS, read at every step: an
    engine counts its steps from when it first meets the fault as it is now."""
    original = module.EngineFeeder._step
    directory = Path(os.environ["NGRAMMYS_TEST_FAULTS"])

    def _step(self, llm):
        now = fault(directory)
        if getattr(self, "_fault", None) != now:
            self._fault, self._steps = now, itertools.count(1)
        kind, at = now["kind"], now.get("at", 1)
        if kind and next(self._steps) == at and (kind == "always" or claim(directory)):
            if kind == "hang":
                time.sleep(3600)  # a step that never returns
            raise RuntimeError(INJECTED)
        return original(self, llm)

    module.EngineFeeder._step = _step


class PatchOnImport(importlib.abc.MetaPathFinder):
    """Patches the feeder module right after it is first imported (workers that never run an
    engine never import it, nor vLLM)."""

    def find_spec(self, name, path, target=None):
        if name != FEEDER:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            patch(module)

        spec.loader.exec_module = exec_module
        return spec


def install() -> None:
    if os.environ.get("NGRAMMYS_TEST_FAULTS") and not any(isinstance(f, PatchOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, PatchOnImport())
