"""A per-request drafter (`Drafter`, which drafts for one DraftContext at a time)
as a `BatchDrafter`: what vLLM's proposer holds for every drafter but the batched suffix drafter.

Per request it keeps the context's n-gram index (grown by the tokens each step emitted, never
rebuilt) and the acceptance rate of each strategy, learned by judging every proposed draft against
the tokens the request went on to emit (drafters/adaptive.py). With a step budget (`step_cost`) a
draft's tokens are weighed by how likely they are to be accepted: the drafter's own confidence
where it gives one (the suffix drafter's acceptance model), else the first token as often as the
request's drafts of that strategy were right and each later one as often as the strategy's
verified drafts held at that depth (all requests); drafters/budget.py's allocator keeps those
that pay. A request whose drafts fail stops drafting.

A drafter that raises for a request, or returns something that is not a row of token ids, costs
that request its draft this step and nothing more: `BatchDrafts.failures` names it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from collections.abc import Hashable, Sequence

import numpy as np
import torch

from drafters import budget
from drafters.adaptive import AcceptanceEstimate, AdaptiveController, RowKind, judge_proposals
from drafters.base import PADDING, BatchDrafts, DraftContext, Drafter, Drafts, common_prefix, not_started, started_twice

NO_GUESS = (PADDING, (), None)  # (strategy, tokens, confidence) of a request without a guess


class DepthAcceptance:
    """How far one strategy's verified drafts held: of the drafts whose first j tokens were
    accepted and that had a (j+1)-th, how many had it accepted (per depth j >= 1)."""

    def __init__(self, prior: float = 0.5, prior_weight: float = 2.0):
        self.prior = prior
        self.prior_weight = prior_weight
        self.reached: list[float] = []
        self.passed: list[float] = []

    def observe(self, length: int, accepted: int) -> None:
        for depth in range(1, min(accepted + 1, length)):
            while len(self.reached) <= depth:
                self.reached.append(0.0)
                self.passed.append(0.0)
            self.reached[depth] += 1
            self.passed[depth] += depth < accepted

    def gains(self, first: float, length: int) -> list[float]:
        """P(first j+1 tokens accepted) for j < length, the first token's probability given."""
        gains, probability = [], first
        for depth in range(length):
            if depth:
                seen = depth < len(self.reached)
                passed, reached = (self.passed[depth], self.reached[depth]) if seen else (0.0, 0.0)
                probability *= (passed + self.prior_weight * self.prior) / (reached + self.prior_weight)
            gains.append(probability)
        return gains


@dataclass
class RequestState:
    """What is kept of one running request: its context (None until its first step), its
    acceptance rates per strategy, the candidates awaiting judgement and its last verified draft."""

    prompt_length: int
    limit: int  # the most tokens (prompt + generated) it may reach: a draft never goes past it
    controller: AdaptiveController
    context: DraftContext | None = None
    pending: list[tuple[int, Drafts]] = field(default_factory=list)
    last_draft: tuple[int, tuple[int, ...], str] | None = None  # (context length, tokens, strategy)

    def settle(self, depths: dict[str, DepthAcceptance]) -> None:
        """Scores the last verified draft against the tokens the context now has after it."""
        if self.last_draft is None:
            return
        start, tokens, strategy = self.last_draft
        accepted = common_prefix(tokens, self.context.tokens[start : start + len(tokens)])
        depths.setdefault(strategy, DepthAcceptance()).observe(len(tokens), accepted)
        self.last_draft = None

    def gains(
        self, strategy: str, length: int, confidence: tuple[float, ...] | None, depths: dict[str, DepthAcceptance]
    ) -> list[float]:
        """Probabilities that the candidate's first 1, 2, ... tokens are all accepted: the
        drafter's own where it gives them; else the first from this request's acceptance of the
        strategy, the later ones from how deep the strategy's verified drafts held (all requests)."""
        if confidence:
            return list(confidence[:length])
        first = self.controller.alpha((strategy, 0))
        return depths.get(strategy, DepthAcceptance()).gains(first, length)


def allocate(gains: list[list[float]], cost) -> list[int]:
    """Draft tokens per request for one step (`budget.allocate`): gains[r][j] the
    probability that request r's first j + 1 draft tokens are all accepted; `cost` a step cost
    (`seconds(n)`) or its table of seconds by tokens fed."""
    lengths = np.array([len(row) for row in gains], dtype=np.int64)
    max_w = max(1, int(lengths.max(initial=0)))
    table = np.zeros((len(gains), max_w))
    for r, row in enumerate(gains):
        table[r, : len(row)] = row
    step_cost = cost if isinstance(cost, np.ndarray) else budget.cost_table(cost, len(gains), max_w)
    taken = np.zeros(len(gains), dtype=np.int64)
    budget.allocate(table, lengths, step_cost, taken)
    return taken.tolist()


