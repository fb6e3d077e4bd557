"""The transformers engine: our own speculative decoder over a Hugging Face model.

Its public surface is what this file exports; everything else in the folder (decoders, request
lifecycle, verifier, draft trees, KV caches, attention, the call-cost model) is its own business.
"""
from pipeline.engines.transformers.attention import NAME as GQA_ATTENTION
from pipeline.engines.transformers.attention import (
           attention_implementation,
           use_gqa_attention,
)
from pipeline.engines.transformers.cost_model import (
           GRID_CONTEXT,
           CostModel,
           cached_cost_model,
           measure,
)
from pipeline.engines.transformers.engine import TransformersEngine

__all__ = ["GQA_ATTENTION", "GRID_CONTEXT", "CostModel", "TransformersEngine", "attention_implementation",
           "cached_cost_model", "measure", "use_gqa_attention"]
