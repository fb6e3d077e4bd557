"""Plain statements of the compiled drafter's algorithms, the references tests check them against
(one production copy each: drafters/suffix/): the acceptance model and its fit, a source's majority
path and its tokens' features, the longest earlier matches of a context, and the store's search.
Slow and clear on purpose; nothing in pipeline/ or drafters/ imports this."""

from __future__ import annotations

import bisect
import math
from collections import Counter, defaultdict
from collections.abc import Sequence

import numpy as np

from drafters.suffix.acceptance import SOURCES
from drafters.suffix.store_search import SEPARATOR


# -- the acceptance model (drafters/suffix/acceptance.py) ----------------------------------------


def sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.clip(z, -30.0, 30.0)))


class AcceptanceModel:
    def __init__(
        self,
        prior: np.ndarray,
        prior_strength: float = 200.0,
        capacity: int = 16384,
        refit_every: int = 512,
        newton_steps: int = 3,
    ):
        self.prior = np.asarray(prior, dtype=np.float64)  # [F]
        self.weights = self.prior.copy()  # [F]
        self.prior_strength, self.refit_every, self.newton_steps = prior_strength, refit_every, newton_steps
        self.features = np.zeros((capacity, len(self.prior)))  # [capacity, F] ring buffer
        self.outcomes = np.zeros(capacity)  # [capacity] 1.0 accepted, 0.0 rejected
        self.seen = 0  # judged tokens so far (the buffer holds the last `capacity`)
        self.since_fit = 0

    def conditional(self, features: np.ndarray) -> np.ndarray:
        """[n]: P(token accepted | the tokens before it were), features: [n, F]."""
        return sigmoid(features @ self.weights)

    def cumulative(self, features: np.ndarray) -> np.ndarray:
        """[n]: P(the draft's first j + 1 tokens are all accepted), features: [n, F] in draft order."""
        return np.cumprod(self.conditional(features))

    def observe(self, features: np.ndarray, outcomes: np.ndarray) -> None:
        """features: [m, F] of judged tokens; outcomes: [m] whether each was accepted."""
        capacity, judged = len(self.outcomes), len(outcomes)
        slots = (self.seen + np.arange(judged)) % capacity  # [m] where each goes in the ring
        keep = slice(max(judged - capacity, 0), judged)  # more than the ring holds: the newest
        self.features[slots[keep]], self.outcomes[slots[keep]] = (
            features[keep],
            np.asarray(outcomes, dtype=np.float64)[keep],
        )
        self.seen += judged
        self.since_fit += judged
        if self.since_fit >= self.refit_every:
            self.fit()

    def fit(self) -> None:
        """Newton steps on -log posterior = Σ logloss + (λ/2)|w - prior|² over the buffer."""
        held = min(self.seen, len(self.outcomes))
        x, y = self.features[:held], self.outcomes[:held]  # [held, F], [held]
        regulariser = self.prior_strength * np.eye(len(self.weights))
        for _ in range(self.newton_steps):
            p = sigmoid(x @ self.weights)
            gradient = x.T @ (p - y) + self.prior_strength * (self.weights - self.prior)
            hessian = (x * (p * (1 - p))[:, None]).T @ x + regulariser
            self.weights = self.weights - np.linalg.solve(hessian, gradient)
        self.since_fit = 0


# -- a source's candidate (drafters/suffix/step.py) -----------------------------------------------


def majority_path(members: Counter, w: int) -> tuple[list[int], list[float], list[int]]:
    """members: each distinct continuation (a token tuple) with how many occurrences have it. The
    path of at most w tokens that follows, at each depth, the most frequent next token of the
    continuations that share the path so far (ties: the smallest token id), with each token's
    share of those continuations and how many have it. The first token's share counts one unseen
    continuation too (the rule of succession: one occurrence vouches for 1/2, not 1)."""
    path: list[int] = []
    shares: list[float] = []
    counts: list[int] = []
    if len(members) == 1:  # one continuation (the common case): it is the path
        ((row, count),) = members.items()
        path = list(row[:w])
        return path, [count / (count + 1)] + [1.0] * (len(path) - 1), [count] * len(path)
    while len(path) < w and members:
        depth = len(path)
        if len(members) == 1 and depth:  # one continuation left: the rest of it, unopposed
            ((row, count),) = members.items()
            rest = row[depth:w]
            path += rest
            shares += [1.0] * len(rest)
            counts += [count] * len(rest)
            break
        tally: dict[int, int] = defaultdict(int)
        for row, count in members.items():
            if len(row) > depth:
                tally[row[depth]] += count
        if not tally:
            break
        token, count = max(tally.items(), key=lambda item: (item[1], -item[0]))
        shares.append(count / (sum(members.values()) + (depth == 0)))
        counts.append(count)
        path.append(token)
        members = Counter({row: n for row, n in members.items() if len(row) > depth and row[depth] == token})
    return path, shares, counts


