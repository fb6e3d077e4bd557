"""The vLLM proposer's pure parts, without vLLM: the step-cost fit, the draft-length choice and
the per-request statistics taken from vLLM's metrics and the proposer's drafts."""
from dataclasses import dataclass, field

import pytest

from pipeline.engines.vllm.engine import request_stats
from pipeline.engines.vllm.proposer import Proposal, StepCosts, Tracked, allocate, external_request_id


def test_step_costs_recover_a_line_and_fall_back_to_the_prior_slope():
    costs = StepCosts(memory=1.0)
    for tokens in (1, 5, 9, 3, 17, 2):
        costs.observe(tokens, 0.050 + 0.002 * tokens)
    a, b = costs.line()
    assert a == pytest.approx(0.050, rel=0.05) and b == pytest.approx(0.002, rel=0.1)
    flat = StepCosts(memory=1.0, prior_slope=0.02)
    for _ in range(10):
        flat.observe(4, 0.1)  # no variation in tokens: nothing to fit a slope to
    assert flat.line()[1] == pytest.approx(0.02 * 0.1)


def test_allocation_drafts_while_a_token_pays_for_its_cost():
    # Free tokens: every candidate is drafted in full; a token costing a whole step: none.
    assert allocate([0.9, 0.2], [8, 3], (0.05, 0.0)) == [8, 3]
    assert allocate([0.9, 0.2], [8, 3], (0.05, 10.0)) == [0, 0]
    # One request alone (a = 50 ms, b = 2 ms a token): drafting pays while α^j > b T / C.
    taken = allocate([0.6], [8], (0.05, 0.002))
    expected, cost = 1 + sum(0.6 ** j for j in range(1, taken[0] + 1)), 0.05 + 0.002 * (1 + taken[0])
    assert taken == [5] and 0.6 ** 6 <= 0.002 * expected / cost
    # Tokens go to the request most likely to accept them, not to the one that asked first.
    assert allocate([0.1, 0.95], [4, 4], (0.1, 0.01)) == [0, 4]


@dataclass
class Metrics:  # vLLM's RequestSpecDecodeMetrics, as much as the engine reads
    histogram: list
    num_draft_tokens: int
    per_step_accepted: list = field(default_factory=list)
    per_step_drafted: list = field(default_factory=list)


def test_statistics_map_vllm_metrics_and_attribute_each_strategy():
    # 10 tokens in 6 steps: the prefill's token, a plain step, three drafted steps accepting
    # 3, 0 and 1 tokens, and the last step, whose draft was never verified.
    token_ids = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19]
    proposals = [Proposal(2, (12, 13, 14, 99), "context_ngram"), Proposal(6, (77,), "bigram"),
                 Proposal(7, (17, 99), "context_ngram"), Proposal(10, (5, 6), "context_ngram")]
    tracked = Tracked(context=None, prompt_length=4, limit=100, controller=None, steps=6, draft_seconds=0.01, proposals=proposals)
    metrics = Metrics(histogram=[1, 1, 0, 1, 0], num_draft_tokens=7, per_step_accepted=[3, 0, 1],
                      per_step_drafted=[4, 1, 2])
    stats = request_stats(4, token_ids, metrics, tracked, w=4)
    assert stats.num_target_calls == 6 and stats.num_generated_tokens == 10 and stats.tokens_per_call == 10 / 6
    assert stats.num_verified_tokens == 6 + 7
    assert stats.accepted_length_histogram == [4, 1, 0, 1, 0]  # the three steps without a draft accepted none
    assert stats.accepted_rank_histogram == [2]
    assert stats.num_checked_draft_tokens == 4 + 1 + 2 and stats.alpha == pytest.approx(4 / 7)
    assert stats.strategy_rows == {"context_ngram": 2, "bigram": 1, "none": 3}
    assert stats.strategy_wins == {"context_ngram": 2} and stats.strategy_accepted_tokens == {"context_ngram": 4}


def test_plain_vllm_statistics_follow_from_the_tokens():
    stats = request_stats(4, [1, 2, 3], None, None, w=0)
    assert (stats.num_target_calls, stats.tokens_per_call, stats.strategy_rows) == (3, 1.0, {"none": 3})
    assert stats.accepted_length_histogram == [3]


def test_external_request_ids():
    assert external_request_id("17-0a1b2c3d") == "17" and external_request_id("a-b-c-0a1b2c3d") == "a-b-c"
