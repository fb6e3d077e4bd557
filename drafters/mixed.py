"""Mixed drafter (N-Grammys §4.3): context n-gram rows first, as many as it finds; then retrieved
rows when a datastore is configured; a model table fills the rest."""

from __future__ import annotations

from drafters.base import DraftContext, Drafts, pad_rows
from drafters.bigram import BigramDrafter
from drafters.context_ngram import STRATEGY as NGRAM
from drafters.context_ngram import ContextNgramDrafter
from drafters.retrieval import STRATEGY as RETRIEVAL
from drafters.retrieval import RetrievalDrafter


class MixedDrafter:
    def __init__(
        self,
        ngram: ContextNgramDrafter,
        fill: BigramDrafter,
        pad_token: int = 0,
        retrieval: RetrievalDrafter | None = None,
    ):
        self.ngram = ngram
        self.fill = fill
        self.retrieval = retrieval
        self.pad_token = pad_token

    def propose(self, context: DraftContext, k: int, w: int) -> Drafts:
        rows = self.ngram.find(context, k, w)
        strategies = [NGRAM] * len(rows)
        if self.retrieval is not None and len(rows) < k:
            retrieved = self.retrieval.rows(context, k, w)
            rows += retrieved
            strategies += [RETRIEVAL] * len(retrieved)
        # Ask the fill for k rows: some may duplicate earlier rows and are dropped by pad_rows.
        rows += self.fill.rows(context.tokens[-1], k, w).tolist()
        strategies += [self.fill.strategy] * k
        return pad_rows(rows, strategies, k, w, self.pad_token)
