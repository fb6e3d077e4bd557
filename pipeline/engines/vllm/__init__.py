"""The vLLM engine: vLLM runs the model, our drafter is its proposer. Its public surface is
VllmEngine, how its feeder admits requests (WAITING_SHARE) and how it shares a CPU's cores among
tensor-parallel ranks (cpu_binding); vLLM loads the proposer
(proposer.py) by its dotted path."""
from pipeline.engines.vllm.engine import VllmEngine, cpu_binding
from pipeline.engines.vllm.feeder import WAITING_SHARE

__all__ = ["WAITING_SHARE", "VllmEngine", "cpu_binding"]
