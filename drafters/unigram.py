"""Model unigram drafter (N-Grammys §4.1): context-free, the most likely tokens by embedding geometry."""

from __future__ import annotations

import numpy as np

from drafters.base import DraftContext, Drafts, pad_rows

STRATEGY = "unigram"


class UnigramDrafter:
    def __init__(self, ranking: np.ndarray, pad_token: int = 0):  # ranking: [K] token ids, best first
        self.ranking = np.asarray(ranking)
        self.pad_token = pad_token

    def propose(self, context: DraftContext, k: int, w: int) -> Drafts:
        # Row j starts with the j-th most likely token; being context-free, the unigram has nothing
        # better for later positions than its top-1 token.
        top = [int(t) for t in self.ranking[:k]]
        rows = [[token] + [top[0]] * (w - 1) for token in top]
        return pad_rows(rows, [STRATEGY] * len(rows), k, w, self.pad_token)
