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

A draft from a prediction runs as far as the prediction goes (the engine's longest draft for
predictions, not the drafter's w). How much of it a step verifies is the step budget's call
(drafters/budget.py's rule, `cut_to_budget`): each token is worth the probability that the draft
holds that far, from how often this request's prediction has held so far (`HoldRates`: its rate of
leaving the prediction per judged token, starting from the rate pooled over every request). On a
GPU, where a verified token costs a step little, a prediction that holds is verified in long
stretches; on a CPU, where each costs nearly a generated token, in short ones. `step_drafts` is one
step over the running requests (the vLLM proposer's, and the replay's).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from collections.abc import Sequence

import numpy as np

from drafters.budget import allocate


class PredictionDrafter:
    """One request's prediction, indexed by its runs of min_match tokens (a longer match is one of
    those occurrences checked further back: the index costs one entry per token, made when the
    request starts, where one per run length cost the engine's step milliseconds for each new request)."""

    def __init__(self, tokens: Sequence[int], min_match: int = 2, max_match: int = 8, near: int = 8):
        assert 1 <= min_match <= max_match, f"need 1 <= min_match ({min_match}) <= max_match ({max_match})"
        self.tokens = list(tokens)
        self.min_match = min_match
        self.max_match = max_match
        self.near = near  # how far from where the answer is expected a short match still counts in full
        self.index: dict[
            tuple[int, ...], list[int]
        ] = {}  # a run of min_match tokens -> the positions after it, ascending
        for end in range(min_match, len(self.tokens) + 1):
            self.index.setdefault(tuple(self.tokens[end - min_match : end]), []).append(end)
        self.reached, self.reached_at = 0, 0  # where the last match ended in the prediction, and in the answer

    def draft(self, generated: Sequence[int], w: int) -> tuple[list[int], int]:
        """(up to w tokens: what follows the answer's tail, `generated`, in the prediction; how many of
        the answer's last tokens matched there: the draft's evidence)."""
        if w <= 0 or not self.tokens:
            return [], 0
        if len(generated) < self.min_match:
            if list(generated) != self.tokens[: len(generated)]:
                return [], 0
            return self.tokens[
                len(generated) : len(generated) + w
            ], self.max_match  # the answer's start: its prediction's
        ends = self.index.get(tuple(generated[len(generated) - self.min_match :]))
        if not ends:
            return [], 0
        # The longest run of the answer's last tokens (up to max_match) that ends at each occurrence.
        longest = min(self.max_match, len(generated))
        sizes = [self.matched(generated, end, longest) for end in ends]
        size = max(sizes)
        expected = self.reached + len(generated) - self.reached_at
        end = self.nearest([e for e, n in zip(ends, sizes) if n == size], expected)
        self.reached = end
        self.reached_at = len(generated)
        # A short match where the answer is expected to be (it rejoins the prediction after an edit
        # of a few tokens) is as good evidence as a long one anywhere.
        return self.tokens[end : end + w], self.max_match if abs(end - expected) <= self.near else size

    def matched(self, generated: Sequence[int], end: int, longest: int) -> int:
        """How many of the answer's last tokens (min_match of them known to match, at most `longest`)
        the prediction's tokens before `end` repeat."""
        size = self.min_match
        while size < min(longest, end) and self.tokens[end - size - 1] == generated[len(generated) - size - 1]:
            size += 1
        return size

    @staticmethod
    def nearest(ends: list[int], expected: int) -> int:
        """Of the positions after a match, the nearest to where the answer is expected to be in the
        prediction (the last match's end moved on by the tokens since); the later of two as near."""
        at = bisect.bisect_left(ends, expected)
        if at == len(ends):
            return ends[-1]
        return ends[at - 1] if at and expected - ends[at - 1] < ends[at] - expected else ends[at]


# How often a prediction's draft holds. An edited document's answer follows its prediction for long
# stretches and leaves it where the edit is: a draft from the prediction is accepted up to there.
# Each request's rate of leaving (divergences per judged token) starts from the rate pooled over
# every request so far, itself starting from PRIOR_DIVERGENCES in PRIOR_TOKENS, and weighs its own
# tokens against OWN_PRIOR_TOKENS of the pooled rate.
PRIOR_TOKENS, PRIOR_DIVERGENCES, OWN_PRIOR_TOKENS = 32.0, 1.0, 16.0


@dataclass
class Hold:
    """How one request's prediction drafts fared, apart where it was on its prediction (its last
    prediction draft accepted whole: the next continues it) and where it was rejoining it (a fresh
    match after the answer left): the tokens judged, and how many times the answer left the
    prediction (a draft token rejected). A draft that rejoins holds far less often than one that
    continues, and the first kind must not make the second short, nor the second the first long."""

    judged: list[int] = field(default_factory=lambda: [0, 0])  # [rejoining, on track]
    diverged: list[int] = field(default_factory=lambda: [0, 0])
    on_track: bool = True  # an answer starts where its prediction starts


class HoldRates:
    """Divergences per judged prediction token, on track and rejoining apart, pooled over requests
    (the prior of each one's own)."""

    def __init__(self):
        self.judged = [0, 0]
        self.diverged = [0, 0]

    def judge(self, hold: Hold, draft: Sequence[int], emitted: Sequence[int]) -> int:
        """A verified draft against what the request emitted from the same position (its accepted
        tokens and one more): the tokens accepted. A draft cut short by the engine is judged only
        as far as the emitted tokens go."""
        accepted = next((i for i, (a, b) in enumerate(zip(draft, emitted)) if a != b), min(len(draft), len(emitted)))
        diverged = int(accepted < min(len(draft), len(emitted)))
        kind = int(hold.on_track)
        for counts in (hold, self):
            counts.judged[kind] += accepted + diverged
            counts.diverged[kind] += diverged
        hold.on_track = not diverged
        return accepted

    def rate(self, hold: Hold) -> float:
        kind = int(hold.on_track)
        pooled = (self.diverged[kind] + PRIOR_DIVERGENCES) / (self.judged[kind] + PRIOR_TOKENS)
        return min((hold.diverged[kind] + OWN_PRIOR_TOKENS * pooled) / (hold.judged[kind] + OWN_PRIOR_TOKENS), 1.0)

    def confidence(self, hold: Hold, length: int) -> np.ndarray:
        """[length]: the probability that a draft's first j + 1 tokens are all accepted."""
        return (1.0 - self.rate(hold)) ** np.arange(1, length + 1, dtype=np.float64)


def cut_to_budget(confidence: list[np.ndarray], cost, fed_before: int) -> np.ndarray:
    """How many tokens of each prediction draft a step keeps (drafters/budget.py's rule: the most
    likely first, while one more raises the step's expected tokens per second), `confidence[i]` the
    draft's probabilities, `cost` the step's LinearStepCost, `fed_before` the tokens the step feeds
    without these drafts (a token per running request, and the other requests' drafts)."""
    lengths = np.array([len(g) for g in confidence], dtype=np.int64)
    table = np.zeros((len(confidence), max(int(lengths.max(initial=0)), 1)))
    for i, g in enumerate(confidence):
        table[i, : len(g)] = g
    # allocate() counts one fed token per draft's request first: its step costs start at fed_before.
    step_cost = cost.seconds(np.arange(fed_before - len(confidence), fed_before + int(lengths.sum()) + 1))
    taken = np.zeros(len(confidence), dtype=np.int64)
    allocate(table, lengths, step_cost, taken)
    return taken


# The answer's last tokens that must match in the prediction for its draft to be taken: a shorter
# match (a common pair of tokens) says little about where the answer is.
PREDICTION_EVIDENCE = 4


def step_drafts(
    predictions: list[tuple[PredictionDrafter, Hold, Sequence[int], int]],
    own: Sequence[np.ndarray],
    fed: int,
    holds: HoldRates,
    cost=None,
) -> list[list[int] | None]:
    """One step's drafts from the requests' predictions: for each (its prediction, how it has held,
    the tokens generated so far, its w: the most draft tokens it may take), the draft that replaces the
    drafter's own, or None. `own[i]`: the drafter's own draft's probabilities (that its first 1, 2,
    ... tokens are accepted; its length is the draft's). A prediction drafts where the answer's last
    PREDICTION_EVIDENCE tokens (or its start) match in it; with a `cost` (w: auto: the step's
    LinearStepCost) its drafts are cut to the step's budget by how often each has held, `fed` being
    the tokens the step feeds with the drafter's drafts. The draft expected to gain more tokens wins:
    a prediction that holds outruns any n-gram guess, one that keeps failing yields to the drafter's."""
    guesses: dict[int, list[int]] = {}
    for i, (prediction, _, generated, w) in enumerate(predictions):
        guess, matched = prediction.draft(generated, w)
        if guess and matched >= PREDICTION_EVIDENCE:
            guesses[i] = guess
    confidence = {i: holds.confidence(predictions[i][1], len(g)) for i, g in guesses.items()}
    if guesses and cost is not None:
        kept = cut_to_budget(list(confidence.values()), cost, fed - sum(len(own[i]) for i in guesses))
        guesses = {i: g[:n] for (i, g), n in zip(guesses.items(), kept.tolist())}
    return [
        guesses[i] if guesses.get(i) and confidence[i][: len(guesses[i])].sum() > float(np.sum(own[i])) else None
        for i in range(len(predictions))
    ]
