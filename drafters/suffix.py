"""Suffix drafter: drafts from what the corpus job has already written (in the spirit of
SuffixDecoding, arXiv 2411.04975; learning-free, no model calls).

Three sources know continuations of the context's current suffix:
- `context`: the request's own tokens (DraftContext's n-gram index, grown as tokens are emitted);
- `outputs`: the outputs this drafter's process has finished (OutputStore: an n-gram index over
  a bounded buffer of their tokens, shared by every request of the actor);
- `store`: a token datastore built from earlier runs' outputs (drafters/datastore.py; memory-
  mapped, so every actor of a node maps one read-only copy).
The longest suffix (max_q down to min_q tokens) that any source has seen finds the occurrences;
each is then extended backwards (up to max_match tokens: how much of the context before the suffix
it repeats), and only the occurrences that match longest are kept, in the sources that match
longest (as SuffixDecoding's suffix tree keeps the deepest node): a long repeat in the request's
own context is not drowned by a store's many short matches. Their continuations make one trie,
where a path's probability is the mean over those sources of the share of their continuations
that start with it (one unseen continuation counted in: a lone occurrence vouches for 1/2). A row follows
the most probable child from the root while the path's probability stays >= min_probability, so
the draft is long where the corpus agrees and short where it does not. A row's strategy is
`suffix_<source>`, the source that gave its first token the largest share. Its confidence (for
the vLLM proposer's draft lengths) is each prefix's probability, times L / depth past the match
length L (SuffixDecoding drafts at most L tokens after an L-token match).
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

    def matches(self, context: list[int], q: int, w: int, max_match: int,
                max_occurrences: int) -> tuple[int, list[tuple[int, ...]]]:
        """The longest match of the context's suffix (found by its last q tokens, extended backwards
        up to max_match) and the w-token continuations of the occurrences that match that long."""
        ends = self.index.get(tuple(context[-q:]), [])[-max_occurrences:]
        length, ends = longest_matches(self.tokens, ends, context, q, max_match)
        rows = []
        for position in ends:
            row = self.tokens[position:position + w]
            if -1 in row:
                row = row[:row.index(-1)]
            if row:
                rows.append(tuple(row))
        return length, rows


def longest_matches(haystack: list[int], ends: list[int], context: list[int], q: int,
                    max_match: int) -> tuple[int, list[int]]:
    """ends: positions in haystack just after an occurrence of the context's last q tokens. Extends
    each backwards while haystack and context agree (up to max_match tokens in all); returns the
    longest length reached and the ends that reach it (a document end, -1, never agrees)."""
    best, kept = q, []
    size = len(context)
    for end in ends:
        length = q
        while length < max_match and length < size and end > length and haystack[end - length - 1] == context[size - length - 1]:
            length += 1
        if length > best:
            best, kept = length, [end]
        elif length == best:
            kept.append(end)
    return best, kept


def next_tokens(weighted: list[tuple[tuple[int, ...], float, str]], depth: int) -> dict[int, float]:
    """The probability of each token at `depth` among weighted continuations (row, weight, source)
    that all share the path before it: the sum of the weights of the rows that have it there."""
    shares: dict[int, float] = defaultdict(float)
    for row, weight, _ in weighted:
        if len(row) > depth:
            shares[row[depth]] += weight
    return shares


class SuffixDrafter:
    def __init__(self, max_q: int, min_q: int, pad_token: int, fill: BigramDrafter | None = None,
                 store: Datastore | None = None, max_tokens: int = 1 << 18, min_probability: float = 0.1,
                 max_occurrences: int = 256, max_match: int = 24):
        assert 1 <= min_q <= max_q <= max_match, f"need 1 <= min_q ({min_q}) <= max_q ({max_q}) <= max_match ({max_match})"
        self.max_q, self.min_q, self.pad_token = max_q, min_q, pad_token
        self.max_match = max_match
        self.fill, self.store = fill, store
        self.outputs = OutputStore(max_q, min_q, max_tokens)
        self.min_probability, self.max_occurrences = min_probability, max_occurrences

    def learn(self, tokens: list[int]) -> None:
        """A finished request's generated tokens: later requests may draft from them."""
        self.outputs.add([int(t) for t in tokens])

    def matches(self, context: DraftContext, w: int) -> tuple[int, dict[str, list[tuple[int, ...]]]]:
        """The longest match any source has for the context's suffix, and the continuations of
        the occurrences that match that long, per source that does ((0, {}) when none matches)."""
        tokens = context.tokens
        store_q, lo, hi = (0, 0, 0) if self.store is None else self.store.match(tokens, self.max_match, self.min_q)
        for q in range(min(self.max_q, len(tokens)), self.min_q - 1, -1):
            found: dict[str, tuple[int, list[tuple[int, ...]]]] = {}
            if q <= context.max_q:
                length, ends = longest_matches(tokens, context.occurrences(q)[-self.max_occurrences:], tokens, q,
                                               self.max_match)
                found["context"] = (length, [tuple(continuation(tokens, p, w)) for p in ends])
            found["outputs"] = self.outputs.matches(tokens, q, w, self.max_match, self.max_occurrences)
            if store_q >= q:
                rows = self.store.continuations(lo, hi, store_q, w, self.max_occurrences).tolist()  # [n, w], SEPARATOR-cut
                found["store"] = (store_q, [tuple(t for t in row if t != SEPARATOR) for row in rows if row[0] != SEPARATOR])
            found = {source: match for source, match in found.items() if match[1]}
            if found:
                longest = max(length for length, _ in found.values())
                return longest, {source: rows for source, (length, rows) in found.items() if length == longest}
        return 0, {}

    def rows(self, context: DraftContext, k: int, w: int) -> list[tuple[list[int], str, tuple[float, ...]]]:
        """Up to k (row, strategy, confidence): the most probable paths of the continuations' trie,
        each cut where it becomes unlikely; confidence[i] is the probability of the row's first i + 1 tokens."""
        length, found = self.matches(context, w)
        if not found:
            return []
        # p(path) = the mean over the matching sources of the share of that source's
        # continuations that start with the path: a store with thousands of occurrences does not
        # drown the request's own context, nor the other way round. A share counts one unseen
        # continuation too (the rule of succession): one occurrence is evidence for 1/2, not 1.
        weighted = [(row, 1.0 / ((len(rows) + 1) * len(found)), source) for source, rows in found.items() for row in rows]
        firsts = next_tokens(weighted, 0)
        drafted = []
        for first in sorted(firsts, key=lambda token: (-firsts[token], token))[:k]:
            if firsts[first] < self.min_probability and drafted:
                break
            members = [entry for entry in weighted if entry[0][0] == first]
            sources: dict[str, float] = defaultdict(float)
            for _, weight, source in members:
                sources[source] += weight
            path, confidence = [first], [firsts[first]]
            while len(path) < w:
                depth = len(path)
                shares = next_tokens(members, depth)
                if not shares:
                    break
                best = max(shares, key=lambda token: (shares[token], -token))
                if shares[best] < self.min_probability:
                    break
                members = [entry for entry in members if len(entry[0]) > depth and entry[0][depth] == best]
                path.append(best)
                confidence.append(shares[best])
            # A match of L tokens vouches for about L tokens after it (SuffixDecoding drafts at most
            # L): deeper tokens keep their share times L / depth, for the caller to weigh.
            confidence = [share * min(1.0, length / depth) for depth, share in enumerate(confidence, start=1)]
            drafted.append((path, f"suffix_{max(sources, key=sources.get)}", tuple(confidence)))
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
