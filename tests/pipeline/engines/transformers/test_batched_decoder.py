"""Throughput mode: many requests per forward call must give each request the tokens it gets alone."""

import dataclasses

import pytest
import torch

from pipeline.engines.transformers.batched_decoder import (
    BatchedDecoder,
    Failed,
    Request,
)
from pipeline.engines.transformers.speculative_decoder import SpeculativeDecoder
from pipeline.engines.transformers.ragged_cache import RaggedCache
from drafters.primitives.sampling import SamplingParams
from tests.drafters.test_adaptive import flat_costs
from tests.pipeline.engines.transformers.test_speculative_decoder import decoder_for

# Different lengths and budgets, so requests finish at different steps and rows are refilled.
REQUESTS = [
    ([1, 5, 9, 2, 5, 9, 2, 7], 40),
    ([1, 40, 41, 42, 43, 40, 41], 25),
    ([1, 3], 12),
    ([1], 30),
    ([1, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7], 18),
    ([1, 20, 21, 22, 20, 21, 22, 20], 33),
]


def requests(sampling=None) -> list[Request]:
    return [
        Request(f"r{i}", prompt, n, sampling=sampling or SamplingParams(0.0)) for i, (prompt, n) in enumerate(REQUESTS)
    ]


def alone(decoder: SpeculativeDecoder, request: Request) -> list[int]:
    sampling = request.sampling
    if not sampling.greedy:
        sampling = SamplingParams(sampling.temperature, sampling.top_k, sampling.top_p, seed_of(request))
    return decoder.generate(request.prompt_ids, request.max_new_tokens, sampling=sampling).token_ids


def seed_of(request: Request) -> int:
    return 100 + int(request.request_id[1:])


def run(batched: BatchedDecoder, batch: list[Request]) -> dict[str, list[int]]:
    results = {}
    for request, result in batched.generate_many(batch):
        assert not isinstance(result, Failed), result.message
        results[request.request_id] = result.token_ids
    return results


@pytest.mark.parametrize(
    "drafter,k,w,batch_size",
    [
        ("none", 1, 0, 3),
        ("context_ngram", 3, 4, 3),
        ("mixed", 4, 3, 4),
        ("context_ngram", 2, 2, 6),
        ("batch_suffix", 1, 4, 3),
    ],
)
def test_batched_greedy_is_each_request_alone(tiny_model, tables, drafter, k, w, batch_size):
    decoder = (
        SpeculativeDecoder(tiny_model, None, None, 1, 0)
        if drafter == "none"
        else decoder_for(tiny_model, tables, drafter, k, w, min_q=1)
    )
    reference = SpeculativeDecoder(tiny_model, None, None, 1, 0)
    results = run(BatchedDecoder(decoder, batch_size), requests())
    for request in requests():
        assert results[request.request_id] == alone(reference, request), request.request_id


def test_batched_sampling_is_each_request_alone(tiny_model, tables):
    decoder = decoder_for(tiny_model, tables, "context_ngram", 3, 3, min_q=1)
    batch = [
        Request(r.request_id, r.prompt_ids, r.max_new_tokens, sampling=SamplingParams(1.0, 0, 0.95, seed_of(r)))
        for r in requests()
    ]
    results = run(BatchedDecoder(decoder, 3), batch)
    for request in batch:
        assert results[request.request_id] == alone(decoder, request), request.request_id


def test_a_finished_request_row_goes_to_the_next_at_once(tiny_model, monkeypatch):
    batched = BatchedDecoder(SpeculativeDecoder(tiny_model, None, None, 1, 0), 2)
    calls = []
    forward = batched.forward
    monkeypatch.setattr(
        batched, "forward", lambda slots, trees, cache: calls.append(len(slots)) or forward(slots, trees, cache)
    )
    # One long request and three short ones: the short ones take turns in the second row.
    batch = [Request("long", [1, 40, 41], 30)] + [Request(f"short{i}", [1, 2 + i], 3) for i in range(3)]
    results = run(batched, batch)
    assert len(results["long"]) == 30 and all(len(results[f"short{i}"]) == 3 for i in range(3))
    assert len(calls) == 30 and calls[:9] == [2] * 9 and calls[-1] == 1


