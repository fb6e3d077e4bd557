"""ray.data.llm's API on our engine (processor.py: `build_processor`; processor_config.py: its
`vLLMEngineProcessorConfig`) and its stage of actors: the stage, the actor pool, the one schema,
sampling params, row values, checkpoints, progress and live metrics.

The processor's names load on first use, so that `pipeline.llm.schema`
does not import Ray Data, torch and the engines."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pipeline.llm.processor import Processor, build_processor, vLLMEngineProcessorConfig

__all__ = ["Processor", "build_processor", "vLLMEngineProcessorConfig"]


def __getattr__(name: str):
    if name in __all__:
        from pipeline.llm import processor

        return getattr(processor, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
