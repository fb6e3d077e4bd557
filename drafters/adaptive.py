"""Adaptive (k, w): each step verifies the (k, w) that maximises expected tokens per second.

expected tokens per second ∝ expected tokens per call / relative call cost (a CallCost: the
transformers engine measures one, pipeline/engines/transformers/cost_model.py).

Expected tokens per call comes from the request's own acceptance history. Row r of a step is
modelled as accepting each next draft token with probability α_(s, r) (s its strategy, r its
rank among that strategy's rows); then

    E[tokens per call](k, w) = 1 + Σ_{j=1..w} P(some row accepts at least j tokens),

where rows with different j-token prefixes are disjoint events (their probabilities α_(s,r)^j
add, up to 1) and rows sharing a prefix are one.

w = 0 (a plain step, cost 1, one token) is always a candidate, so a request whose drafts keep
failing falls back to plain decoding instead of paying for verification.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from drafters.base import Drafts, common_prefix


class CallCost(Protocol):
    def cost(self, k: int, w: int, context_length: int) -> float:
        """The time of a verification call over k rows of w draft tokens at this context length,
        relative to a single-token call's."""
        ...


# A request's first steps lean on the α earlier requests saw, weighted as this many checked tokens.
PRIOR_WEIGHT = 4.0


@dataclass
class AcceptanceEstimate:
    """Evidence about one row kind's per-token acceptance rate α."""
    accepted: float = 0.0
    checked: float = 0.0

    def observe(self, num_accepted: int, w: int) -> None:
        """A row that accepted num_accepted of w tokens: each accepted token and the first
        rejection (if any) was a Bernoulli trial of α."""
        self.accepted += num_accepted
        self.checked += num_accepted + (1 if num_accepted < w else 0)

    def alpha(self, prior: float, prior_weight: float) -> float:
        return (self.accepted + prior_weight * prior) / (self.checked + prior_weight)


# Row kind: (strategy, rank among that strategy's rows in the proposal).
RowKind = tuple[str, int]


@dataclass
class AdaptiveChoice:
    k: int
    w: int
    expected_tokens: float
    relative_cost: float
    rows: list[int] = field(default_factory=list)  # which proposed rows to verify, best first


