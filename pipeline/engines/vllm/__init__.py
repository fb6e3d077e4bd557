"""The vLLM engine: vLLM runs the model, our drafter is its proposer. Its public surface is
VllmEngine and how its feeder admits requests (WAITING_SHARE); vLLM loads the proposer
(proposer.py) by its dotted path."""
from pipeline.engines.vllm.engine import VllmEngine
from pipeline.engines.vllm.feeder import WAITING_SHARE

__all__ = ["WAITING_SHARE", "VllmEngine"]
