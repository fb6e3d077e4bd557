"""The `engine` section: which engine runs the model, and the vLLM engine's own settings (its engine
arguments; the transformers engine's are its section, pipeline/config/transformers_engine.py)."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from typing import ClassVar, Literal

from pipeline.config.typed import require as _require
from pipeline.config.vllm_arguments import VLLM_ARGUMENTS

# The values engine.name takes once resolved ("auto": the installed one, installed_engine).
ENGINES = ("vllm", "transformers")


def installed_engine() -> str:
    """The engine `engine.name: auto` means here: vllm where it is installed, else transformers."""
    return "vllm" if importlib.util.find_spec("vllm") is not None else "transformers"


@dataclass(frozen=True)
class EngineConfig:
    # "vllm": vLLM runs the model, with our drafter as its proposer (the fast path: one draft row
    # per request, its length chosen per request with w: auto). "transformers": our own decoder,
    # the only engine with k > 1 drafts, tree verification, draft models and lenience (its own
    # section, `transformers:`). "auto" is resolved when the config is loaded: vllm where it is
    # installed, else transformers. The fields below marked vLLM are vLLM's engine arguments.
    # A key of this section that moved, and where it is now: it is refused naming that place.
    MOVED: ClassVar[dict[str, str]] = {
        name: f"drafting.{name}" for name in ("speculation", "speculation_window_s", "prediction_w")
    }
    name: Literal["auto", "vllm", "transformers"] = "auto"
    # vLLM: the most tokens (prompt + generated) a request may have; 0 takes the model's own.
    max_model_len: int = 0
    # vLLM on a CPU: GiB of memory for the KV cache of each actor.
    cpu_kv_cache_gib: int = 2
    # vLLM on a GPU: the fraction of the GPU's memory vLLM may take.
    gpu_memory_utilization: float = 0.9
    # vLLM: "compiled" (torch.compile, and CUDA graphs on a GPU) or "eager" (nothing compiled, vLLM's
    # sampler helpers included). Compiled runs faster but a CPU takes minutes per actor start to compile
    # (docs/measurements/defaults.md, "Figures behind the defaults"). "auto": compiled on a GPU, eager on a CPU.
    execution: Literal["auto", "eager", "compiled"] = "auto"
    # vLLM: the requests the engine runs at once (its slots), as vLLM names it. 0: vLLM's own
    # default on a GPU (it depends on the GPU: 256 on an A100, 1024 on an H100), CPU_MAX_NUM_SEQS
    # on a CPU. The engine is fed continuously: a slot freed is refilled at the next step.
    max_num_seqs: int = 0
    # vLLM: the most tokens one engine step may feed the model; 0: vLLM's own default.
    max_num_batched_tokens: int = 0
    # vLLM: keep its per-request timing record (RequestStateStats: queued, scheduled, first and
    # last token), as ray.data.llm's `metrics` column; vLLM's own statistics are then on too.
    request_metrics: bool = False
    # vLLM: the GPUs one engine's model is split over (its worker processes, on the actor's node;
    # the actor asks Ray for all of them). On a CPU each rank takes an equal share of the actor's cores.
    # (The transformers engine runs on one device: it refuses more.)
    tensor_parallel_size: int = 1
    # vLLM: the model's layers split over this many ranks. Only 1: vLLM 0.32 cannot speculate with
    # pipeline parallelism (its earlier stages' model runners have no proposer).
    pipeline_parallel_size: int = 1
    # vLLM: any other of vLLM's engine arguments (vllm.engine.arg_utils.EngineArgs: quantization,
    # kv_cache_dtype, enable_prefix_caching, ...), given to vLLM as they are; checked against
    # EngineArgs when the job starts (the transformers engine refuses them). Those set above, or by
    # the model and decoder sections, are refused here, naming the field that sets them.
    vllm_args: dict = field(default_factory=dict)
    # An engine that fails inside a live actor (an error out of a step, a worker process gone) is
    # closed and built again, its batches in flight generated again on the new one (a step that
    # makes no progress for hang_timeout_s ends the actor instead, and Ray starts it again). More
    # than max_restarts failures of one actor's engines within restart_window_s stop the job,
    # naming the last failure. hang_timeout_s 0: never counted as hung (vLLM engine).
    hang_timeout_s: float = 600.0
    max_restarts: int = 3
    restart_window_s: float = 3600.0

    def __post_init__(self):
        _require(self.hang_timeout_s >= 0, "engine.hang_timeout_s", "a number of seconds >= 0 (0: no limit)")
        _require(self.max_restarts >= 0, "engine.max_restarts", "an integer >= 0 (0: a failed engine stops the job)")
        _require(self.restart_window_s > 0, "engine.restart_window_s", "a number of seconds > 0")
        if self.name == "auto":
            object.__setattr__(self, "name", installed_engine())  # frozen: resolved once, here
        _require(self.max_model_len >= 0, "engine.max_model_len", "an integer >= 0 (0: the model's own)")
        _require(self.cpu_kv_cache_gib >= 1, "engine.cpu_kv_cache_gib", "an integer >= 1 (GiB)")
        _require(0 < self.gpu_memory_utilization <= 1, "engine.gpu_memory_utilization", "a number in (0, 1]")
        _require(self.max_num_seqs >= 0, "engine.max_num_seqs", "an integer >= 0 (0: the default for the hardware)")
        _require(
            self.max_num_batched_tokens >= 0, "engine.max_num_batched_tokens", "an integer >= 0 (0: vLLM's default)"
        )
        _require(self.tensor_parallel_size >= 1, "engine.tensor_parallel_size", "an integer >= 1")
        _require(
            self.pipeline_parallel_size == 1,
            "engine.pipeline_parallel_size",
            "1: vLLM 0.32 cannot speculate with pipeline parallelism (its earlier stages have no proposer)",
        )
        for key in self.vllm_args:
            _require(
                key not in VLLM_ARGUMENTS,
                f"engine.vllm_args.{key}",
                f"left out: {VLLM_ARGUMENTS[key].where() if key in VLLM_ARGUMENTS else ''}",
            )


# engine.max_num_seqs 0 on a CPU: the most requests one vLLM engine runs at once there: the best of
# 8, 16, 32 and 64 on a 2-core CPU (docs/measurements/defaults.md, "Figures behind the defaults").
CPU_MAX_NUM_SEQS = 64
