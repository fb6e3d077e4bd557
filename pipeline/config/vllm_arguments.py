"""vLLM's engine arguments under their own names, in one table: which config field holds each one
that is not passed through as given (vllm.engine_args)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from collections.abc import Callable


@dataclass(frozen=True)
class VllmArgument:
    """One of vLLM's engine arguments that is not passed through as given (vllm.engine_args): the
    config field that holds it (`section.key`, converted from vLLM's value by `convert`), or the one
    value the engine runs (`only`), or who sets it (`set_by`)."""

    field: str = ""
    convert: Callable[[Any], Any] = lambda value: value
    only: Any = None
    set_by: str = ""

    def where(self) -> str:
        return f"{self.field} sets it" if self.field else self.set_by


# vLLM's engine arguments under their own names, in one table: pipeline.llm maps a processor's
# engine_kwargs through it, vllm.engine_args refuses what it holds, the vLLM engine passes the fields
# back to vLLM by these names. Any other argument goes to vLLM as it is (checked against EngineArgs).
VLLM_ARGUMENTS = {
    **{
        name: VllmArgument(f"vllm.{name}")
        for name in (
            "max_model_len",
            "max_num_seqs",
            "max_num_batched_tokens",
            "gpu_memory_utilization",
            "tensor_parallel_size",
        )
    },
    # vLLM 0.32 cannot speculate with pipeline parallelism (its earlier stages have no proposer).
    "pipeline_parallel_size": VllmArgument("vllm.pipeline_parallel_size", only=1),
    "dtype": VllmArgument("model.dtype"),
    "trust_remote_code": VllmArgument("model.trust_remote_code"),
    "enforce_eager": VllmArgument("vllm.execution", lambda eager: "eager" if eager else "compiled"),
    # Rows without a seed derive theirs from it (the engine's own seed is fixed).
    "seed": VllmArgument("sampling.seed", int),
    "enable_chunked_prefill": VllmArgument(only=True, set_by="the engine runs it (vLLM's default)"),
    "model": VllmArgument(set_by="model.name sets it"),
    "tokenizer": VllmArgument(set_by="model.name sets it"),
    "speculative_config": VllmArgument(
        set_by="drafting.drafter and drafting.w set it (vllm_ngram and vllm_suffix are vLLM's own methods)"
    ),
    "disable_log_stats": VllmArgument(set_by="vllm.request_metrics sets it"),
    "distributed_executor_backend": VllmArgument(
        set_by="the engine sets it (tensor-parallel ranks are the actor's own processes)"
    ),
    "per_request_spec_decode_metrics": VllmArgument(set_by="the engine sets it (the rows' statistics need it)"),
    "logits_processors": VllmArgument(
        set_by="the engine sets it (on vLLM 0.34 our drafter's prediction processor is one: "
        "pipeline/engines/vllm/v2/predictions.py)"
    ),
}