class PerRequestBatchDrafter:
    """`drafter` as a BatchDrafter: drafts of up to w tokens, of ids below vocab_size; contexts
    indexed for q-grams up to max_q."""

    def __init__(self, drafter: Drafter, w: int, max_q: int, vocab_size: int | None = None):
        self.drafter = drafter
        self.w = w
        self.max_q = max_q
        self.vocab_size = vocab_size
        self.strategies: list[str] = []  # every strategy seen, in order: what BatchDrafts.strategy indexes
        self.requests: dict[Hashable, RequestState] = {}
        self.pool: dict[RowKind, AcceptanceEstimate] = {}  # every request's evidence: a new request's prior
        self.depths: dict[str, DepthAcceptance] = {}  # per strategy, how deep verified drafts held

    def start(self, key: Hashable, prompt_length: int, limit: int) -> None:
        if key in self.requests:
            raise started_twice(key)
        self.requests[key] = RequestState(prompt_length, limit, AdaptiveController(None, self.pool))

    def finish(self, key: Hashable, generated: Sequence[int] = ()) -> None:
        if self.requests.pop(key, None) is None:
            raise not_started([key])

    def step(
        self,
        keys: Sequence[Hashable],
        tokens: np.ndarray,
        rows: np.ndarray,
        lengths: np.ndarray,
        step_cost: np.ndarray | None = None,
    ) -> BatchDrafts:
        missing = [key for key in keys if key not in self.requests]
        if missing:
            raise not_started(missing)
        out = BatchDrafts.zeros(len(keys), self.w)
        candidates = []
        for i, (key, row, length) in enumerate(zip(keys, rows, lengths)):
            request = self.requests[key]
            self._take_in(request, tokens[row], int(length))
            try:
                candidate = self._candidate(request, step_cost is not None)
            except Exception as error:  # noqa: BLE001 - the drafter is any code; the engine must survive it
                candidate, out.failures[i] = NO_GUESS, error
            candidates.append((i, request, candidate))
        gains = [
            request.gains(strategy, len(draft), confidence, self.depths)
            for _, request, (strategy, draft, confidence) in candidates
        ]
        kept = allocate(gains, step_cost) if step_cost is not None else [len(g) for g in gains]
        for (i, request, (strategy, draft, _)), gain, length in zip(candidates, gains, kept):
            if length:
                out.tokens[i, :length], out.confidence[i, :length] = draft[:length], gain[:length]
                out.lengths[i], out.strategy[i] = length, self._source(strategy)
                request.last_draft = (len(request.context), tuple(draft[:length]), strategy)
        return out

    def _take_in(self, request: RequestState, tokens: np.ndarray, length: int) -> None:
        """The request's context brought up to its `length` tokens; the drafts its new tokens
        decide are judged. First seen, or rewound: its context starts again from its tokens."""
        if request.context is None or len(request.context) > length:
            request.context, request.pending, request.last_draft = (
                DraftContext(tokens[:length].tolist(), self.max_q),
                [],
                None,
            )
            return
        request.context.append(tokens[len(request.context) : length].tolist())
        request.pending = judge_proposals(request.controller, request.pending, request.context.tokens)
        request.settle(self.depths)

    def _candidate(self, request: RequestState, judged: bool) -> tuple[str, tuple[int, ...], tuple[float, ...] | None]:
        """The drafter's row for the request (strategy, tokens, the drafter's confidence in them if
        it has one); no tokens when it has no guess. `judged`: a candidate without the drafter's
        confidence is judged later against what the request emits (its strategy's acceptance)."""
        w = min(self.w, request.limit - len(request.context) - 1)  # a step emits up to w + 1 tokens
        if w <= 0:
            return NO_GUESS
        drafts = self.drafter.propose(request.context, 1, w)  # [1, w]
        check_drafts(drafts, w, self.vocab_size)
        if drafts.strategies[0] == PADDING:
            return NO_GUESS
        length = w if drafts.lengths is None else drafts.lengths[0]  # a drafter may guess fewer than w
        confidence = None if drafts.confidence is None else drafts.confidence[0]
        if judged and not confidence:
            request.pending.append((len(request.context), Drafts(drafts.tokens[:1, :length], drafts.strategies[:1])))
        return drafts.strategies[0], tuple(drafts.tokens[0, :length].tolist()), confidence

    def _source(self, strategy: str) -> int:
        if strategy not in self.strategies:
            self.strategies.append(strategy)
        return self.strategies.index(strategy)


def check_drafts(drafts, w: int, vocab_size: int | None) -> None:
    """Raises unless `drafts` is a Drafts whose first row is w token ids of the vocabulary."""
    if not isinstance(drafts, Drafts):
        raise TypeError(f"the drafter returned {type(drafts).__name__}, not Drafts")
    tokens = drafts.tokens
    if (
        not isinstance(tokens, torch.Tensor)
        or tokens.dtype.is_floating_point
        or tokens.dim() != 2
        or tokens.shape[0] < 1
    ):
        raise TypeError(
            f"the drafter's tokens must be an integer tensor [k, w], got {getattr(tokens, 'dtype', type(tokens))} "
            f"{tuple(getattr(tokens, 'shape', ()))}"
        )
    if tokens.shape[1] > w:
        raise ValueError(f"the drafter drafted {tokens.shape[1]} tokens; at most {w} were asked for")
    row = tokens[0]
    limit = vocab_size if vocab_size is not None else float("inf")
    if row.numel() and (int(row.min()) < 0 or int(row.max()) >= limit) and drafts.strategies[0] != PADDING:
        raise ValueError(f"the drafter's tokens must be ids below the vocabulary's {vocab_size}, got {row.tolist()}")
