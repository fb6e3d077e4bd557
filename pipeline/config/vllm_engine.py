"""The `vllm` section: the vLLM engine's settings, its engine arguments by vLLM's names (the
transformers engine's are its own section, pipeline/config/transformers_engine.py; the transformers
engine refuses these where they are not their defaults)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pipeline.config.typed import require as _require
from pipeline.config.vllm_arguments import VLLM_ARGUMENTS

# vllm.max_num_seqs 0 on a CPU: the most requests one vLLM engine runs at once there: the best of
# 8, 16, 32 and 64 on a 2-core CPU (docs/measurements/defaults.md, "Figures behind the defaults").
CPU_MAX_NUM_SEQS = 64


@dataclass(frozen=True)
class VllmConfig:
    # the most tokens (prompt + generated) a request may have; 0 takes the model's own.
    max_model_len: int = 0
    # vLLM on a CPU: GiB of memory for the KV cache of each actor.
    cpu_kv_cache_gib: int = 2
    # vLLM on a GPU: the fraction of the GPU's memory vLLM may take.
    gpu_memory_utilization: float = 0.9
    # "compiled" (torch.compile, and CUDA graphs on a GPU) or "eager" (nothing compiled, vLLM's
    # sampler helpers included). Compiled runs faster but a CPU takes minutes per actor start to compile
    # (docs/measurements/defaults.md, "Figures behind the defaults"). "auto": compiled on a GPU, eager on a CPU.
    execution: Literal["auto", "eager", "compiled"] = "auto"
    # the requests the engine runs at once (its slots), as vLLM names it. 0: vLLM's own
    # default on a GPU (it depends on the GPU: 256 on an A100, 1024 on an H100), CPU_MAX_NUM_SEQS
    # on a CPU. The engine is fed continuously: a slot freed is refilled at the next step.
    max_num_seqs: int = 0
    # the most tokens one engine step may feed the model; 0: vLLM's own default.
    max_num_batched_tokens: int = 0
    # keep its per-request timing record (RequestStateStats: queued, scheduled, first and
    # last token), as ray.data.llm's `metrics` column; vLLM's own statistics are then on too.
    request_metrics: bool = False
    # the GPUs one engine's model is split over (its worker processes, on the actor's node;
    # the actor asks Ray for all of them). On a CPU each rank takes an equal share of the actor's cores.
    # (The transformers engine runs on one device: it refuses more.)
    tensor_parallel_size: int = 1
    # the model's layers split over this many ranks. Only 1: vLLM 0.32 cannot speculate with
    # pipeline parallelism (its earlier stages' model runners have no proposer).
    pipeline_parallel_size: int = 1
    # any other of vLLM's engine arguments (vllm.engine.arg_utils.EngineArgs: quantization,
    # kv_cache_dtype, enable_prefix_caching, ...), given to vLLM as they are; checked against
    # EngineArgs when the job starts (the transformers engine refuses them). Those set above, or by
    # the model and drafting sections, are refused here, naming the field that sets them.
    engine_args: dict = field(default_factory=dict)

    def __post_init__(self):
        _require(self.max_model_len >= 0, "vllm.max_model_len", "an integer >= 0 (0: the model's own)")
        _require(self.cpu_kv_cache_gib >= 1, "vllm.cpu_kv_cache_gib", "an integer >= 1 (GiB)")
        _require(0 < self.gpu_memory_utilization <= 1, "vllm.gpu_memory_utilization", "a number in (0, 1]")
        _require(self.max_num_seqs >= 0, "vllm.max_num_seqs", "an integer >= 0 (0: the default for the hardware)")
        _require(self.max_num_batched_tokens >= 0, "vllm.max_num_batched_tokens", "an integer >= 0 (0: vLLM's default)")
        _require(self.tensor_parallel_size >= 1, "vllm.tensor_parallel_size", "an integer >= 1")
        _require(
            self.pipeline_parallel_size == 1,
            "vllm.pipeline_parallel_size",
            "1: vLLM 0.32 cannot speculate with pipeline parallelism (its earlier stages have no proposer)",
        )
        for key in self.engine_args:
            _require(
                key not in VLLM_ARGUMENTS,
                f"vllm.engine_args.{key}",
                f"left out: {VLLM_ARGUMENTS[key].where() if key in VLLM_ARGUMENTS else ''}",
            )
