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
with its settings in extra_args[KEYED_KEY], drawn by the processor KEYED_DRAWS (v2/keyed_draws.py).

The names load on first use (PEP 562): vLLM imports this package's plugin (v2/plugin.py) in every
process it starts, its workers too, before its CPU worker scans the loaded modules for Triton kernels;
the plugin must not bring the engine, the drafters or numba along (llvmlite's ffi trips that scan).
"""

import importlib

# name -> (module, its name there)
_EXPORTS = {
    "fused_gumbel_argmax": ("compat", "fused_gumbel_argmax"),
    "llvmlite_set_aside": ("compat", "llvmlite_set_aside"),
    "VllmEngine": ("engine", "VllmEngine"),
    "cpu_binding": ("engine", "cpu_binding"),
    "set_vllm_environment": ("engine", "set_vllm_environment"),
    "WAITING_SHARE": ("feeder", "WAITING_SHARE"),
    "KIND": ("settings", "KIND"),
    "KEYED_KEY": ("v2.options", "KEYED_KEY"),
    "H100_DRAFT_LENGTHS": ("v2.plugin", "H100_DRAFT_LENGTHS"),
    "KEYED_DRAWS": ("v2.plugin", "KEYED_DRAWS"),
    "with_keyed_draws": ("v2.plugin", "with_keyed_draws"),
    "PREDICTION_KEY": ("v2.plugin", "PREDICTION_KEY"),
    "speculator_arguments": ("v2.plugin", "engine_arguments"),
    "register_speculator": ("v2.plugin", "register"),
    "SUPPORTED_VERSIONS": ("versions", "SUPPORTED_VERSIONS"),
    "UnsupportedVllm": ("versions", "UnsupportedVllm"),
    "check_vllm_version": ("versions", "check_vllm_version"),
}


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attribute = _EXPORTS[name]
    return getattr(importlib.import_module(f"{__name__}.{module}"), attribute)


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
    "with_keyed_draws",
]
