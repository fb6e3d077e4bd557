"""The vLLM proposer's pure parts, without vLLM: the requests' lifecycle with the drafter, the step
costs it learns, and the per-request statistics taken from vLLM's metrics and the proposer's drafts."""

from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np
import pytest

from drafters.budget import StepCostFit
from drafters.per_request import PerRequestBatchDrafter
from pipeline.engines.vllm.compat import external_request_id
from pipeline.engines.vllm.engine import request_stats
from pipeline.engines.vllm.proposer import Proposal, Tracked


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
    proposals = [
        Proposal(2, (12, 13, 14, 99), "context_ngram"),
        Proposal(6, (77,), "bigram"),
        Proposal(7, (17, 99), "context_ngram"),
        Proposal(10, (5, 6), "context_ngram"),
    ]
    tracked = Tracked(prompt_length=4, limit=100, steps=6, draft_seconds=0.01, proposals=proposals)
    metrics = Metrics(
        histogram=[1, 1, 0, 1, 0], num_draft_tokens=7, per_step_accepted=[3, 0, 1], per_step_drafted=[4, 1, 2]
    )
    stats = request_stats(4, token_ids, metrics, tracked, w=4)
    assert stats.num_target_calls == 6 and stats.num_generated_tokens == 10 and stats.tokens_per_call == 10 / 6
    assert stats.num_verified_tokens == 6 + 7
    assert stats.accepted_length_histogram == [4, 1, 0, 1, 0]  # the three steps without a draft accepted none
    assert stats.accepted_rank_histogram == [2]
    assert stats.num_checked_draft_tokens == 4 + 1 + 2 and stats.acceptance_rate == pytest.approx(4 / 7)
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
        self.input_batch = SimpleNamespace(req_ids=[], req_id_to_index={}, num_prompt_tokens=np.zeros(1, np.int64))
        self.requests = {}

    def run(self, request_id: str, prompt_length: int, max_tokens: int = 100) -> None:
        self.input_batch = SimpleNamespace(
            req_ids=[request_id], req_id_to_index={request_id: 0}, num_prompt_tokens=np.array([prompt_length])
        )
        self.requests = {
            request_id: SimpleNamespace(sampling_params=SimpleNamespace(max_tokens=max_tokens, extra_args=None))
        }


def test_step_costs_see_decoding_steps_only_not_prefills_or_pauses_between_generate_calls():
    import time

    from drafters.context_ngram import ContextNgramDrafter
    from pipeline.engines.vllm.proposer import NgrammysProposer

    config = SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=4),
        model_config=SimpleNamespace(max_model_len=64, get_vocab_size=lambda: 100),
    )
    proposer, runner = NgrammysProposer(config), FakeRunner()
    proposer.configure(runner, PerRequestBatchDrafter(ContextNgramDrafter(2), 4, 2), 4, adaptive=True)
    proposer.costs = StepCostFit(memory=1.0)
    tokens = np.arange(64)[None, :] % 7  # [1, max_model_len]

    def step(request_id, length, emitted):
        runner.run(request_id, 9)
        proposer.propose([list(tokens[0, length - emitted : length])], np.array([length]), tokens)

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
    from pipeline.engines.vllm.proposer import NgrammysProposer

    config = SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=w),
        model_config=SimpleNamespace(max_model_len=512, get_vocab_size=lambda: 64),
    )
    proposer = NgrammysProposer(config)
    ids = [f"r{i}-abcdefgh" for i in range(requests)]
    batch = SimpleNamespace(
        req_ids=ids, req_id_to_index={key: i for i, key in enumerate(ids)}, num_prompt_tokens=np.full(requests, 40)
    )
    runner = SimpleNamespace(
        input_batch=batch,
        requests={
            key: SimpleNamespace(sampling_params=SimpleNamespace(max_tokens=100, extra_args=None)) for key in ids
        },
    )
    proposer.configure(runner, drafter, w, adaptive)
    return proposer


