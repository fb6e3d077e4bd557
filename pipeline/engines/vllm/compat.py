"""Every reach of ours into vLLM past its public surface, and the vLLM versions it is written for.

vLLM's public surface is used where it is needed: `LLM` (enqueue, llm_engine.step, collective_rpc,
its configs), SamplingParams, the outputs, LoRARequest, EngineArgs, ModelRegistry (PUBLIC_MODULES),
the environment variables vLLM documents, and the contract of a `custom_class` proposer (vLLM builds
it with its VllmConfig and calls `load_model` and `propose(sampled_token_ids, num_tokens_no_spec,
token_ids_cpu, slot_mappings=...)`). Everything else we do to vLLM happens here: a correction of
its CPU sampling, a hook in its model runner, a read of its engine's or its runner's insides, its
private kernel, a setting that pins its model runner, its environment cache. REACHES says of each
what of vLLM's it touches, which vLLM versions it applies to and why.

The code that runs in vLLM's place lives beside this module and imports nothing of vLLM's:
cpu_sampling.py (the corrections) and seeded_sampling.py (the keyed draws); this module puts it
where vLLM looks. tests/pipeline/engines/vllm/test_compat.py holds the rule (no other module imports
vLLM's private modules or touches its private attributes) and says exactly what counts.

The versions themselves, and which is installed, are versions.py's.

Upgrading vLLM: read each reach below against the new version's source, set its `versions` (a
correction vLLM no longer needs leaves out the versions that fixed it: it is not installed there),
add the version to versions.SUPPORTED_VERSIONS, and run tests/pipeline/engines/ (test_vllm_cpu_sampling.py's
canary fails once vLLM fixes its CPU expand kernel). The one reach no correction can replace is the
V1 model runner (v1_model_runner): a vLLM without it ends the `custom_class` proposer.
"""

from __future__ import annotations

import os
import sys
import types
from contextlib import contextmanager
from dataclasses import dataclass
from collections.abc import Callable

import torch

from drafters.primitives.keyed_noise import gumbel_argmax
from pipeline.engines.vllm.cpu_sampling import (
    expand,
    keeping_discarded_draws,
    skipping_empty,
    spreads_exactly,
    without_rewind_by_offset,
)
from pipeline.engines.vllm import versions
from pipeline.engines.vllm.seeded_sampling import keyed_rejection_sample, keyed_sample, keyed_top_k_top_p
from pipeline.engines.vllm.versions import SPECULATOR_VERSIONS, SUPPORTED_VERSIONS, V1_VERSIONS

# vLLM's public modules: what any module of ours may import (the rest is vLLM's inside: this module's).
PUBLIC_MODULES = (
    "vllm",
    "vllm.sampling_params",
    "vllm.outputs",
    "vllm.exceptions",
    "vllm.lora.request",
    "vllm.engine.arg_utils",
)


@dataclass(frozen=True)
class Reach:
    """One thing of vLLM's, past its public surface, that we replace or read."""

    kind: str  # "correction" (a fault of vLLM's, fixed), "hook" (our behaviour in vLLM's place), "read", "setting"
    versions: tuple[str, ...]  # the vLLM versions it applies to; a correction is installed there only
    touches: str  # what of vLLM's it replaces or reads
    why: str


