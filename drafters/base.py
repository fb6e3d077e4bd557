"""What every drafter shares: the per-request context it reads and the drafts it returns.

Terms used across the project:
- a *draft* is a row of w tokens proposed to follow the context;
- a step verifies k drafts in one target call; a row's *accepted* tokens are its longest prefix
  equal to the target's greedy choice at each position;
- the *bonus* token is the target's own choice after the accepted tokens, so every step emits
  accepted + 1 tokens;
- *tokens per call* = generated tokens / target calls (bonus included).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Protocol
from collections.abc import Hashable, Sequence

import numpy as np
import torch

from drafters.primitives.sampling import GREEDY, RandomState, SamplingParams

PADDING = "padding"  # a row that carries no information (a batch's rows padded to one shape)
NO_DRAFT = "none"  # the strategy of a step that verified no draft (plain decoding, or nothing worth guessing)


@dataclass(frozen=True)
class Drafts:
    tokens: torch.Tensor  # [k, w] int64
    # Which strategy produced each row; "padding" rows carry no information and may be skipped.
    strategies: tuple[str, ...]
    # [k, w, V] the draft model's distribution q at each draft token (draft models only; point-mass
    # drafts have none). Sampled drafts are verified by speculative sampling against it.
    probs: torch.Tensor | None = None
    # Forward calls of a draft model spent on these drafts (0 for table and context drafters).
    num_model_calls: int = 0
    # The tokens of each row that are guesses (the rest is padding), where a drafter drafts rows
    # as long as its evidence; None: every row is w tokens.
    lengths: tuple[int, ...] | None = None
    # A drafter's own estimate, per row, of the probability that the row's first 1, 2, ... tokens
    # are all accepted (non-increasing; as long as the row's length), where it has one.
    confidence: tuple[tuple[float, ...], ...] | None = None

    def __post_init__(self):
        assert self.tokens.dim() == 2 and self.tokens.shape[0] == len(self.strategies), (
            f"drafts {tuple(self.tokens.shape)} need one strategy per row, got {len(self.strategies)}"
        )
        assert self.lengths is None or len(self.lengths) == self.tokens.shape[0], "one length per row"
        assert self.confidence is None or len(self.confidence) == self.tokens.shape[0], "one confidence per row"
        assert self.probs is None or self.probs.shape[:2] == self.tokens.shape, (
            f"draft probs {tuple(self.probs.shape)} do not match drafts {tuple(self.tokens.shape)}"
        )


class DraftContext:
    """The tokens of one request so far, with an n-gram index that grows as tokens are appended.

    index[q][gram] lists the positions p such that tokens[p-q:p] == gram, oldest first, so
    drafting looks up the context's last q tokens in O(1) instead of re-scanning the context.
    """

    def __init__(
        self, token_ids: list[int], max_q: int, sampling: SamplingParams = GREEDY, random: RandomState | None = None
    ):
        self.tokens: list[int] = []
        self.max_q = max_q
        # How the request samples; a draft model drafts with the same settings and random stream.
        self.sampling = sampling
        self.random = random
        self.index: list[dict[tuple[int, ...], list[int]]] = [defaultdict(list) for _ in range(max_q + 1)]
        self.append(token_ids)

    def __len__(self) -> int:
        return len(self.tokens)

    def append(self, token_ids: list[int]) -> None:
        for token in token_ids:
            self.tokens.append(int(token))
            end = len(self.tokens)
            for q in range(1, min(self.max_q, end) + 1):
                self.index[q][tuple(self.tokens[end - q : end])].append(end)

    def occurrences(self, q: int) -> list[int]:
        """Positions p < len(self) that follow an earlier occurrence of the last q tokens."""
        if q > min(self.max_q, len(self.tokens)):
            return []
        positions = self.index[q].get(tuple(self.tokens[-q:]), [])
        # The last entry is the suffix itself (p == len), which has no continuation yet.
        return positions[:-1]


def common_prefix(a, b) -> int:
    """How many leading tokens two sequences share (a draft's accepted tokens, against the emitted ones)."""
    length, limit = 0, min(len(a), len(b))
    while length < limit and a[length] == b[length]:
        length += 1
    return length


class Drafter(Protocol):
    """Proposes exactly k drafts of w tokens for a context (one request at a time: the
    transformers engine's decoders, and drafters/per_request.py for a batch)."""

    def propose(self, context: DraftContext, k: int, w: int) -> Drafts: ...


@dataclass(frozen=True)
class BatchDrafts:
    """One step's drafts: request b drafts tokens[b, :lengths[b]] (strategy strategies[strategy[b]]
    of its drafter, when it drafts), confidence[b, j] the probability that its first j + 1 tokens
    are accepted. failures: the requests whose drafting raised this step (they draft nothing)."""

    tokens: np.ndarray  # [B, w] int64
    lengths: np.ndarray  # [B] int64
    confidence: np.ndarray  # [B, w] float64
    strategy: np.ndarray  # [B] int64: the index of its strategy in the drafter's strategies, -1: no draft
    failures: dict[int, Exception] = field(default_factory=dict)

    @classmethod
    def zeros(cls, batch: int, w: int) -> BatchDrafts:
        return cls(
            np.zeros((batch, w), np.int64), np.zeros(batch, np.int64), np.zeros((batch, w)), np.zeros(batch, np.int64)
        )


class BatchDrafter(Protocol):
    """Drafts for every running request of an engine step in one call (what vLLM's proposer
    holds). A request's life: `start` once, before its first step; `step` at each engine step it
    runs in; `finish` once, when it ends or leaves the engine (a request that comes back starts
    again). Stepping a request not started, or starting one twice, raises `LifecycleError`."""

    strategies: Sequence[str]  # what BatchDrafts.strategy indexes

    def start(self, key: Hashable, prompt_length: int, limit: int) -> None:
        """A request begins: its first prompt_length tokens are its prompt; it may reach `limit` tokens."""

    def step(
        self,
        keys: Sequence[Hashable],
        tokens: np.ndarray,
        rows: np.ndarray,
        lengths: np.ndarray,
        step_cost: np.ndarray | None = None,
    ) -> BatchDrafts:
        """One engine step's drafts for every request in `keys`, in one call.

        Request i (keys[i]) is tokens[rows[i], :lengths[i]]; step_cost[n], the step's seconds when it
        feeds n tokens, cuts the drafts to what pays (None: no budget). Returns BatchDrafts: request
        i's draft is tokens[i, :lengths[i]]. The arrays may be the drafter's buffers: read them
        before the next step."""

    def finish(self, key: Hashable, generated: Sequence[int] = ()) -> None:
        """A request ended (or left the engine); `generated`: its generated tokens, all of them."""


class LifecycleError(ValueError):
    """A batch drafter used out of a request's order: start, steps, finish."""


def not_started(keys) -> LifecycleError:
    return LifecycleError(
        f"requests {list(keys)[:5]} were not started (or were finished): start(key, prompt_length, "
        f"limit) comes before a request's first step"
    )


def started_twice(key) -> LifecycleError:
    return LifecycleError(f"request {key!r} was started already: finish it before starting it again")


def pad_rows(rows: list[list[int]], strategies: list[str], k: int, w: int, pad_token: int) -> Drafts:
    """Deduplicates rows (first wins), then pads to k rows with "padding" rows."""
    seen: set[tuple[int, ...]] = set()
    kept_rows, kept_strategies = [], []
    for row, strategy in zip(rows, strategies):
        key = tuple(row)
        if key in seen or len(kept_rows) == k:
            continue
        seen.add(key)
        kept_rows.append(list(row))
        kept_strategies.append(strategy)
    while len(kept_rows) < k:
        kept_rows.append([pad_token] * w)
        kept_strategies.append(PADDING)
    tokens = torch.tensor(kept_rows, dtype=torch.long).reshape(k, w)
    return Drafts(tokens=tokens, strategies=tuple(kept_strategies))
