"""The transformers engine: our own speculative decoder over a Hugging Face model.

Its public surface is what this file exports; everything else in the folder (decoders, request
lifecycle, verifier, draft trees, KV caches, attention) is its own business.
"""
from pipeline.engines.transformers.attention import NAME as GQA_ATTENTION
from pipeline.engines.transformers.attention import attention_implementation, use_gqa_attention
from pipeline.engines.transformers.engine import TransformersEngine

__all__ = ["GQA_ATTENTION", "TransformersEngine", "attention_implementation", "use_gqa_attention"]