REACHES = {
    "expand_kernel": Reach(
        "correction",
        ("0.32.0",),
        "vllm.utils.cpu_triton_utils._expand_kernel_impl; the KernelOverride (vllm.triton_utils.dispatcher) "
        "vLLM puts in vllm.v1.sample.rejection_sampler.expand_kernel",
        "CPU builds: the kernel hands the C++ op an int64 copy of its output and never copies it back "
        "(cpu_sampling.py, fault 1)",
    ),
    "empty_top_k_top_p": Reach(
        "correction",
        ("0.32.0",),
        "vllm.v1.sample.rejection_sampler.apply_top_k_top_p",
        "a step without draft positions: the CPU top-k path's k.max() of an empty tensor kills the engine "
        "(fault 2); harmless on a GPU",
    ),
    "discarded_draws": Reach(
        "correction",
        ("0.32.0",),
        "CPUModelRunner._sample and _bookkeeping_sync (vllm.v1.worker.cpu_model_runner), "
        "reading its input_batch.generators and discard_request_mask",
        "a partial prefill chunk's discarded sample is rewound by Philox offset, which a CPU generator has not "
        "(fault 3)",
    ),
    "llvmlite_scan": Reach(
        "correction",
        ("0.32.0",),
        "the CPU worker's scan of every loaded module for Triton kernels to swap",
        "it fails on llvmlite's ffi.lib once numba is loaded (our compiled drafters load it)",
    ),
    "keyed_draws": Reach(
        "hook",
        V1_VERSIONS,
        "the V1 runner's `_sample`, its sampler's topk_topp_sampler.forward, "
        "vllm.v1.sample.rejection_sampler.rejection_sample, vllm.v1.sample.ops.topk_topp_sampler.apply_top_k_top_p; "
        "reading the runner's input_batch, requests and device",
        "a seed is a text: sampled tokens drawn with noise keyed by (seed, position) (seeded_sampling.py)",
    ),
    "fused_gumbel_argmax": Reach(
        "read",
        V1_VERSIONS,
        "torch.ops._C.fused_gumbel_argmax (vLLM's CPU kernels, loaded by its platform)",
        "the keyed draw's fused CPU kernel; drafters/primitives/keyed_noise.py draws the same with torch",
    ),
    "v1_model_runner": Reach(
        "setting",
        V1_VERSIONS,
        "VLLM_USE_V2_MODEL_RUNNER=0",
        "custom_class and the keyed draws live in the V1 runner (V2 refuses custom_class; upstream's default "
        "is V2 and V1's deprecation is under way: a vLLM without V1 ends this engine's proposer)",
    ),
    "envs_cache": Reach(
        "setting",
        ("0.32.0", "0.34.0"),
        "vllm.envs.disable_envs_cache",
        "vLLM caches its environment once an engine starts: a second engine here would read the first one's",
    ),
    "runner_reads": Reach(
        "read",
        V1_VERSIONS,
        "worker.model_runner, its `drafter` (our proposer), input_batch (req_ids, "
        "num_prompt_tokens, random_reqs), requests[id].sampling_params",
        "the proposer's requests: custom_class hands it token arrays only",
    ),
    "request_id_suffix": Reach(
        "read",
        SUPPORTED_VERSIONS,
        "the engine's request ids, f\"{LLM's id}-{8 characters}\" (v1/engine/input_processor.py)",
        "the proposer sees the engine's ids; LLM's outputs name its own",
    ),
    "scheduler_running": Reach(
        "read",
        ("0.32.0", "0.34.0"),
        "llm.llm_engine.engine_core.engine_core.scheduler.running (the in-process engine)",
        "the feeder's step accounting: the requests still running after a step",
    ),
    "engine_shutdown": Reach(
        "read",
        ("0.32.0", "0.34.0"),
        "llm.llm_engine.engine_core.shutdown()",
        "LLM has no public shutdown: the feeder ends a closed or failed engine's worker processes",
    ),
    "v2_registry": Reach(
        "hook",
        SPECULATOR_VERSIONS,
        "vllm.v1.worker.gpu.spec_decode.speculator_config.register_speculative_method (experimental: "
        "'may change between releases'), the SuffixSpeculatorConfig our config subclasses",
        "vLLM >= 0.34 runs a speculator named by method=ngrammys from its plugin registry; our general plugin "
        "registers it in every process",
    ),
    "v2_speculator": Reach(
        "hook",
        SPECULATOR_VERSIONS,
        "vllm.v1.worker.gpu.spec_decode.speculator.BaseSpeculator (init with req_states, propose, add_request, "
        "on_requests_finished, reset_state, draft_token_confidence_probs)",
        "our drafter's kernels inside the runner's asynchronous step",
    ),
    "v2_request_state": Reach(
        "read",
        SPECULATOR_VERSIONS,
        "RequestState's all_token_ids.gpu, total_len.gpu, prompt_len (.gpu and .np), req_id_to_index",
        "the token history the speculator drafts from, on the device (dense: prefer_dense_token_history)",
    ),
    "v2_logits_processor": Reach(
        "hook",
        SPECULATOR_VERSIONS,
        "vllm.v1.worker.gpu.sample.logits_processor.LogitsProcessor (add_request with SamplingParams, "
        "apply with LogitsContext's expanded_idx_mapping and pos, the request state's prompt_len), named in "
        "ModelConfig.logits_processors",
        "a request's prediction reaches the speculator (it never sees SamplingParams); a sampled request's "
        "rows are drawn with keyed noise (v2/keyed_draws.py: vLLM's rejection sampler resamples otherwise)",
    ),
}


