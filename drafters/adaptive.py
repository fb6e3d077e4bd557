"""Adaptive (k, w): each step verifies the (k, w) that maximises expected tokens per second.

expected tokens per second ∝ expected tokens per call / relative call cost: the engine's step cost
c(n), learned from its own calls (StepCostFit, the one step-cost model of both
engines), a call over k rows of w draft tokens feeding n = k (w + 1) tokens.

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

import numpy as np

from drafters.base import Drafts, common_prefix
from drafters.budget import StepCostFit, choose_shape, relative_cost


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

    costs: StepCostFit | None  # the engine's step cost, learned from its calls (None: it chooses no shape)
    pool: dict[RowKind, AcceptanceEstimate] = field(default_factory=dict)
    estimates: dict[RowKind, AcceptanceEstimate] = field(default_factory=dict)

    def cost(self, k: int, w: int) -> float:
        """A call over k rows of w draft tokens against a one-token call, by the step cost so far."""
        return relative_cost(self.costs.cost(), k * (w + 1), 1)

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

    def choose(self, drafts: Drafts, auto_k: bool = True, auto_w: bool = True) -> AdaptiveChoice:
        """The best (k, w) of one request verified alone as a [k, w+1] block, over the rows of
        `drafts` ([k_max, w_max]) taken in order of their α, so the k rows are allocated between
        strategies by how well each has done for this request (choose_shape decides)."""
        k_max, w_max = drafts.tokens.shape
        order, tokens = self.expected_tokens(drafts)  # [k_max], [k_max, w_max]
        shape = choose_shape([tokens], self.cost, k_max, w_max, auto_k, auto_w)
        rows = [int(i) for i in order[: shape.k]] if shape.w else []
        return AdaptiveChoice(max(shape.k, 1), shape.w, shape.expected_tokens, shape.relative_cost, rows)

    def observe(self, drafts: Drafts, row_accepted: list[int]) -> None:
        w = drafts.tokens.shape[1]
        seen: dict[str, int] = {}
        for strategy, accepted in zip(drafts.strategies, row_accepted):
            rank = seen[strategy] = seen.get(strategy, -1) + 1
            self.estimates.setdefault((strategy, rank), AcceptanceEstimate()).observe(accepted, w)
            self.pool.setdefault((strategy, rank), AcceptanceEstimate()).observe(accepted, w)


def judge_proposals(
    controller: AdaptiveController, pending: list[tuple[int, Drafts]], generated: list[int]
) -> list[tuple[int, Drafts]]:
    """Scores every proposed row, verified or not, against the tokens the request went on to emit:
    a row would have accepted exactly its common prefix with them (greedy, and point-draft
    sampling, which matches drafts against the sampled tokens). A proposal is judged as soon as
    every row's fate is known (a token it got wrong, or all of its w tokens emitted), so a wrong
    guess teaches the controller at the next step. Returns the proposals still waiting."""
    waiting = []
    for position, drafts in pending:
        w = drafts.tokens.shape[1]
        actual = generated[position : position + w]
        accepted = [common_prefix(row, actual) for row in drafts.tokens.tolist()]
        if any(length == len(actual) < w for length in accepted):  # a row right so far: wait
            waiting.append((position, drafts))
            continue
        controller.observe(drafts, accepted)
    return waiting
