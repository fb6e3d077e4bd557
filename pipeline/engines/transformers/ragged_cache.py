"""A KV cache for many requests at once, each with its own length and its own accepted tokens.

Rows of one DynamicCache hold different requests. Columns are shared slots: `valid` [B, L] says
which columns a row's queries may attend to, so rows of different lengths, and columns left over
from rejected drafts or from a finished request, need no copy; they are masked. Positions are
given explicitly (rotary embeddings are applied before caching), so a token's column is free.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from pipeline.engines.transformers.kv_cache import SlackLayer, _full_layers
from pipeline.engines.transformers.tree import additive_mask


def empty_cache(model) -> DynamicCache:
    """A cache of 0 rows and 0 columns, with every layer's shape fixed (so rows can be added)."""
    config = model.config
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    cache = DynamicCache()
    cache.layers = []
    empty = torch.zeros(0, heads, 0, head_dim, dtype=model.dtype, device=model.device)
    for _ in range(config.num_hidden_layers):
        layer = SlackLayer()
        layer.lazy_initialization(empty, empty)
        layer.keys = layer.values = empty  # [0, H, 0, D]: rows and columns are added by put
        cache.layers.append(layer)
    return cache


class RaggedCache:
    def __init__(self, model):
        self.cache = empty_cache(model)
        self.valid = torch.zeros(0, 0, dtype=torch.bool)  # [B, L]

    @property
    def rows(self) -> int:
        return self.valid.shape[0]

    @property
    def columns(self) -> int:
        return self.valid.shape[1]

    def _resize(self, rows: int, left_columns: int) -> None:
        """Adds empty rows at the bottom and empty columns on the left (copies the cache once)."""
        if not rows and not left_columns:
            return
        for layer in _full_layers(self.cache):
            for name in ("keys", "values"):
                old = getattr(layer, name)  # [B, H, L, D]
                new = old.new_zeros(old.shape[0] + rows, old.shape[1], old.shape[2] + left_columns, old.shape[3])
                new[: old.shape[0], :, left_columns:] = old
                setattr(layer, name, new)
        valid = torch.zeros(self.rows + rows, self.columns + left_columns, dtype=torch.bool)
        valid[: self.rows, left_columns:] = self.valid
        self.valid = valid

    def put(self, row: int, prefix: DynamicCache, length: int, source_row: int = 0) -> None:
        """Makes `row` (a new row if row == rows) hold a request whose entries are the last
        `length` columns of row `source_row` of `prefix` (a prefill's cache), right-aligned in the
        columns; whatever the row held is dropped."""
        assert row <= self.rows
        self._resize(1 if row == self.rows else 0, max(0, length - self.columns))
        self.valid[row] = False
        if length:
            start = self.columns - length
            for layer, source in zip(_full_layers(self.cache), _full_layers(prefix)):
                layer.keys[row, :, start:] = source.keys[source_row, :, -length:]
                layer.values[row, :, start:] = source.values[source_row, :, -length:]
            self.valid[row, start:] = True

    def attention_mask(self, visible_new: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Additive mask [B, 1, N, L+N] for a call feeding N new tokens per row; visible_new
        [B, N, N] says which new tokens each new token sees (itself included)."""
        rows, width = visible_new.shape[:2]
        visible = torch.cat([self.valid[:, None, :].expand(rows, width, self.columns), visible_new], dim=2)
        return additive_mask(visible, dtype)

    def keep_new(self, kept: list[list[int]], width: int) -> None:
        """After a call appended `width` columns, keeps row b's new columns kept[b] (offsets into
        them, increasing) and drops the rest; the kept ones move to the front of the new columns."""
        start = self.columns
        keep = max(len(offsets) for offsets in kept)
        index = torch.zeros(self.rows, keep, dtype=torch.long)
        new_valid = torch.zeros(self.rows, keep, dtype=torch.bool)
        for row, offsets in enumerate(kept):
            index[row, : len(offsets)] = torch.tensor(offsets, dtype=torch.long)
            new_valid[row, : len(offsets)] = True
        for layer in _full_layers(self.cache):
            gather = index.to(layer.keys.device)[:, None, :, None].expand(
                -1, layer.keys.shape[1], -1, layer.keys.shape[3]
            )
            for name in ("keys", "values"):
                tensor = getattr(layer, name)  # [B, H, start + width, D]
                moved = tensor[:, :, start:].gather(2, gather)
                tensor[:, :, start : start + keep] = moved
                setattr(layer, name, tensor[:, :, : start + keep])  # a view: no copy
        self.valid = torch.cat([self.valid, new_valid], dim=1)

    def select_rows(self, rows: list[int]) -> None:
        index = torch.tensor(rows, dtype=torch.long)
        for layer in _full_layers(self.cache):
            layer.keys = layer.keys.index_select(0, index.to(layer.keys.device))
            layer.values = layer.values.index_select(0, index.to(layer.values.device))
        self.valid = self.valid[index]

    def compact(self, min_fraction: float = 0.25) -> None:
        """Drops the columns no row attends to, once they are at least min_fraction of all."""
        used = self.valid.any(dim=0)  # [L]
        if self.columns == 0 or (~used).sum() < min_fraction * self.columns:
            return
        index = used.nonzero().squeeze(1)
        for layer in _full_layers(self.cache):
            layer.keys = layer.keys.index_select(2, index.to(layer.keys.device))
            layer.values = layer.values.index_select(2, index.to(layer.values.device))
        self.valid = self.valid[:, index]