# --- The versions (versions.py reads which is installed) -------------------------------------------


def applies(name: str) -> bool:
    """Whether REACHES[name] applies to the vLLM installed."""
    return versions.release(versions.installed_version()) in REACHES[name].versions


# --- Before an engine starts ----------------------------------------------------------------------


def prepare_environment() -> None:
    """Our settings of vLLM that depend on its version, set before an engine starts (REACHES:
    v1_model_runner, envs_cache)."""
    # The keyed draws (seeded_sampling.py) live in the V1 model runner's sampler, which vLLM 0.32 runs
    # for our proposer anyway; on a GPU it would run plain engines on its V2 runner. vLLM 0.34 has V2 only.
    if applies("v1_model_runner"):
        os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "0"
    else:
        os.environ.pop("VLLM_USE_V2_MODEL_RUNNER", None)
    # vLLM caches its environment for the process once an engine has started (envs.enable_envs_cache):
    # a second engine here (another binding, cache size or rank count) would read the first one's.
    envs = sys.modules.get("vllm.envs")
    if envs is not None:
        envs.disable_envs_cache()


@contextmanager
def llvmlite_set_aside():
    """vLLM 0.32's CPU worker, as it starts, scans every loaded module's attributes for Triton
    kernels to swap, and fails on llvmlite's `ffi.lib` (whose __getattr__ answers `__dict__` with a
    function wrapper) once numba is loaded in the process, as our batched drafter's compiled code
    loads it. That one attribute is set aside while the engine starts (REACHES: llvmlite_scan)."""
    ffi = sys.modules.get("llvmlite.binding.ffi")
    lib = getattr(ffi, "lib", None) if ffi is not None else None
    if lib is None or not applies("llvmlite_scan"):
        yield
        return
    del ffi.lib
    try:
        yield
    finally:
        ffi.lib = lib


# --- vLLM's CPU sampling corrected (cpu_sampling.py) ----------------------------------------------


def install() -> None:
    """Makes vLLM's sampling exact in this process, for the engines already started and those
    started later (idempotent; REACHES: empty_top_k_top_p, discarded_draws, expand_kernel)."""
    from vllm.platforms import current_platform
    from vllm.triton_utils.dispatcher import KernelOverride
    from vllm.utils import cpu_triton_utils
    from vllm.v1.sample import rejection_sampler

    if applies("empty_top_k_top_p"):
        rejection_sampler.apply_top_k_top_p = skipping_empty(rejection_sampler.apply_top_k_top_p)
    if not current_platform.is_cpu():
        return
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner

    if applies("discarded_draws"):
        CPUModelRunner._sample = keeping_discarded_draws(CPUModelRunner._sample)
        CPUModelRunner._bookkeeping_sync = without_rewind_by_offset(CPUModelRunner._bookkeeping_sync)
    if applies("expand_kernel"):
        cpu_triton_utils._expand_kernel_impl = expand  # what the CPU platform registers from here on
        override = rejection_sampler.expand_kernel  # the Triton kernel, or the platform's stand-in for it
        if isinstance(override, KernelOverride):
            # Registered already (a worker started before install, or spawned): the stand-in vLLM put in
            # every place that holds the kernel is pointed at `expand`, as a new registration would
            # (without its scan of every loaded module).
            override._impl = override.func = expand


