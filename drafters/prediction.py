"""Drafting from a prediction: the text a row expects its answer to resemble (the `prediction`
column; a series run gives a regenerated row its last output), as OpenAI's predicted outputs do.

The answer is usually the prediction with edits: stretches copied, some tokens inserted, some
deleted. Each step the drafter finds where the answer has reached in the prediction: the longest
run of the answer's last tokens (min_match to max_match of them) that occurs in the prediction, at
the occurrence nearest where the answer is expected to be (the last match's end, moved on by the
tokens emitted since: a repeated line resumes where the answer is, not at its first copy), and
drafts what follows it there. After an insertion the answer's tail
is new text and nothing matches until it rejoins the prediction; after a deletion the tail matches
further on. Before the answer has min_match tokens, the prediction's beginning is drafted (answers
tend to start where their prediction starts).
"""
from __future__ import annotations

import bisect
from typing import Sequence


class PredictionDrafter:
    """One request's prediction, indexed by its token runs of min_match..max_match tokens."""

    def __init__(self, tokens: Sequence[int], min_match: int = 2, max_match: int = 8):
        assert 1 <= min_match <= max_match, f"need 1 <= min_match ({min_match}) <= max_match ({max_match})"
        self.tokens = list(tokens)
        self.min_match, self.max_match = min_match, max_match
        self.index: dict[tuple[int, ...], list[int]] = {}  # a run of tokens -> the positions after it, ascending
        for size in range(min_match, max_match + 1):
            for end in range(size, len(self.tokens) + 1):
                self.index.setdefault(tuple(self.tokens[end - size:end]), []).append(end)
        self.reached, self.reached_at = 0, 0  # where the last match ended in the prediction, and in the answer

    def draft(self, generated: Sequence[int], w: int) -> tuple[list[int], int]:
        """(up to w tokens: what follows the answer's tail, `generated`, in the prediction; how many of
        the answer's last tokens matched there: the draft's evidence)."""
        if w <= 0 or not self.tokens:
            return [], 0
        if len(generated) < self.min_match:
            if list(generated) != self.tokens[:len(generated)]:
                return [], 0
            return self.tokens[len(generated):len(generated) + w], self.max_match  # the answer's start: its prediction's
        for size in range(min(self.max_match, len(generated)), self.min_match - 1, -1):
            ends = self.index.get(tuple(generated[len(generated) - size:]))
            if ends:
                end = self.nearest(ends, self.reached + len(generated) - self.reached_at)
                self.reached, self.reached_at = end, len(generated)
                return self.tokens[end:end + w], size
        return [], 0

    @staticmethod
    def nearest(ends: list[int], expected: int) -> int:
        """Of the positions after a match, the nearest to where the answer is expected to be in the
        prediction (the last match's end moved on by the tokens since); the later of two as near."""
        at = bisect.bisect_left(ends, expected)
        if at == len(ends):
            return ends[-1]
        return ends[at - 1] if at and expected - ends[at - 1] < ends[at] - expected else ends[at]