def test_a_proposer_call_for_256_requests_is_one_compiled_call():
    from drafters.suffix import BatchSuffixDrafter, Settings

    drafter = BatchSuffixDrafter(4, Settings(min_q=1, max_q=3))
    proposer = fake_proposer(drafter, 4, 256, adaptive=True)
    rng = np.random.default_rng(0)
    tokens = np.tile(rng.integers(0, 8, 30), (256, 4)).astype(np.int32)  # [256, 120] repeating: drafts
    calls = drafter.compiled_calls
    drafts = proposer.propose([[5]] * 256, np.full(256, 90), tokens)
    assert drafter.compiled_calls == calls + 1
    assert len(drafts) == 256 and any(drafts)
    for row, draft in enumerate(drafts):  # each draft is the request's own continuation here
        assert draft == tokens[row, 90 : 90 + len(draft)].tolist()
    assert all(t.steps == 1 for t in proposer.tracked.values())


def test_a_batched_drafter_that_raises_costs_the_step_its_drafts_and_nothing_else():
    class Failing:
        strategies = ("x",)

        def start(self, key, prompt_length, limit):
            pass

        def step(self, *args):
            raise RuntimeError("broken")

        def finish(self, key, generated=()):
            pass

    proposer = fake_proposer(Failing(), 4, 3, adaptive=False)
    drafts = proposer.propose([[5], [6], []], np.full(3, 50), np.zeros((3, 60), np.int32))
    assert drafts == [[], [], []]
    assert sorted(t.failed_steps for t in proposer.tracked.values()) == [1, 1]


class Recording:
    """A BatchDrafter that records its lifecycle calls and drafts nothing; its start fails for `failing`."""

    strategies = ("x",)

    def __init__(self, failing: str = ""):
        self.calls, self.failing = [], failing

    def start(self, key, prompt_length, limit):
        if key == self.failing:
            raise RuntimeError("no room")
        self.calls.append(("start", key, prompt_length, limit))

    def step(self, keys, tokens, rows, lengths, step_cost=None):
        from drafters.base import BatchDrafts

        self.calls.append(("step", tuple(keys)))
        return BatchDrafts.zeros(len(keys), 4)

    def finish(self, key, generated=()):
        self.calls.append(("finish", key, tuple(generated)))


def test_per_request_starts_once_and_finishes_once_with_its_tokens_or_when_vllm_lets_it_go():
    """Started when first seen; finished by `take` with its generated tokens when it ends, or
    without them once vLLM no longer holds it (aborted). A request that is not scheduled for a
    step (or preempted) stays started: vLLM keeps it."""
    drafter = Recording()
    proposer = fake_proposer(drafter, 4, 2, adaptive=False)
    batch, tokens = proposer.runner.input_batch, np.zeros((2, 60), np.int32)
    proposer.propose([[5], [6]], np.full(2, 50), tokens)
    proposer.propose([[5], [6]], np.full(2, 51), tokens)
    assert drafter.calls[:2] == [("start", "r0-abcdefgh", 40, 140), ("start", "r1-abcdefgh", 40, 140)]
    assert [c[0] for c in drafter.calls] == ["start", "start", "step", "step"]
    proposer.take({"r0": [1, 2, 3]})  # r0 ended: finished with its tokens
    del proposer.runner.requests["r0-abcdefgh"]
    assert drafter.calls[-1] == ("finish", "r0-abcdefgh", (1, 2, 3))
    batch.req_ids, batch.req_id_to_index = [], {}  # r1 not scheduled this step: it stays
    proposer.propose([], np.zeros(0), tokens)
    batch.req_ids, batch.req_id_to_index = ["r1-abcdefgh"], {"r1-abcdefgh": 0}
    proposer.propose([[7]], np.full(1, 53), tokens)
    assert drafter.calls[-1] == ("step", ("r1-abcdefgh",)) and [c[0] for c in drafter.calls].count("start") == 2
    del proposer.runner.requests["r1-abcdefgh"]  # aborted: vLLM let it go
    batch.req_ids, batch.req_id_to_index = [], {}
    proposer.propose([], np.zeros(0), tokens)
    assert drafter.calls[-1] == ("finish", "r1-abcdefgh", ()) and proposer.started == set()


def test_a_drafter_whose_start_fails_costs_that_request_its_drafts_and_nothing_else():
    drafter = Recording(failing="r1-abcdefgh")
    proposer = fake_proposer(drafter, 4, 3, adaptive=False)
    drafts = proposer.propose([[5], [6], [7]], np.full(3, 50), np.zeros((3, 60), np.int32))
    assert drafts == [[], [], []] and drafter.calls[-1] == ("step", ("r0-abcdefgh", "r2-abcdefgh"))
    assert [proposer.tracked[f"r{i}-abcdefgh"].failed_steps for i in range(3)] == [0, 1, 0]
