"""The transformers engine: our own speculative decoder over a Hugging Face model.

Its public surface is what this file exports (KIND: what it declares of its settings, settings.py);
everything else in the folder (decoders, request lifecycle, verifier, draft trees, KV caches,
attention) is its own business.
"""

from pipeline.engines.transformers.attention import NAME as GQA_ATTENTION
from pipeline.engines.transformers.attention import attention_implementation, use_gqa_attention
from pipeline.engines.transformers.engine import TransformersEngine
from pipeline.engines.transformers.settings import KIND

__all__ = ["GQA_ATTENTION", "KIND", "TransformersEngine", "attention_implementation", "use_gqa_attention"]
