"""Model bigram and extended bigram drafters (N-Grammys §4.1): look up the last token's row.

Both read a [V, K, W] table: row j of token x is the bigram's j-th most likely next token followed
by a greedy continuation (the bigram's chained top-1, or the model's own; see model_tables).
"""

from __future__ import annotations

import numpy as np
import torch

from drafters.base import DraftContext, Drafts


class BigramDrafter:
    def __init__(self, table: np.ndarray, strategy: str):  # table: [V, K, W] int32
        self.table = table
        self.strategy = strategy

    def rows(self, last_token: int, k: int, w: int) -> torch.Tensor:  # [k, w]
        _, max_k, max_w = self.table.shape
        assert k <= max_k and w <= max_w, f"table holds {max_k} rows of {max_w} tokens; asked for [{k}, {w}]"
        return torch.from_numpy(np.array(self.table[last_token, :k, :w], dtype=np.int64))

    def propose(self, context: DraftContext, k: int, w: int) -> Drafts:
        # The bigram's top-k next tokens are distinct, so rows are distinct: no padding needed.
        return Drafts(tokens=self.rows(context.tokens[-1], k, w), strategies=(self.strategy,) * k)
