"""Mixed drafter (N-Grammys §4.3): context n-gram rows first, as many as it finds; a model table fills the rest."""
from __future__ import annotations

from drafters.base import DraftContext, Drafts, pad_rows
from drafters.bigram import BigramDrafter
from drafters.context_ngram import STRATEGY as NGRAM, ContextNgramDrafter


class MixedDrafter:
    def __init__(self, ngram: ContextNgramDrafter, fill: BigramDrafter, pad_token: int = 0):
        self.ngram, self.fill = ngram, fill
        self.pad_token = pad_token

    def propose(self, context: DraftContext, k: int, w: int) -> Drafts:
        rows = self.ngram.find(context, k, w)
        strategies = [NGRAM] * len(rows)
        # Ask the fill for k rows: some may duplicate n-gram rows and are dropped by pad_rows.
        rows += self.fill.rows(context.tokens[-1], k, w).tolist()
        strategies += [self.fill.strategy] * k
        return pad_rows(rows, strategies, k, w, self.pad_token)
