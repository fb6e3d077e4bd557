"""The `engine` section: which engine runs the model, and what a failed engine may cost the run.
Each engine's own settings are its section: `vllm` (pipeline/config/vllm_engine.py) and
`transformers` (pipeline/config/transformers_engine.py)."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import ClassVar, Literal

from pipeline.config.typed import require as _require

# The values engine.name takes once resolved ("auto": the installed one, installed_engine).
ENGINES = ("vllm", "transformers")
# The vLLM settings this section held, now the `vllm` section's.
VLLM_FIELDS = (
    "max_model_len",
    "cpu_kv_cache_gib",
    "gpu_memory_utilization",
    "execution",
    "max_num_seqs",
    "max_num_batched_tokens",
    "request_metrics",
    "tensor_parallel_size",
    "pipeline_parallel_size",
)


def installed_engine() -> str:
    """The engine `engine.name: auto` means here: vllm where it is installed, else transformers."""
    return "vllm" if importlib.util.find_spec("vllm") is not None else "transformers"


@dataclass(frozen=True)
class EngineConfig:
    # A key of this section that moved, and where it is now: it is refused naming that place.
    MOVED: ClassVar[dict[str, str]] = {
        **{name: f"drafting.{name}" for name in ("speculation", "speculation_window_s", "prediction_w")},
        **{name: f"vllm.{name}" for name in VLLM_FIELDS},
        "vllm_args": "vllm.engine_args",
    }
    name: Literal["auto", "vllm", "transformers"] = "auto"
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
