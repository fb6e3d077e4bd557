"""Suffix drafter: drafts from what the corpus job has already written (in the spirit of
SuffixDecoding, arXiv 2411.04975; learning-free, no model calls).

Three sources know continuations of the context's current suffix:
- `context`: the request's own tokens (DraftContext's n-gram index, grown as tokens are emitted);
- `outputs`: the outputs this drafter's process has finished (OutputStore: an n-gram index over
  a bounded buffer of their tokens, shared by every request of the actor);
- `store`: a token datastore built from earlier runs' outputs (drafters/datastore.py; memory-
  mapped, so every actor of a node maps one read-only copy).
The longest suffix (max_q down to min_q tokens) that any source has seen decides; the
continuations the matching sources have for it make one trie, where a path's probability is the
mean over those sources of the share of their continuations that start with it. A row follows
the most probable child from the root while the path's probability stays >= min_probability, so
the draft is long where the corpus agrees and short where it does not. A row's strategy is
`suffix_<source>`, the source that gave its first token the largest share.
When no source matches, the model's bigram row fills in (strategy `bigram`). Rows are as long
as the evidence (`Drafts.lengths`); the engines verify that many tokens.

Memory is bounded by OutputStore.max_tokens: past it the oldest half of the finished outputs is
dropped and the index rebuilt (amortised constant work per stored token).
"""
from __future__ import annotations

from collections import defaultdict

import numpy as np
import torch

from drafters.base import PADDING, DraftContext, Drafts
from drafters.bigram import BigramDrafter
from drafters.context_ngram import continuation
from drafters.datastore import SEPARATOR, Datastore

SOURCES = ("context", "outputs", "store")


class OutputStore:
    """Finished outputs of this process: their tokens and, for every q from min_q to max_q, where
    each q-gram occurred (the position after it)."""

    def __init__(self, max_q: int, min_q: int, max_tokens: int):
        self.max_q, self.min_q, self.max_tokens = max_q, min_q, max_tokens
        self.documents: list[list[int]] = []
        self.tokens: list[int] = []
        self.index: dict[tuple[int, ...], list[int]] = defaultdict(list)

    def add(self, tokens: list[int]) -> None:
        if not tokens:
            return
        self.documents.append(list(tokens))
        self.index_document(self.documents[-1])
        if len(self.tokens) > self.max_tokens:  # drop the oldest half, keep the newest
            kept, size = [], 0
            for document in reversed(self.documents):
                if size + len(document) > self.max_tokens // 2 and kept:
                    break
                kept.append(document)
                size += len(document)
            self.documents, self.tokens, self.index = kept[::-1], [], defaultdict(list)
            for document in self.documents:
                self.index_document(document)

    def index_document(self, document: list[int]) -> None:
        start = len(self.tokens)
        self.tokens += document
        self.tokens.append(-1)  # a document's end: no continuation crosses it
        for end in range(start + 1, start + len(document) + 1):
            for q in range(self.min_q, min(self.max_q, end - start) + 1):
                self.index[tuple(self.tokens[end - q:end])].append(end)

    def continuations(self, suffix: tuple[int, ...], w: int, max_occurrences: int) -> list[tuple[int, ...]]:
        rows = []
        for position in self.index.get(suffix, ())[-max_occurrences:]:
            row = self.tokens[position:position + w]
            if -1 in row:
                row = row[:row.index(-1)]
            if row:
                rows.append(tuple(row))
        return rows


