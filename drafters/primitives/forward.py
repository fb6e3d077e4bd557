"""Running a Hugging Face model over a token prefix once, for whoever needs its cache: the drafter
tables (drafters/model_tables.py) and the transformers engine (pipeline/engines/transformers/)."""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


def full_layers(cache: DynamicCache, allowed: tuple[type, ...] = (DynamicLayer,)) -> list[DynamicLayer]:
    """The cache's layers, each checked to be a full-attention layer of an `allowed` type: a
    sliding-window layer drops old entries on its own, which a copy or a row selection cannot follow."""
    layers = cache.layers
    for layer in layers:
        if type(layer) not in allowed:
            raise NotImplementedError(
                f"speculative decoding supports full-attention DynamicCache layers, not {type(layer).__name__}"
            )
    return layers


def expanded_copy(cache: DynamicCache, batch_size: int) -> DynamicCache:
    """A new cache holding `batch_size` copies of a batch-1 cache (the original is left as is)."""
    data = [
        (layer.keys.expand(batch_size, -1, -1, -1), layer.values.expand(batch_size, -1, -1, -1))
        for layer in full_layers(cache)
    ]
    return DynamicCache(data)


@torch.no_grad()
def prefill(model, token_ids: list[int]) -> DynamicCache:
    """Runs the model over `token_ids` once and returns the cache (empty when there are none)."""
    cache = DynamicCache(config=model.config)
    if token_ids:
        # Only the cache is wanted: logits for one position, not the LM head over the whole prompt
        # (for SmolLM2 the head costs as much as 8 of its 30 layers per token).
        model(
            input_ids=torch.tensor([token_ids], device=model.device),
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
    return cache
