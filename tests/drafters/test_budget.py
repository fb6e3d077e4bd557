"""The draft budget (drafters/budget.py): one allocator for every engine and drafter, and the
step costs it weighs. It drafts nothing when no token's expected gain covers what it costs, fills
the step when drafts are certain and tokens are cheap, and its choice is the best there is."""

import json
from pathlib import Path

import numpy as np
import pytest

from drafters.budget import (
    LinearStepCost,
    StepCostFit,
    allocate,
    cost_table,
)
from jobs.benchmark.step_costs import GPUS, MODELS, MeasuredStepCost, RooflineStepCost

H100_STEP = (
    Path(__file__).parents[2] / "docs" / "data" / "h100_8b_step_ctx448.json"
)  # measured: docs/measurements/gpu-projection.md


def budget(gains: np.ndarray, cost) -> np.ndarray:
    """Each request's kept draft tokens; gains [B, W], every draft W long."""
    batch, width = gains.shape
    taken = np.zeros(batch, np.int64)
    allocate(gains, np.full(batch, width, np.int64), cost_table(cost, batch, width), taken)
    return taken


def tokens_per_second(gains: np.ndarray, taken: np.ndarray, cost) -> float:
    expected = len(taken) + sum(gains[b, : taken[b]].sum() for b in range(len(taken)))
    return expected / float(cost.seconds(len(taken) + taken.sum()))


def test_nothing_is_drafted_when_no_token_covers_its_cost():
    # Tokens cost about all a step does (a step of 4 requests 4.1 s, 1 s more per token): even a
    # draft accepted nine times in ten does not pay.
    assert budget(np.full((4, 6), 0.9), LinearStepCost(0.1, 1.0)).tolist() == [0] * 4
    # Cheap tokens, but drafts that are never right.
    assert budget(np.zeros((4, 6)), LinearStepCost(1.0, 1e-4)).tolist() == [0] * 4
    # On an H100 at 256 requests (8B, measured), a second token per request costs 2.2x a step:
    # not even certain drafts pay for it.
    report = json.loads(H100_STEP.read_text())
    assert budget(np.ones((256, 4)), MeasuredStepCost.from_report(report, 256)).sum() == 0


@pytest.mark.parametrize(
    "cost",
    [LinearStepCost(1.0, 1e-4), RooflineStepCost(GPUS["h100"], MODELS["8b"], 16, 448.0), "h100-measured"],
    ids=["linear", "roofline", "h100-measured"],
)
def test_certain_drafts_fill_the_step_where_tokens_are_cheap(cost):
    if cost == "h100-measured":  # 16 requests fed 7 tokens each: 1.19x the step of one token each
        cost = MeasuredStepCost.from_report(json.loads(H100_STEP.read_text()), 16)
    assert budget(np.ones((16, 6)), cost).tolist() == [6] * 16


@pytest.mark.parametrize("seed", range(20))
def test_the_allocation_is_the_best_choice_of_draft_prefixes(seed):
    """Against every number of kept tokens, each filled most likely first (the best set of that
    size: a request's probabilities never rise along its draft, so that set is made of prefixes)."""
    rng = np.random.default_rng(seed)
    batch, width = int(rng.integers(1, 6)), int(rng.integers(1, 6))
    gains = np.minimum.accumulate(rng.random((batch, width)) ** rng.uniform(0.3, 3), axis=1)
    cost = LinearStepCost(1.0, float(rng.uniform(0.001, 0.3)))
    taken = budget(gains, cost)
    order = np.argsort(-gains, axis=None, kind="stable")
    best = 0.0
    for kept in range(batch * width + 1):
        chosen = np.zeros(batch, np.int64)
        for index in order[:kept]:
            chosen[index // width] += 1
        best = max(best, tokens_per_second(gains, chosen, cost))
    assert tokens_per_second(gains, taken, cost) == pytest.approx(best, rel=1e-9)
    assert all(np.all(np.diff(gains[b]) <= 0) for b in range(batch))


def test_step_cost_fit_recovers_a_line_and_falls_back_to_the_prior_slope():
    costs = StepCostFit(memory=1.0)
    for tokens in (1, 5, 9, 3, 17, 2):
        costs.observe(tokens, 0.050 + 0.002 * tokens)
    assert costs.cost().a == pytest.approx(0.050, rel=0.05) and costs.cost().b == pytest.approx(0.002, rel=0.1)
    flat = StepCostFit(memory=1.0, prior_slope=0.02)
    for _ in range(10):
        flat.observe(4, 0.1)  # no variation in tokens: nothing to fit a slope to
    assert flat.cost().b == pytest.approx(0.02 * 0.1)
    free = StepCostFit(memory=1.0, prior_slope=0.02)
    for tokens in (1, 9, 3, 17):
        free.observe(tokens, 0.1)  # more tokens, no more time: the fit says free, the floor does not
    assert free.cost().b == pytest.approx(0.02 * 0.1)