def test_a_bad_request_fails_alone(tiny_model):
    batched = BatchedDecoder(SpeculativeDecoder(tiny_model, None, None, 1, 0), 2)
    outcomes = {
        request.request_id: result
        for request, result in batched.generate_many(
            [Request("ok", [1, 5], 5), Request("empty", [], 5), Request("ok2", [1, 6], 5)]
        )
    }
    assert isinstance(outcomes["empty"], Failed) and "request 'empty'" in outcomes["empty"].message
    assert len(outcomes["ok"].token_ids) == 5 and len(outcomes["ok2"].token_ids) == 5


def test_the_token_budget_caps_each_call(tiny_model, tables):
    decoder = decoder_for(tiny_model, tables, "context_ngram", 4, 4, min_q=1)
    batched = BatchedDecoder(decoder, 3, max_batch_tokens=3 * 4)  # at most 4 tokens per request per call
    reference = SpeculativeDecoder(tiny_model, None, None, 1, 0)
    for request, result in batched.generate_many(requests()):
        stats = result.stats
        assert stats.num_verified_tokens <= 4 * stats.num_target_calls
        assert result.token_ids == alone(reference, request)


@pytest.mark.parametrize("per_token", [0.0, 1.0])
def test_adaptive_batched_decoding_is_plain_greedy(tiny_model, tables, per_token):
    decoder = decoder_for(tiny_model, tables, "context_ngram", 4, 6, min_q=1)
    decoder.rules = dataclasses.replace(decoder.rules, costs=flat_costs(per_token))
    decoder.auto_k, decoder.auto_w = True, True
    reference = SpeculativeDecoder(tiny_model, None, None, 1, 0)
    outcomes = list(BatchedDecoder(decoder, 3).generate_many(requests()))
    for request, result in outcomes:
        assert result.token_ids == alone(reference, request)
    fed = sum(result.stats.num_verified_tokens for _, result in outcomes)
    calls = sum(result.stats.num_target_calls for _, result in outcomes)
    if per_token == 1.0:  # every extra token costs a whole call: never worth drafting
        assert fed == calls
    else:  # drafts are free: it drafts
        assert fed > calls


def test_ragged_cache_drops_columns_no_row_uses(tiny_model):
    from drafters.primitives.forward import prefill

    cache = RaggedCache(tiny_model)
    cache.put(0, prefill(tiny_model, [1, 2, 3, 4, 5, 6]), 6)
    cache.put(1, prefill(tiny_model, [1, 2]), 2)
    assert cache.valid.tolist() == [[True] * 6, [False] * 4 + [True] * 2]
    keys = cache.cache.layers[0].keys[1, :, 4:].clone()
    cache.valid[0] = False  # row 0 finished
    cache.compact()
    assert cache.columns == 2 and torch.equal(cache.cache.layers[0].keys[1], keys)


def test_forward_call_shares_sum_to_the_calls_made(tiny_model, tables):
    decoder = decoder_for(tiny_model, tables, "context_ngram", 2, 3, min_q=1)
    batched = BatchedDecoder(decoder, 3)
    calls = []
    forward = batched.forward
    batched.forward = lambda slots, trees, cache: calls.append(len(slots)) or forward(slots, trees, cache)
    stats = [result.stats for _, result in batched.generate_many(requests())]
    # A call that served B requests counts 1/B for each: the rows sum to the calls made, while
    # num_target_calls counts every shared call once per request.
    assert sum(s.forward_call_share for s in stats) == pytest.approx(len(calls))
    assert sum(s.num_target_calls for s in stats) == sum(calls) > len(calls)
    assert all(s.forward_call_share < s.num_target_calls for s in stats)
