"""The vLLM engine: vLLM runs the model, our drafter is its proposer. Its public surface is
VllmEngine; vLLM loads the proposer (proposer.py) by its dotted path."""
from pipeline.engines.vllm.engine import VllmEngine

__all__ = ["VllmEngine"]
