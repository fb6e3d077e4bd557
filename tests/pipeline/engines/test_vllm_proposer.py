"""The vLLM proposer's pure parts, without vLLM: the draft-length choice (drafters/budget.py's allocator) and
the per-request statistics taken from vLLM's metrics and the proposer's drafts."""
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

from drafters.adaptive import AdaptiveController
from pipeline.engines.vllm.engine import request_stats
from drafters.budget import LinearStepCost, StepCostFit
from pipeline.engines.vllm.proposer import (
    Proposal,
    Tracked,
    allocate,
    external_request_id,
)


def geometric(alpha: float, length: int) -> list[float]:
    """Gains of a draft whose tokens are each accepted with probability alpha: α, α², ..."""
    return [alpha ** (j + 1) for j in range(length)]


def test_allocation_drafts_while_a_token_pays_for_its_cost():
    # Free tokens: every candidate is drafted in full; a token costing a whole step: none.
    assert allocate([geometric(0.9, 8), geometric(0.2, 3)], LinearStepCost(0.05, 0.0)) == [8, 3]
    assert allocate([geometric(0.9, 8), geometric(0.2, 3)], LinearStepCost(0.05, 10.0)) == [0, 0]
    # One request alone (a = 50 ms, b = 2 ms a token): drafting pays while α^j > b T / C.
    taken = allocate([geometric(0.6, 8)], LinearStepCost(0.05, 0.002))
    expected, cost = 1 + sum(0.6 ** j for j in range(1, taken[0] + 1)), 0.05 + 0.002 * (1 + taken[0])
    assert taken == [5] and 0.6 ** 6 <= 0.002 * expected / cost
    # Tokens go to the request most likely to accept them, not to the one that asked first.
    assert allocate([geometric(0.1, 4), geometric(0.95, 4)], LinearStepCost(0.1, 0.01)) == [0, 4]


def test_a_confident_drafter_gets_long_drafts_where_it_is_sure_and_short_where_not():
    # Gains are the drafter's own path probabilities: a sure path is drafted in full, an unsure
    # one stops where its probability no longer pays for a token (b T / C is about 0.5 here).
    sure, unsure = [0.95, 0.9, 0.9, 0.85], [0.6, 0.2, 0.15, 0.1]
    assert allocate([sure, unsure], LinearStepCost(0.1, 0.02)) == [4, 1]


def test_drafts_that_fail_after_their_first_token_are_cut_to_it():
    from drafters.base import DraftContext

    depths = {}
    tracked = Tracked(context=DraftContext([1, 2, 3], 2), prompt_length=3, limit=100,
                      controller=AdaptiveController(None, {}))
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


class FakeRunner:
    """What the proposer reads of vLLM's model runner: the running requests' ids and limits."""

    def __init__(self):
        self.input_batch = SimpleNamespace(req_ids=[])
        self.requests = {}

    def run(self, request_id: str, max_tokens: int = 100) -> None:
        self.input_batch.req_ids = [request_id]
        self.requests = {request_id: SimpleNamespace(sampling_params=SimpleNamespace(max_tokens=max_tokens))}


def test_step_costs_see_decoding_steps_only_not_prefills_or_pauses_between_generate_calls():
    import time

    import numpy as np

    from drafters.context_ngram import ContextNgramDrafter
    from pipeline.engines.vllm.proposer import NgrammysProposer

    config = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=4),
                             model_config=SimpleNamespace(max_model_len=64, get_vocab_size=lambda: 100))
    proposer, runner = NgrammysProposer(config), FakeRunner()
    proposer.configure(runner, ContextNgramDrafter(2), 4, 2, adaptive=True)
    proposer.costs = StepCostFit(memory=1.0)
    tokens = np.arange(64)[None, :] % 7  # [1, max_model_len]

    def step(request_id, length, emitted):
        runner.run(request_id)
        proposer.propose([list(tokens[0, length - emitted:length])], np.array([length]), tokens)

    step("a-00000000", 10, 1)  # its prefill ran in the step before: nothing measured
    step("a-00000000", 12, 2)  # a decoding step: measured
    assert proposer.costs.sums[0] == 1
    time.sleep(0.3)  # LLM.generate returned; the caller paused before its next call
    step("b-00000000", 10, 1)  # a new request's prefill: neither it nor the pause is a step
    step("b-00000000", 11, 1)
    weight, _, seconds, _, _ = proposer.costs.sums
    assert weight == 2 and seconds < 0.3


def fake_proposer(drafter, w: int, requests: int, adaptive: bool):
    """NgrammysProposer as vLLM builds it, with a runner holding `requests` running requests."""
    import numpy as np

    from pipeline.engines.vllm.proposer import NgrammysProposer

    config = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=w),
                             model_config=SimpleNamespace(max_model_len=512, get_vocab_size=lambda: 64))
    proposer = NgrammysProposer(config)
    ids = [f"r{i}-abcdefgh" for i in range(requests)]
    batch = SimpleNamespace(req_ids=ids, req_id_to_index={key: i for i, key in enumerate(ids)},
                            num_prompt_tokens=np.full(requests, 40))
    runner = SimpleNamespace(input_batch=batch, requests={key: SimpleNamespace(
        sampling_params=SimpleNamespace(max_tokens=100)) for key in ids})
    proposer.configure(runner, drafter, w, 3, adaptive)
    return proposer


def test_a_proposer_call_for_256_requests_is_one_compiled_call():
    import numpy as np

    from drafters.batch_suffix import BatchSuffixDrafter

    drafter = BatchSuffixDrafter(4, 3, 1)
    proposer = fake_proposer(drafter, 4, 256, adaptive=True)
    rng = np.random.default_rng(0)
    tokens = np.tile(rng.integers(0, 8, 30), (256, 4)).astype(np.int32)  # [256, 120] repeating: drafts
    calls = drafter.compiled_calls
    drafts = proposer.propose([[5]] * 256, np.full(256, 90), tokens)
    assert drafter.compiled_calls == calls + 1
    assert len(drafts) == 256 and any(drafts)
    for row, draft in enumerate(drafts):  # each draft is the request's own continuation here
        assert draft == tokens[row, 90:90 + len(draft)].tolist()
    assert all(t.steps == 1 for t in proposer.tracked.values())


def test_a_batched_drafter_that_raises_costs_the_step_its_drafts_and_nothing_else():
    import numpy as np

    class Failing:
        strategies = ("x",)

        def step(self, *args):
            raise RuntimeError("broken")

        def finish(self, key, generated=None):
            pass

    proposer = fake_proposer(Failing(), 4, 3, adaptive=False)
    drafts = proposer.propose([[5], [6], []], np.full(3, 50), np.zeros((3, 60), np.int32))
    assert drafts == [[], [], []]
    assert sorted(t.failed_steps for t in proposer.tracked.values()) == [1, 1]
