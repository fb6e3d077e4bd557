"""Suffix drafter: drafts from what the corpus job has already written (in the spirit of
SuffixDecoding, arXiv 2411.04975; no model calls, no training outside the job).

Three sources know continuations of the context's current suffix:
- `context`: the request's own tokens (DraftContext's n-gram index, grown as tokens are emitted);
- `outputs`: the outputs this drafter's process has finished (OutputStore: an n-gram index over
  a bounded buffer of their tokens, shared by every request of the actor);
- `store`: a token datastore built from earlier runs' outputs (drafters/datastore.py); in a Ray
  job it reaches the actors through the object store with the drafter tables, so every actor of a
  node maps one read-only copy (elsewhere the files are memory-mapped).

Each source drafts on its own: its longest match of the context's suffix (the last max_q tokens
down to min_q find the occurrences, each is extended backwards up to max_match tokens, and only
those that repeat the most context are kept, as SuffixDecoding's suffix tree keeps its deepest
node), and from their continuations the path that follows the most frequent next token. Sources
are not pooled: the request's own long repeat is far more often right than a store's many short
matches, and which source to trust is what the acceptance model learns.

The acceptance model (drafters/acceptance.py) gives every drafted token the probability that it
is accepted given that the tokens before it were, from the token's FEATURES: its share of the
continuations that reached it, how many had it, the match length, its depth, the source, whether
another source drafts the same prefix and whether it is the model bigram's top choice after the
token before it. A candidate's score is its expected accepted tokens (the sum of its cumulative
probabilities); rows go best first, each cut where the probability that all its tokens so far
are accepted falls below min_probability, with those probabilities as the row's confidence (the
vLLM proposer's draft lengths). The model learns online: every candidate, drafted or not, is
judged against the tokens the request goes on to emit. When no source matches, the model's
bigram row fills in (strategy `bigram`).

Memory is bounded by OutputStore.max_tokens: past it the oldest half of the finished outputs is
dropped and the index rebuilt (amortised constant work per stored token).
"""
from __future__ import annotations

import math
import weakref
from collections import Counter, defaultdict
from dataclasses import dataclass

import numpy as np
import torch

from drafters.acceptance import AcceptanceModel
from drafters.base import PADDING, DraftContext, Drafts, common_prefix
from drafters.bigram import BigramDrafter
from drafters.context_ngram import continuation
from drafters.datastore import SEPARATOR, Datastore

SOURCES = ("context", "outputs", "store")
# One column per feature of a drafted token (token_features); PRIOR weighs them. The prior was
# fitted by maximum likelihood on SmolLM2-135M-Instruct's greedy outputs for HumanEval, GSM8K and
# ShareGPT prompts (B = 1, every candidate judged: 65k tokens), rounded; those runs had no store,
# whose weight is set to the outputs' (the same kind of evidence: other requests' answers). A
# job's own judged tokens move the weights from there (drafters/acceptance.py).
FEATURES = ("bias", "log_odds_share", "log_match", "log_depth", "log_reach", "log_count",
            "from_context", "from_outputs", "from_store", "first", "agreed", "bigram_top1")
PRIOR = np.array([-1.85, 0.27, -0.25, -0.41, 1.47, 0.35, -0.41, -1.44, -1.44, 0.85, 1.48, 0.92])


@dataclass(frozen=True)
class Candidate:
    """One source's draft for a context and what the acceptance model reads of each token."""
    tokens: tuple[int, ...]
    source: str
    features: np.ndarray  # [len(tokens), len(FEATURES)]


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
        (row, count), = members.items()
        path = list(row[:w])
        return path, [count / (count + 1)] + [1.0] * (len(path) - 1), [count] * len(path)
    while len(path) < w and members:
        depth = len(path)
        if len(members) == 1 and depth:  # one continuation left: the rest of it, unopposed
            (row, count), = members.items()
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
            rows.append([1.0, math.log(share / (1 - share)), log_match, math.log(depth),
                         math.log(match + depth - 1),  # the match the token extends if the ones before it hold
                         math.log(count), *flags, float(depth == 1), 0.0, 0.0])
    return np.array(rows)