def sampling_is_exact(device: torch.device | str = "cpu") -> bool:
    """Whether vLLM's rejection sampler now spreads float and integer settings over draft positions
    exactly and filters a step without draft positions, and a CPU model runner keeps discarded
    draws (run where the engine's sampler runs: on its worker, with its device's tensors)."""
    from vllm.platforms import current_platform
    from vllm.v1.sample.rejection_sampler import apply_top_k_top_p, expand_batch_to_tokens

    if current_platform.is_cpu() and applies("discarded_draws"):
        from vllm.v1.worker.cpu_model_runner import CPUModelRunner

        if not getattr(CPUModelRunner._bookkeeping_sync, "keeps_discarded_draws", False):
            return False
    return spreads_exactly(expand_batch_to_tokens, apply_top_k_top_p, device)


def check_worker(worker) -> bool:
    """On each worker of an engine (LLM.collective_rpc): install, then check on the worker's device."""
    install()
    return sampling_is_exact(getattr(worker, "device", "cpu"))


# --- The keyed draws (seeded_sampling.py) ---------------------------------------------------------


def fused_gumbel_argmax(load: bool = False):
    """vLLM's fused CPU kernel of the keyed draw, where this process has vLLM's kernels loaded (or,
    with `load`, can load them: a benchmark outside an engine; REACHES: fused_gumbel_argmax); else None."""
    try:
        if load:
            from vllm.platforms import current_platform

            current_platform.import_kernels()
        return torch.ops._C.fused_gumbel_argmax
    except (ImportError, AttributeError, RuntimeError):
        return None


