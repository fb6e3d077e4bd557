"""The vLLM engine: vLLM runs the model, our drafter is its proposer. Its public surface is
VllmEngine, what it declares of its settings (KIND, settings.py), how its feeder admits requests
(WAITING_SHARE), how it shares a CPU's cores among tensor-parallel ranks (cpu_binding), which vLLM
versions it supports (SUPPORTED_VERSIONS, check_vllm_version: a job checks at its start), its
keyed draw's CPU kernel (fused_gumbel_argmax: the sampling-draw benchmark), and how
it prepares a process to start vLLM (set_vllm_environment, llvmlite_set_aside: for a benchmark that
starts vLLM itself); vLLM loads the proposer (proposer.py) by its dotted path. Every reach into vLLM
past its public surface is in compat.py, with the versions each applies to. On vLLM >= 0.34 our drafter
is a speculator of vLLM's plugin registry (v2/): `register_speculator` (vLLM's general plugin calls it)
and `speculator_arguments` (the engine arguments that run it); a sampled row there runs greedy in vLLM
with its settings in extra_args[KEYED_KEY], drawn by the processor KEYED_DRAWS (v2/keyed_draws.py)."""

from pipeline.engines.vllm.compat import fused_gumbel_argmax, llvmlite_set_aside
from pipeline.engines.vllm.engine import VllmEngine, cpu_binding, set_vllm_environment
from pipeline.engines.vllm.feeder import WAITING_SHARE
from pipeline.engines.vllm.settings import KIND
from pipeline.engines.vllm.v2.options import KEYED_KEY
from pipeline.engines.vllm.v2.plugin import H100_DRAFT_LENGTHS, KEYED_DRAWS, PREDICTION_KEY
from pipeline.engines.vllm.v2.plugin import engine_arguments as speculator_arguments
from pipeline.engines.vllm.v2.plugin import register as register_speculator
from pipeline.engines.vllm.versions import SUPPORTED_VERSIONS, UnsupportedVllm, check_vllm_version

__all__ = [
    "H100_DRAFT_LENGTHS",
    "KEYED_DRAWS",
    "KEYED_KEY",
    "KIND",
    "PREDICTION_KEY",
    "SUPPORTED_VERSIONS",
    "WAITING_SHARE",
    "UnsupportedVllm",
    "VllmEngine",
    "check_vllm_version",
    "cpu_binding",
    "fused_gumbel_argmax",
    "llvmlite_set_aside",
    "register_speculator",
    "set_vllm_environment",
    "speculator_arguments",
]
