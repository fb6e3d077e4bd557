"""KV-cache handling for batched verification on top of transformers' DynamicCache.

The context's cache is held once (batch 1). A step shows it to k draft rows as a broadcast view
(no copy, no recompute); the forward call appends the k rows' new entries; afterwards only the
winning row's accepted entries are kept.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from drafters.primitives.forward import full_layers

# Columns a layer reserves past its length, so that a call appends in place (no copy of the cache).
SLACK_COLUMNS = 128


class SlackLayer(DynamicLayer):
    """A DynamicLayer whose keys/values are views of the first columns of a larger buffer: a call's
    new entries are written into the free columns instead of concatenated (which copies the whole
    layer every call). Whoever replaces `keys`/`values` with other tensors (row changes, compaction)
    costs one copy into a fresh buffer at the next call."""

    _key_buffer: torch.Tensor | None = None
    _value_buffer: torch.Tensor | None = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        self.keys, self._key_buffer = appended(self.keys, self._key_buffer, key_states)
        self.values, self._value_buffer = appended(self.values, self._value_buffer, value_states)
        return self.keys, self.values


def appended(view: torch.Tensor, buffer: torch.Tensor | None, new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(view of view + new along the columns, its buffer): written in place when `view` is the
    start of `buffer` and the new columns fit, else into a new buffer with SLACK_COLUMNS spare."""
    length, total = view.shape[2], view.shape[2] + new.shape[2]  # [B, H, L, D]
    in_place = (
        buffer is not None
        and view.data_ptr() == buffer.data_ptr()
        and view.shape[:2] == buffer.shape[:2]
        and view.stride() == buffer.stride()
        and buffer.shape[2] >= total
    )
    if not in_place:
        buffer = view.new_empty(view.shape[0], view.shape[1], total + SLACK_COLUMNS, view.shape[3])
        buffer[:, :, :length] = view
    buffer[:, :, length:total] = new
    return buffer[:, :, :total], buffer


def _full_layers(cache: DynamicCache) -> list[DynamicLayer]:
    return full_layers(cache, (DynamicLayer, SlackLayer))


def share_context(cache: DynamicCache, k: int) -> None:
    """Makes the batch-1 cache serve k rows as a broadcast view of the same memory."""
    for layer in _full_layers(cache):
        if layer.is_initialized and layer.keys.numel():
            layer.keys = layer.keys.expand(k, -1, -1, -1)
            layer.values = layer.values.expand(k, -1, -1, -1)


def keep_row(cache: DynamicCache, row: int, length: int) -> None:
    """Keeps row `row`'s first `length` cache positions as a batch-1 cache."""
    for layer in _full_layers(cache):
        if layer.is_initialized and layer.keys.numel():
            layer.keys = layer.keys[row : row + 1, :, :length]
            layer.values = layer.values[row : row + 1, :, :length]


def keep_positions(cache: DynamicCache, length: int, extra: list[int]) -> None:
    """Keeps the first `length` cache positions followed by positions `extra` (increasing)."""
    index = torch.tensor(list(range(length)) + extra)
    for layer in _full_layers(cache):
        if layer.is_initialized and layer.keys.numel():
            index = index.to(layer.keys.device)
            layer.keys = layer.keys.index_select(2, index)
            layer.values = layer.values.index_select(2, index)


@torch.no_grad()
def prefill_many(model, prompts: list[list[int]]) -> DynamicCache:
    """Runs the model over several token lists in one call, left-padded to the longest: row j's
    cache entries for prompts[j] are its last len(prompts[j]) columns (padding is masked out)."""
    width = max(len(tokens) for tokens in prompts)
    cache = DynamicCache(config=model.config)
    if width == 0:
        return cache
    input_ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros(len(prompts), width, dtype=torch.long)
    for row, tokens in enumerate(prompts):
        if tokens:
            input_ids[row, width - len(tokens) :] = torch.tensor(tokens)
            mask[row, width - len(tokens) :] = 1
    positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
    device = model.device
    model(
        input_ids=input_ids.to(device),
        attention_mask=mask.to(device),
        position_ids=positions.to(device),
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=1,
    )
    return cache
