"""Context n-gram drafter (N-Grammys §4.2, Appendix B.2): continuations of earlier occurrences.

For the longest q (from max_q down to min_q) whose last-q-token suffix occurred before, every
earlier occurrence proposes the w tokens that followed it. Identical continuations are counted;
rows are ranked by count, ties broken by the most recent occurrence. Shorter q fill the rows
that longer q did not.
"""

from __future__ import annotations

from collections import Counter

from drafters.base import DraftContext, Drafts, pad_rows

STRATEGY = "context_ngram"


def continuation(tokens: list[int], position: int, w: int) -> list[int]:
    """The w tokens after `position`; past the end of the context the match repeats periodically.

    An occurrence that overlaps the suffix (e.g. a repeated line) means the text is periodic with
    period len(tokens) - position, so its continuation beyond the context is the draft itself.
    """
    period = len(tokens) - position
    row: list[int] = []
    for j in range(w):
        row.append(tokens[position + j] if position + j < len(tokens) else row[j - period])
    return row


def ranked_continuations(context: DraftContext, q: int, w: int, max_occurrences: int) -> list[list[int]]:
    """Continuations of the last q tokens, by count then recency; at most max_occurrences read."""
    positions = context.occurrences(q)[-max_occurrences:]
    counts: Counter[tuple[int, ...]] = Counter()
    latest: dict[tuple[int, ...], int] = {}
    for position in positions:
        row = tuple(continuation(context.tokens, position, w))
        counts[row] += 1
        latest[row] = position  # positions ascend, so the last write is the most recent
    ranked = sorted(counts, key=lambda row: (-counts[row], -latest[row]))
    return [list(row) for row in ranked]


class ContextNgramDrafter:
    def __init__(self, max_q: int, min_q: int = 1, pad_token: int = 0, max_occurrences: int = 512):
        assert 1 <= min_q <= max_q, f"need 1 <= min_q ({min_q}) <= max_q ({max_q})"
        self.max_q = max_q
        self.min_q = min_q
        self.pad_token = pad_token
        # Bounds the work for very frequent grams (a space, a newline) in long contexts.
        self.max_occurrences = max_occurrences

    def find(self, context: DraftContext, k: int, w: int) -> list[list[int]]:
        """Up to k distinct rows, longest matches first; fewer (or none) when the context has none."""
        rows: list[list[int]] = []
        for q in range(self.max_q, self.min_q - 1, -1):
            for row in ranked_continuations(context, q, w, self.max_occurrences):
                if row not in rows:
                    rows.append(row)
            if len(rows) >= k:
                break
        return rows[:k]

    def propose(self, context: DraftContext, k: int, w: int) -> Drafts:
        rows = self.find(context, k, w)
        return pad_rows(rows, [STRATEGY] * len(rows), k, w, self.pad_token)