def keyed_draw(logits: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """[N] int64: the keyed Gumbel-max draw of logits [N, V] with keys [N], by vLLM's fused kernel on a CPU."""
    return gumbel_argmax(logits, keys, fused_gumbel_argmax())


def install_keyed_draws(worker) -> bool:
    """On each worker of an engine (LLM.collective_rpc): its runner draws with keyed noise (REACHES: keyed_draws)."""
    from vllm.v1.sample import rejection_sampler
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p

    runner = worker.model_runner
    if not hasattr(runner, "input_batch") or not hasattr(getattr(runner, "sampler", None), "topk_topp_sampler"):
        raise RuntimeError(
            f"vLLM runs {type(runner).__name__}, not the V1 model runner whose sampler the keyed "
            "draws replace (VLLM_USE_V2_MODEL_RUNNER=0 is set by the engine: check the environment)"
        )
    rejection_sampler.rejection_sample = keyed_rejection_sample(rejection_sampler.rejection_sample, keyed_draw)
    if getattr(runner, "vllm_draws", None) is None:
        sampler = runner.sampler.topk_topp_sampler
        runner.vllm_draws = sampler.forward  # what uninstall_keyed_draws puts back
        runner._sample = types.MethodType(keyed_sample(runner._sample), runner)
        sampler.forward = keyed_top_k_top_p(sampler, sampler.forward, apply_top_k_top_p, keyed_draw)
    return True


def uninstall_keyed_draws(worker) -> bool:
    """vLLM's own draws again on this worker (the benchmark's comparison: lab/sampling.py)."""
    runner = worker.model_runner
    if getattr(runner, "vllm_draws", None) is not None:
        del runner._sample  # the class's method again
        runner.sampler.topk_topp_sampler.forward, runner.vllm_draws = runner.vllm_draws, None
    return True


# --- The model runner, as the proposer reads it (REACHES: runner_reads, request_id_suffix) ---------


def model_runner(worker):
    """The worker's model runner (the V1 runner: VLLM_USE_V2_MODEL_RUNNER=0)."""
    return worker.model_runner


def proposer_of(runner):
    """The proposer vLLM built for this runner (our NgrammysProposer, with custom_class)."""
    return runner.drafter


def request_ids(runner, rows: list[int]) -> list[str]:
    """The engine's ids of the requests in these rows of the runner's persistent batch."""
    ids = runner.input_batch.req_ids
    return [ids[row] for row in rows]


def prompt_lengths(runner, rows: list[int]) -> list[int]:
    """The prompt lengths of the requests in these rows of the runner's persistent batch."""
    lengths = runner.input_batch.num_prompt_tokens
    return [int(lengths[row]) for row in rows]


def request_params(runner, request_id: str):
    """The SamplingParams of a request the runner holds."""
    return runner.requests[request_id].sampling_params


def live_request_ids(runner):
    """The ids of the requests the runner holds (running, preempted or not scheduled this step)."""
    return runner.requests.keys()


def runs_sampled(runner) -> bool:
    """Whether a request with temperature > 0 is in the runner's persistent batch."""
    return bool(runner.input_batch.random_reqs)


def external_request_id(internal: str) -> str:
    """vLLM's engine names a request f"{its id in LLM.generate's outputs}-{8 random characters}"."""
    return internal[:-9]


# --- The in-process engine, as the feeder reads it (REACHES: scheduler_running, engine_shutdown) ---


def running_count(llm) -> Callable[[], int]:
    """A function giving the number of requests the engine's scheduler runs now (the in-process engine
    only: VLLM_ENABLE_V1_MULTIPROCESSING=0; another fails here)."""
    scheduler = llm.llm_engine.engine_core.engine_core.scheduler
    return lambda: len(scheduler.running)


def shutdown(llm) -> None:
    """Shuts the engine down, its worker processes (tensor parallel) with it."""
    llm.llm_engine.engine_core.shutdown()


# --- Model runner V2: our speculator (vLLM >= 0.34; REACHES: v2_*) ----------------------------------


def register_speculator(name: str, config_qualname: str) -> None:
    """Registers our speculator's config under `name` in vLLM's plugin registry (REACHES: v2_registry)."""
    from vllm.v1.worker.gpu.spec_decode.speculator_config import register_speculative_method

    register_speculative_method(name, config_qualname)


def speculator_config_base() -> type:
    """vLLM's SuffixSpeculatorConfig, which our config subclasses: no draft model, the dense token
    history, confidences from acceptance rates rather than draft logits (REACHES: v2_registry)."""
    from vllm.v1.worker.gpu.spec_decode.suffix.config import SuffixSpeculatorConfig

    return SuffixSpeculatorConfig


def speculator_base() -> type:
    """vLLM's BaseSpeculator, which our speculator subclasses (REACHES: v2_speculator)."""
    from vllm.v1.worker.gpu.spec_decode.speculator import BaseSpeculator

    return BaseSpeculator


def logits_processor_base() -> type:
    """vLLM's V2 LogitsProcessor, which our prediction side channel subclasses (REACHES: v2_logits_processor)."""
    from vllm.v1.worker.gpu.sample.logits_processor.interface import LogitsProcessor

    return LogitsProcessor


def token_history(req_states) -> tuple:
    """(all_token_ids [slots, max_model_len] int32, total_len [slots] int32, prompt_len [slots] int32), on
    the device, from the runner's RequestState (REACHES: v2_request_state)."""
    return req_states.all_token_ids.gpu, req_states.total_len.gpu, req_states.prompt_len.gpu


def slot_prompt_lengths(req_states) -> torch.Tensor:
    """[slots] int32 on the device: each slot's prompt length, from a V2 logits processor's request
    state, read at each step (vLLM replaces the buffer as it writes it; REACHES: v2_logits_processor)."""
    return req_states.prompt_len.gpu


def finished_slots(req_states, request_ids) -> tuple[list[int], list[int]]:
    """(slots, prompt lengths) of these finished requests, in sorted id order (every rank alike),
    read on the host before their slots are freed (REACHES: v2_request_state)."""
    slots, prompts = [], []
    for request_id in sorted(request_ids):
        slot = req_states.req_id_to_index.get(request_id)
        if slot is not None:
            slots.append(slot)
            prompts.append(int(req_states.prompt_len.np[slot]))
    return slots, prompts
