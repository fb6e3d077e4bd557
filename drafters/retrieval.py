"""Retrieval drafter (REST, He et al. 2023, arXiv 2311.08252): drafts from a token datastore.

Each step: find the longest suffix of the context (max_match tokens down to min_match) that
occurs in the datastore (suffix-array binary search, drafters/datastore.py); take the w tokens
after up to max_occurrences of its occurrences; count every prefix of those continuations (a
trie weighted by prefix frequency); keep the max_nodes most frequent prefixes; each kept prefix
that no other kept one extends is a leaf, and its row is the leaf's path continued by the
trie's most frequent child to w tokens. Rows are ranked by their leaf's count.

A context with no match yields only padding rows (the decoder then takes a plain step, and the
mixed drafter fills from its other strategies); there is no silent guess.
"""

from __future__ import annotations

import numpy as np

from drafters.base import DraftContext, Drafts, pad_rows
from drafters.datastore import SEPARATOR, Datastore

STRATEGY = "retrieval"


def prefix_counts(continuations: np.ndarray) -> dict[tuple[int, ...], int]:
    # continuations: [n, w] uint32, each cut at its first SEPARATOR
    unique, counts = np.unique(continuations, axis=0, return_counts=True)  # distinct rows first: few
    trie: dict[tuple[int, ...], int] = {}
    for row, count in zip(unique.tolist(), counts.tolist()):
        for depth in range(1, len(row) + 1):
            if row[depth - 1] == SEPARATOR:
                break
            prefix = tuple(row[:depth])
            trie[prefix] = trie.get(prefix, 0) + count
    return trie


def select_rows(trie: dict[tuple[int, ...], int], max_nodes: int, w: int) -> list[list[int]]:
    """Rows for the max_nodes most frequent prefixes, most frequent leaf first."""
    # A prefix is never more frequent than its parent; ranking shorter first on ties keeps the
    # kept set closed under taking prefixes, so it is a tree.
    kept = sorted(trie, key=lambda prefix: (-trie[prefix], len(prefix), prefix))[:max_nodes]
    inner = {prefix[:-1] for prefix in kept if len(prefix) > 1}
    leaves = [prefix for prefix in kept if prefix not in inner]
    children: dict[tuple[int, ...], tuple[int, ...]] = {}  # most frequent child of every prefix
    for prefix, count in trie.items():
        parent = prefix[:-1]
        best = children.get(parent)
        if best is None or (count, -prefix[-1]) > (trie[best], -best[-1]):
            children[parent] = prefix
    rows = []
    for leaf in leaves:
        path = leaf
        while len(path) < w and path in children:
            path = children[path]
        rows.append(list(path))
    return rows


def check_vocabulary(datastore: Datastore, vocab_size: int) -> None:
    """A datastore holds one tokenizer's ids: with another model's tokenizer every draft is noise."""
    built_for = datastore.meta.get("vocab_size")
    if built_for is not None and built_for != vocab_size:
        raise ValueError(
            f"drafting.datastore: built with a tokenizer of {built_for} tokens (model "
            f"{datastore.meta.get('model')!r}); the target's has {vocab_size}: rebuild it with "
            f"python -m jobs.build_datastore --model <the target>"
        )


class RetrievalDrafter:
    def __init__(
        self,
        datastore: Datastore,
        pad_token: int,
        max_match: int = 16,
        min_match: int = 2,
        max_occurrences: int = 5000,
        max_nodes: int = 64,
    ):
        self.datastore = datastore
        self.pad_token = pad_token
        self.max_match = max_match
        self.min_match = min_match
        self.max_occurrences = max_occurrences
        self.max_nodes = max_nodes

    def rows(self, context: DraftContext, k: int, w: int) -> list[list[int]]:
        """Up to k retrieved rows of w tokens (none when the context has no match). A continuation
        cut by a document's end is padded: the target simply rejects the padding."""
        match_len, lo, hi = self.datastore.match(context.tokens, self.max_match, self.min_match)
        if match_len == 0:
            return []
        continuations = self.datastore.continuations(lo, hi, match_len, w, self.max_occurrences)  # [n, w]
        rows = select_rows(prefix_counts(continuations), self.max_nodes, w)[:k]
        return [row + [self.pad_token] * (w - len(row)) for row in rows]

    def propose(self, context: DraftContext, k: int, w: int) -> Drafts:
        rows = self.rows(context, k, w)
        return pad_rows(rows, [STRATEGY] * len(rows), k, w, self.pad_token)