@dataclass
class AdaptiveController:
    """One per request: it learns that request's acceptance rates, starting from `pool`, the
    evidence of every request of the decoder so far (α = 1/2 for a row kind never seen). The pool
    grows as evidence comes, so requests that run together learn from each other at once."""
    costs: CallCost
    pool: dict[RowKind, AcceptanceEstimate] = field(default_factory=dict)
    estimates: dict[RowKind, AcceptanceEstimate] = field(default_factory=dict)
    # Interpolated costs by (k, w, context length rounded to 32): the context grows one step at a time.
    cost_memo: dict[tuple[int, int, int], float] = field(default_factory=dict)

    def cost(self, k: int, w: int, context_length: int) -> float:
        key = (k, w, context_length // 32 * 32)
        if key not in self.cost_memo:
            self.cost_memo[key] = self.costs.cost(k, w, key[2])
        return self.cost_memo[key]

    def alpha(self, kind: RowKind) -> float:
        prior = self.pool.get(kind, AcceptanceEstimate()).alpha(0.5, 2.0)
        return self.estimates.get(kind, AcceptanceEstimate()).alpha(prior, PRIOR_WEIGHT)

    def row_alphas(self, drafts: Drafts) -> np.ndarray:
        """α of each row ([k_max]), keyed by its strategy and its rank among that strategy's rows."""
        seen: dict[str, int] = {}
        alphas = []
        for strategy in drafts.strategies:
            rank = seen[strategy] = seen.get(strategy, -1) + 1
            alphas.append(self.alpha((strategy, rank)))
        return np.array(alphas)

    def expected_tokens(self, drafts: Drafts) -> tuple[np.ndarray, np.ndarray]:
        """(order [k_max]: the rows by α, best first; tokens [k_max, w_max]: the expected tokens
        per call of verifying the first k rows of that order cut to w tokens)."""
        k_max, w_max = drafts.tokens.shape
        alphas = self.row_alphas(drafts)  # [k_max]
        order = np.argsort(-alphas, kind="stable")  # ties keep the proposal's rank
        rows = drafts.tokens.numpy()[order]  # [k_max, w_max]
        powers = alphas[order][:, None] ** np.arange(1, w_max + 1)[None, :]  # [k_max, w_max]: P(row accepts >= j)
        # hit[k-1, j-1] = P(one of the first k rows accepts >= j tokens). Rows with different j-token
        # prefixes are disjoint events (the target's next j tokens match at most one), so their
        # probabilities add; rows sharing a prefix are one event. (Independent rows, 1 - Π(1 - p),
        # would undervalue alternatives such as the bigram's top-k.)
        hit = np.empty((k_max, w_max))
        for j in range(1, w_max + 1):
            best: dict[bytes, float] = {}
            total = 0.0
            for r in range(k_max):
                prefix = rows[r, :j].tobytes()
                gain = powers[r, j - 1] - best.get(prefix, 0.0)
                if gain > 0:
                    best[prefix] = powers[r, j - 1]
                    total += gain
                hit[r, j - 1] = min(1.0, total)
        hit = np.minimum.accumulate(hit, axis=1)  # accepting j tokens needs accepting j - 1
        return order, 1 + np.cumsum(hit, axis=1)

    def choose(self, drafts: Drafts, context_length: int, auto_k: bool = True, auto_w: bool = True) -> AdaptiveChoice:
        """The best (k, w) of one request verified alone as a [k, w+1] block, over the rows of
        `drafts` ([k_max, w_max]) taken in order of their α, so the k rows are allocated between
        strategies by how well each has done for this request (choose_shape decides)."""
        k_max, w_max = drafts.tokens.shape
        order, tokens = self.expected_tokens(drafts)  # [k_max], [k_max, w_max]
        shape = choose_shape([tokens], lambda rows, width: self.cost(rows, width, context_length),
                             k_max, w_max, auto_k, auto_w)
        rows = [int(i) for i in order[:shape.rows]] if shape.width else []
        return AdaptiveChoice(max(shape.rows, 1), shape.width, shape.expected_tokens, shape.relative_cost, rows)

    def observe(self, drafts: Drafts, row_accepted: list[int]) -> None:
        w = drafts.tokens.shape[1]
        seen: dict[str, int] = {}
        for strategy, accepted in zip(drafts.strategies, row_accepted):
            rank = seen[strategy] = seen.get(strategy, -1) + 1
            self.estimates.setdefault((strategy, rank), AcceptanceEstimate()).observe(accepted, w)
            self.pool.setdefault((strategy, rank), AcceptanceEstimate()).observe(accepted, w)


def judge_proposals(controller: AdaptiveController, pending: list[tuple[int, Drafts]],
                    generated: list[int]) -> list[tuple[int, Drafts]]:
    """Scores every proposed row, verified or not, against the tokens the request went on to emit:
    a row would have accepted exactly its common prefix with them (greedy, and point-draft
    sampling, which matches drafts against the sampled tokens). A proposal is judged as soon as
    every row's fate is known (a token it got wrong, or all of its w tokens emitted), so a wrong
    guess teaches the controller at the next step. Returns the proposals still waiting."""
    waiting = []
    for position, drafts in pending:
        w = drafts.tokens.shape[1]
        actual = generated[position:position + w]
        accepted = [common_prefix(row, actual) for row in drafts.tokens.tolist()]
        if any(length == len(actual) < w for length in accepted):  # a row right so far: wait
            waiting.append((position, drafts))
            continue
        controller.observe(drafts, accepted)
    return waiting


@dataclass(frozen=True)
class Shape:
    rows: int  # draft rows each request verifies (0 with width 0: a plain step)
    width: int  # tokens per row
    expected_tokens: float  # per call, summed over the requests
    relative_cost: float  # of the call (CallCost)


def choose_shape(tables: list[np.ndarray | None], call_cost, max_rows: int, max_width: int, auto_rows: bool = True,
                 auto_width: bool = True, max_fed: int | None = None) -> Shape:
    """The one draft shape every request of a call verifies (rows x width each) that maximises
    expected tokens per unit cost. Both decoders call it: one request alone, or the requests of
    a batched call.
    tables: per request, [k_b, w_b] expected tokens per call of verifying its first k rows cut to
    w tokens (expected_tokens), or None when it proposed nothing (one token);
    call_cost(rows, width): the relative cost of the call that verifies it (width 0: no drafts);
    max_fed: a cap on rows x width per request. A dimension that is not auto stays at its maximum;
    a plain step is always a candidate."""
    best = Shape(0, 0, float(len(tables)), call_cost(1, 0))
    for rows in range(1 if auto_rows else max_rows, max_rows + 1):
        for width in range(1 if auto_width else max_width, max_width + 1):
            if max_fed is not None and rows * width > max_fed:
                continue
            tokens = sum(1.0 if table is None else float(table[min(rows, table.shape[0]) - 1,
                                                                min(width, table.shape[1]) - 1]) for table in tables)
            cost = call_cost(rows, width)
            if tokens / cost > best.expected_tokens / best.relative_cost:
                best = Shape(rows, width, tokens, cost)
    return best
