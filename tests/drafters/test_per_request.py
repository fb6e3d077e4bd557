"""drafters/per_request.py: a per-request drafter as a BatchDrafter. Its draft lengths under a step
budget (drafters/budget.py's allocator over each request's gains), its lifecycle, and a drafter
that fails for one request costing that request its draft and nothing more."""

import numpy as np
import pytest
import torch

from drafters.adaptive import AdaptiveController
from drafters.base import DraftContext, Drafts, LifecycleError
from drafters.budget import LinearStepCost
from drafters.context_ngram import ContextNgramDrafter
from drafters.per_request import PerRequestBatchDrafter, RequestState, allocate


def geometric(alpha: float, length: int) -> list[float]:
    """Gains of a draft whose tokens are each accepted with probability alpha: α, α², ..."""
    return [alpha ** (j + 1) for j in range(length)]


def test_allocation_drafts_while_a_token_pays_for_its_cost():
    # Free tokens: every candidate is drafted in full; a token costing a whole step: none.
    assert allocate([geometric(0.9, 8), geometric(0.2, 3)], LinearStepCost(0.05, 0.0)) == [8, 3]
    assert allocate([geometric(0.9, 8), geometric(0.2, 3)], LinearStepCost(0.05, 10.0)) == [0, 0]
    # One request alone (a = 50 ms, b = 2 ms a token): drafting pays while α^j > b T / C.
    taken = allocate([geometric(0.6, 8)], LinearStepCost(0.05, 0.002))
    expected, cost = 1 + sum(0.6**j for j in range(1, taken[0] + 1)), 0.05 + 0.002 * (1 + taken[0])
    assert taken == [5] and 0.6**6 <= 0.002 * expected / cost
    # Tokens go to the request most likely to accept them, not to the one that asked first.
    assert allocate([geometric(0.1, 4), geometric(0.95, 4)], LinearStepCost(0.1, 0.01)) == [0, 4]


def test_a_confident_drafter_gets_long_drafts_where_it_is_sure_and_short_where_not():
    # Gains are the drafter's own path probabilities: a sure path is drafted in full, an unsure
    # one stops where its probability no longer pays for a token (b T / C is about 0.5 here).
    sure, unsure = [0.95, 0.9, 0.9, 0.85], [0.6, 0.2, 0.15, 0.1]
    assert allocate([sure, unsure], LinearStepCost(0.1, 0.02)) == [4, 1]


def test_drafts_that_fail_after_their_first_token_are_cut_to_it():
    depths = {}
    tracked = RequestState(
        prompt_length=3, limit=100, controller=AdaptiveController(None, {}), context=DraftContext([1, 2, 3], 2)
    )
    prior = tracked.gains("suffix_context", 3, None, depths)
    assert prior[1] == pytest.approx(prior[0] * 0.5)  # no evidence: a prior of one in two per depth
    for _ in range(20):  # each verified draft: its first token right, its second wrong
        tracked.last_draft = (len(tracked.context), (7, 8, 9), "suffix_context")
        tracked.context.append([7, 5])
        tracked.settle(depths)
    assert depths["suffix_context"].reached[1] == 20 and depths["suffix_context"].passed[1] == 0
    gains = tracked.gains("suffix_context", 3, None, depths)
    assert gains[1] < 0.05 * gains[0] and gains[2] <= gains[1]
    assert allocate([gains], LinearStepCost(0.05, 0.002)) == [1]
    # A drafter that gives its own (calibrated) confidence is taken at its word, depth evidence or not.
    assert tracked.gains("suffix_context", 3, (0.9, 0.8, 0.7), depths) == [0.9, 0.8, 0.7]
    assert tracked.gains("suffix_context", 2, (0.9, 0.8, 0.7), depths) == [0.9, 0.8]


def test_misuse_of_the_lifecycle_raises():
    drafter = PerRequestBatchDrafter(ContextNgramDrafter(2), 4, 2)
    tokens = np.zeros((1, 10), np.int64)
    with pytest.raises(LifecycleError, match="were not started"):
        drafter.step(["a"], tokens, np.zeros(1, np.int64), np.array([5]))
    drafter.start("a", 3, 10)
    with pytest.raises(LifecycleError, match="started already"):
        drafter.start("a", 3, 10)
    drafter.finish("a")
    with pytest.raises(LifecycleError, match="were not started"):
        drafter.finish("a")


def test_a_request_gets_its_own_context_drafts_and_a_failing_one_only_loses_its_own():
    class FailsOnSeven:
        """Context n-gram drafts, but raises for a context that holds token 7."""

        def __init__(self):
            self.inner = ContextNgramDrafter(2)

        def propose(self, context, k, w):
            if 7 in context.tokens:
                raise RuntimeError("seven")
            return self.inner.propose(context, k, w)

    drafter = PerRequestBatchDrafter(FailsOnSeven(), 3, 2)
    tokens = np.array([[1, 2, 3, 1, 2, 3, 1, 2, 0, 0], [1, 2, 7, 1, 2, 7, 1, 2, 0, 0]])
    for key in ("a", "b"):
        drafter.start(key, 2, 20)
    out = drafter.step(["a", "b"], tokens, np.array([0, 1]), np.array([8, 8]))
    assert (
        out.tokens[0, : out.lengths[0]].tolist() == [3, 1, 2] and drafter.strategies[out.strategy[0]] == "context_ngram"
    )
    assert out.lengths[1] == 0 and isinstance(out.failures[1], RuntimeError) and 0 not in out.failures
    drafter.finish("a", [3, 1, 2, 3])
    assert "a" not in drafter.requests


def test_a_drafter_that_returns_no_token_ids_fails_for_its_request():
    class Floats:
        def propose(self, context, k, w):
            return Drafts(torch.zeros((k, w)), ("x",) * k)

    drafter = PerRequestBatchDrafter(Floats(), 3, 2)
    drafter.start("a", 2, 10)
    out = drafter.step(["a"], np.zeros((1, 10), np.int64), np.array([0]), np.array([4]))
    assert out.lengths[0] == 0 and "integer tensor" in str(out.failures[0])