class SuffixDrafter:
    def __init__(self, max_q: int, min_q: int, pad_token: int, fill: BigramDrafter | None = None,
                 store: Datastore | None = None, max_tokens: int = 1 << 18, min_probability: float = 0.1,
                 max_occurrences: int = 256):
        assert 1 <= min_q <= max_q, f"need 1 <= min_q ({min_q}) <= max_q ({max_q})"
        self.max_q, self.min_q, self.pad_token = max_q, min_q, pad_token
        self.fill, self.store = fill, store
        self.outputs = OutputStore(max_q, min_q, max_tokens)
        self.min_probability, self.max_occurrences = min_probability, max_occurrences

    def learn(self, tokens: list[int]) -> None:
        """A finished request's generated tokens: later requests may draft from them."""
        self.outputs.add([int(t) for t in tokens])

    def matches(self, context: DraftContext, w: int) -> dict[str, list[tuple[int, ...]]]:
        """The continuations each source has for the longest suffix any of them has seen."""
        tokens = context.tokens
        store_q, lo, hi = (0, 0, 0) if self.store is None else self.store.match(tokens, self.max_q, self.min_q)
        for q in range(min(self.max_q, len(tokens)), self.min_q - 1, -1):
            found: dict[str, list[tuple[int, ...]]] = {}
            if q <= context.max_q:
                positions = context.occurrences(q)[-self.max_occurrences:]
                found["context"] = [tuple(continuation(tokens, p, w)) for p in positions]
            found["outputs"] = self.outputs.continuations(tuple(tokens[-q:]), w, self.max_occurrences)
            if store_q == q:
                rows = self.store.continuations(lo, hi, q, w, self.max_occurrences).tolist()  # [n, w], SEPARATOR-cut
                found["store"] = [tuple(t for t in row if t != SEPARATOR) for row in rows if row[0] != SEPARATOR]
            found = {source: rows for source, rows in found.items() if rows}
            if found:
                return found
        return {}

    def rows(self, context: DraftContext, k: int, w: int) -> list[tuple[list[int], str, tuple[float, ...]]]:
        """Up to k (row, strategy, confidence): the trie's most frequent paths, each cut where it
        becomes unlikely; confidence[i] is the probability of the row's first i + 1 tokens."""
        found = self.matches(context, w)
        if not found:
            return []
        # p(path) = the mean over the matching sources of the share of that source's
        # continuations that start with the path: a store with thousands of occurrences does not
        # drown the request's own context, nor the other way round.
        trie: dict[tuple[int, ...], dict[str, float]] = {}
        for source, rows in found.items():
            for row in rows:
                for depth in range(1, len(row) + 1):
                    shares = trie.setdefault(row[:depth], {})
                    shares[source] = shares.get(source, 0.0) + 1.0 / (len(rows) * len(found))
        children: dict[tuple[int, ...], list[tuple[int, ...]]] = defaultdict(list)
        for prefix in trie:
            children[prefix[:-1]].append(prefix)
        probability = {prefix: sum(shares.values()) for prefix, shares in trie.items()}
        firsts = sorted(children[()], key=lambda prefix: (-probability[prefix], prefix))[:k]
        drafted = []
        for first in firsts:
            if probability[first] < self.min_probability and drafted:
                break
            path = first
            while len(path) < w and children.get(path):
                best = max(children[path], key=lambda prefix: (probability[prefix], -prefix[-1]))
                if probability[best] < self.min_probability:
                    break
                path = best
            drafted.append((list(path), f"suffix_{max(trie[first], key=trie[first].get)}",
                            tuple(probability[path[:depth]] for depth in range(1, len(path) + 1))))
        return drafted

    def propose(self, context: DraftContext, k: int, w: int) -> Drafts:
        rows = self.rows(context, k, w)
        if not rows and self.fill is not None:
            return self.fill.propose(context, k, w)
        missing = k - len(rows)
        padded = [row + [self.pad_token] * (w - len(row)) for row, _, _ in rows] + [[self.pad_token] * w] * missing
        return Drafts(tokens=torch.tensor(padded, dtype=torch.long).reshape(k, w),
                      strategies=tuple(strategy for _, strategy, _ in rows) + (PADDING,) * missing,
                      lengths=tuple(len(row) for row, _, _ in rows) + (0,) * missing,
                      confidence=tuple(confidence for _, _, confidence in rows) + ((),) * missing)