class SuffixDrafter:
    def __init__(self, max_q: int, min_q: int, pad_token: int, fill: BigramDrafter | None = None,
                 store: Datastore | None = None, max_tokens: int = 1 << 18, min_probability: float = 0.05,
                 max_occurrences: int = 256, max_match: int = 24, model: AcceptanceModel | None = None):
        assert 1 <= min_q <= max_q <= max_match, f"need 1 <= min_q ({min_q}) <= max_q ({max_q}) <= max_match ({max_match})"
        self.max_q, self.min_q, self.pad_token = max_q, min_q, pad_token
        self.max_match = max_match
        self.fill, self.store = fill, store
        self.outputs = OutputStore(max_q, min_q, max_tokens)
        self.min_probability, self.max_occurrences = min_probability, max_occurrences
        self.model = model or AcceptanceModel(PRIOR)
        # Per running request (its DraftContext, forgotten with it): (position, candidate) awaiting the tokens that judge it.
        self.waiting: weakref.WeakKeyDictionary[DraftContext, list[tuple[int, Candidate]]] = weakref.WeakKeyDictionary()

    def learn(self, tokens: list[int]) -> None:
        """A finished request's generated tokens: later requests may draft from them."""
        self.outputs.add([int(t) for t in tokens])

    def source_match(self, context: DraftContext, source: str, w: int) -> tuple[int, Counter]:
        """(match length, the distinct w-token continuations of the occurrences that match that
        long, each with how many occurrences have it) of one source; (0, empty) when it has none."""
        tokens = context.tokens
        if source == "store":
            if self.store is None:
                return 0, Counter()
            match, lo, hi = self.store.match(tokens, self.max_match, self.min_q)
            if not match:
                return 0, Counter()
            rows = self.store.continuations(lo, hi, match, w, self.max_occurrences)  # [n, w], SEPARATOR-cut and -padded
            lengths = (rows != SEPARATOR).sum(axis=1).tolist()  # [n] each row's tokens before the cut
            return match, Counter(tuple(row[:n]) for row, n in zip(rows.tolist(), lengths) if n)
        for q in range(min(self.max_q, len(tokens)), self.min_q - 1, -1):
            if source == "outputs":
                match, rows = self.outputs.matches(tokens, q, w, self.max_match, self.max_occurrences)
                if rows:
                    return match, Counter(rows)
            elif q <= context.max_q and (ends := context.occurrences(q)[-self.max_occurrences:]):
                match, ends = longest_matches(tokens, ends, tokens, q, self.max_match)
                return match, Counter(tuple(continuation(tokens, p, w)) for p in ends)
        return 0, Counter()

    def candidates(self, context: DraftContext, w: int) -> list[Candidate]:
        """Each matching source's majority path, with its tokens' features."""
        paths = []
        for source in SOURCES:
            match, members = self.source_match(context, source, w)
            path, shares, counts = majority_path(members, w)
            if path:
                paths.append((path, (source, match, shares, counts)))
        if not paths:
            return []
        features = token_features([described for _, described in paths])  # [Σ n, F]
        if self.fill is not None:  # the bigram's top choice after the token before
            previous = np.concatenate([[context.tokens[-1], *path[:-1]] for path, _ in paths])
            features[:, 11] = self.fill.table[previous, 0, 0] == np.concatenate([path for path, _ in paths])
        found, start = [], 0
        for path, (source, _, _, _) in paths:
            found.append(Candidate(tuple(path), source, features[start:start + len(path)]))
            start += len(path)
        for candidate in found:  # agreed: another source drafts the same prefix up to this token
            for other in found:
                if other is not candidate:
                    candidate.features[:common_prefix(candidate.tokens, other.tokens), 10] = 1.0
        return found

    def judge(self, context: DraftContext) -> None:
        """Teaches the model the fate of this request's earlier candidates whose tokens are now known:
        each token up to the first wrong one, accepted or not."""
        still, features, outcomes = [], [], []
        for position, candidate in self.waiting.get(context, []):
            actual = context.tokens[position:position + len(candidate.tokens)]
            right = common_prefix(candidate.tokens, actual)
            if right == len(actual) < len(candidate.tokens):  # right so far, the rest not emitted yet
                still.append((position, candidate))
                continue
            judged = min(right + 1, len(candidate.tokens))
            features.append(candidate.features[:judged])
            outcomes += [1.0] * right + [0.0] * (judged - right)
        if outcomes:
            self.model.observe(np.concatenate(features), np.array(outcomes))
        self.waiting[context] = still

    def propose(self, context: DraftContext, k: int, w: int) -> Drafts:
        self.judge(context)
        found = self.candidates(context, w)
        self.waiting[context] += [(len(context), candidate) for candidate in found]
        rows = []
        for candidate in found:
            confidence = self.model.cumulative(candidate.features)  # [n]
            length = int(np.sum(confidence >= self.min_probability))  # non-increasing: a prefix
            if length:
                rows.append((float(confidence.sum()), candidate.tokens[:length], candidate.source,
                             tuple(confidence[:length].tolist())))
        rows.sort(key=lambda row: -row[0])
        rows = [row for i, row in enumerate(rows) if row[1] not in [other[1] for other in rows[:i]]][:k]
        if not rows and self.fill is not None:
            return self.fill.propose(context, k, w)
        missing = k - len(rows)
        padded = [list(row) + [self.pad_token] * (w - len(row)) for _, row, _, _ in rows] + [[self.pad_token] * w] * missing
        return Drafts(tokens=torch.tensor(padded, dtype=torch.long).reshape(k, w),
                      strategies=tuple(f"suffix_{source}" for _, _, source, _ in rows) + (PADDING,) * missing,
                      lengths=tuple(len(row) for _, row, _, _ in rows) + (0,) * missing,
                      confidence=tuple(confidence for _, _, _, confidence in rows) + ((),) * missing)
