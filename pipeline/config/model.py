"""The `model` section: which model, in which dtype, from where."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pipeline.config.typed import require as _require


@dataclass(frozen=True)
class ModelConfig:
    # A Hugging Face model directory, a .gguf file, a hub id (ORG/NAME) in the local Hugging Face
    # cache, or "smollm2-135m-instruct" (embedded default).
    name: str = "smollm2-135m-instruct"
    # Weights are computed in this dtype. "auto": bfloat16 where the process has a GPU, float32 on
    # a CPU (where bfloat16 is slower and float32 keeps greedy argmax stable).
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    # Off unless the user turns it on: remote code runs arbitrary Python from the model repo.
    trust_remote_code: bool = False
    # Where converted GGUF models and drafter tables are cached; "" means ~/.cache/ngrammys.
    cache_dir: str = ""
    # Torch (and vLLM's CPU kernels') threads per actor; 0 leaves torch's default, which under Ray
    # is the actor's num_cpus rounded down (one thread for a fractional actor). 2 suits a laptop;
    # on a CPU node give an actor the cores it may use.
    num_threads: int = 2

    def __post_init__(self):
        _require(bool(self.name), "model.name", "a model directory, a .gguf file or 'smollm2-135m-instruct'")
        _require(self.num_threads >= 0, "model.num_threads", "an integer >= 0")