def token_features(paths: list[tuple[str, int, list[float], list[int]]]) -> np.ndarray:
    """[Σ n, len(FEATURES)]: the tokens of every (source, match length, shares, counts) path, one
    after another; `agreed` and `bigram_top1` are filled in by the caller. (Rows are built in
    Python: a step has a few dozen, and numpy's per-call overhead would cost more.)"""
    rows = []
    for source, match, shares, counts in paths:
        flags = [float(source == name) for name in SOURCES]
        log_match = math.log(match)
        for depth, (share, count) in enumerate(zip(shares, counts), start=1):
            share = min(max(share, 1e-3), 1 - 1e-3)
            rows.append(
                [
                    1.0,
                    math.log(share / (1 - share)),
                    log_match,
                    math.log(depth),
                    math.log(match + depth - 1),  # the match the token extends if the ones before it hold
                    math.log(count),
                    *flags,
                    float(depth == 1),
                    0.0,
                    0.0,
                ]
            )
    return np.array(rows)


# -- the store's search (drafters/suffix/store_search.py) ----------------------------------------


def suffix_range(
    tokens: np.ndarray, suffix_array: np.ndarray, pattern: list[int], first: int = 0, last: int | None = None
) -> tuple[int, int]:
    """The half-open suffix-array range, within [first, last), of the suffixes that start with
    `pattern` (empty: lo == hi); each suffix cut to len(pattern) tokens and compared as a list (a
    suffix that runs out is smaller)."""

    def head(position) -> list[int]:
        return tokens[position : position + len(pattern)].tolist()

    last = len(suffix_array) if last is None else last
    lo = bisect.bisect_left(suffix_array, pattern, first, last, key=head)
    return lo, bisect.bisect_right(suffix_array, pattern, lo, last, key=head)


def find_longest_suffix_match(
    tokens: np.ndarray,
    suffix_array: np.ndarray,
    context: Sequence[int],
    max_len: int = 16,
    min_len: int = 2,
    segments=None,
) -> tuple[int, int, int]:
    """(match_len, lo, hi): the longest suffix of `context`, min(max_len, len(context)) tokens down
    to min_len, that occurs in a segment (each a suffix-array range sorted on its own: the newest
    wins a tie; None: one, the whole array), and its suffix-array range there; (0, 0, 0) when none does."""
    tail = [int(t) for t in context[-max_len:]] if max_len > 0 else []
    best = (0, 0, 0)
    for first, last in [(0, len(suffix_array))] if segments is None else np.asarray(segments).tolist():
        for length in range(len(tail), max(min_len, best[0]) - 1, -1):
            lo, hi = suffix_range(tokens, suffix_array, tail[len(tail) - length :], first, last)
            if lo < hi:
                best = (length, lo, hi)
                break
    return best


def continuations(
    tokens: np.ndarray,
    suffix_array: np.ndarray,
    lo: int,
    hi: int,
    match_len: int,
    length: int = 10,
    max_occurrences: int = 5000,
) -> list[tuple[int, ...]]:
    """The `length` tokens after min(hi - lo, max_occurrences) occurrences spread evenly over the
    range, each cut at a document's end (an empty one left out)."""
    count = max(0, min(hi - lo, max_occurrences))
    rows = []
    for i in range(count):
        start = int(suffix_array[lo + (i * (hi - lo)) // count]) + match_len
        row = []
        while len(row) < length and start + len(row) < len(tokens) and tokens[start + len(row)] != SEPARATOR:
            row.append(int(tokens[start + len(row)]))
        if row:
            rows.append(tuple(row))
    return rows
