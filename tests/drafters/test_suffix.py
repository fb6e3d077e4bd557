"""The suffix drafter: drafts from the request's context, this process's finished outputs and a
store of earlier runs' outputs, ranked by frequency; bounded memory; decoding stays greedy."""
import numpy as np
import pytest
import torch

from drafters.base import PADDING, DraftContext
from drafters.bigram import BigramDrafter
from drafters.datastore import build_datastore
from drafters.suffix import OutputStore, SuffixDrafter
from pipeline.batched_decoder import BatchedDecoder
from pipeline.decoder import SpeculativeDecoder
from pipeline.engines.base import Request


def test_each_source_is_named_on_the_rows_it_drafts(tmp_path):
    drafter = SuffixDrafter(3, 2, 0)
    context = DraftContext([5, 6, 7, 1, 5, 6], 3)
    drafts = drafter.propose(context, 1, 3)
    assert drafts.strategies == ("suffix_context",) and drafts.tokens[0, :2].tolist() == [7, 1]
    drafter.learn([40, 41, 42, 43, 44])
    drafts = drafter.propose(DraftContext([9, 40, 41], 3), 1, 3)
    assert drafts.strategies == ("suffix_outputs",) and drafts.tokens.tolist() == [[42, 43, 44]]
    store = build_datastore([[70, 71, 72, 73, 74]] * 3, tmp_path / "store", {})
    drafter = SuffixDrafter(3, 2, 0, store=store)
    drafts = drafter.propose(DraftContext([9, 71, 72], 3), 1, 2)
    assert drafts.strategies == ("suffix_store",) and drafts.tokens.tolist() == [[73, 74]]


def test_the_most_frequent_continuation_wins_and_drafts_stop_where_sources_disagree():
    drafter = SuffixDrafter(2, 2, 0, min_probability=0.4)
    for _ in range(3):
        drafter.learn([1, 2, 3, 4, 5])
    drafter.learn([1, 2, 9, 9, 9])
    drafts = drafter.propose(DraftContext([7, 1, 2], 2), 2, 3)
    assert drafts.tokens[0].tolist() == [3, 4, 5] and drafts.lengths[0] == 3  # 3 of 4 agree
    assert drafts.strategies[1] == PADDING and drafts.lengths[1] == 0  # 1 of 4 (1/5) is below 40 %: no second row
    # Each prefix's share of the continuations with one unseen counted (3 of 4 + 1), past the 2-token
    # match scaled by 2 / depth.
    assert drafts.confidence[0] == pytest.approx((0.6, 0.6, 0.4)) and drafts.confidence[1] == ()
    lenient = SuffixDrafter(2, 2, 0, min_probability=0.2)
    for document in ([1, 2, 3, 4, 5],) * 3 + ([1, 2, 9, 9, 9],):
        lenient.learn(document)
    assert lenient.propose(DraftContext([7, 1, 2], 2), 2, 3).tokens[1].tolist() == [9, 9, 9]
    split = SuffixDrafter(2, 2, 0, min_probability=0.4)
    for tail in ([3, 4], [3, 5], [3, 6]):
        split.learn([1, 2, *tail])
    # Everyone agrees on 3 (3 of 3 + 1 unseen), then no continuation has 40 %: the row stops after one token.
    assert split.propose(DraftContext([1, 2], 2), 1, 3).lengths == (1,)
    assert split.propose(DraftContext([1, 2], 2), 1, 3).confidence == ((0.75,),)


def test_the_occurrences_that_repeat_the_most_context_decide_not_the_most_frequent():
    # (1, 2) was followed by 4 twice and by 3 once, but only the 3 came after the same 5 as now.
    context = DraftContext([5, 1, 2, 3, 6, 1, 2, 4, 6, 1, 2, 4, 5, 1, 2], 2)
    drafts = SuffixDrafter(2, 2, 0).propose(context, 1, 2)
    assert drafts.tokens[0].tolist() == [3, 6] and drafts.confidence == ((0.5, 0.5),)  # one occurrence: 1 / (1 + 1)
    assert SuffixDrafter(2, 2, 0, max_match=2).propose(context, 1, 1).tokens[0].tolist() == [4]  # frequency alone
    # A source that matches longer wins over one with many shorter matches.
    drafter = SuffixDrafter(2, 2, 0)
    for _ in range(5):
        drafter.learn([9, 9, 1, 2, 7])
    drafts = drafter.propose(DraftContext([5, 1, 2, 3, 8, 5, 1, 2], 2), 1, 1)
    assert drafts.strategies == ("suffix_context",) and drafts.tokens.tolist() == [[3]]
    assert drafter.propose(DraftContext([8, 1, 2], 2), 1, 1).strategies == ("suffix_outputs",)


def test_no_match_falls_back_to_the_bigram_row_or_proposes_nothing():
    table = np.arange(10 * 1 * 3, dtype=np.int32).reshape(10, 1, 3) % 10
    assert SuffixDrafter(2, 2, 0, fill=BigramDrafter(table, "bigram")).propose(DraftContext([4, 8], 2), 1, 3).strategies == ("bigram",)
    assert SuffixDrafter(2, 2, 0).propose(DraftContext([4, 8], 2), 1, 3).strategies == (PADDING,)


def test_the_output_store_keeps_its_memory_bound_and_the_newest_outputs():
    store = OutputStore(3, 2, max_tokens=100)
    for document in range(50):
        store.add([1000 + document] * 3 + [document, document + 1])
    assert len(store.tokens) <= 100 + 6  # the cap, plus the document that crossed it
    assert store.matches([1049, 1049], 2, 2, 24, 8)[1] and not store.matches([1000, 1000], 2, 2, 24, 8)[1]
    assert sum(len(positions) for positions in store.index.values()) <= 2 * len(store.tokens)


@pytest.mark.parametrize("batched", [False, True])
def test_decoding_with_the_suffix_drafter_is_plain_greedy_and_learns_from_finished_outputs(tiny_model, batched):
    prompts = [[1, 5, 9, 2, 5, 9], [1, 40, 41, 42], [1, 5, 9, 2, 5, 9], [1, 40, 41, 42]]
    plain = SpeculativeDecoder(tiny_model, None, None, 1, 0)
    reference = [plain.generate(prompt, 24).token_ids for prompt in prompts]
    decoder = SpeculativeDecoder(tiny_model, None, SuffixDrafter(3, 2, 0), 1, 6)
    if batched:
        requests = [Request(f"r{i}", prompt, 24) for i, prompt in enumerate(prompts)]
        results = {request.request_id: result for request, result in BatchedDecoder(decoder, 2).generate_many(requests)}
        results = [results[f"r{i}"] for i in range(len(prompts))]
    else:
        results = [decoder.generate(prompt, 24) for prompt in prompts]
    assert [result.token_ids for result in results] == reference
    # The repeated prompts' answers were drafted from the first answers, now finished outputs.
    later = [result.stats.strategy_accepted_tokens.get("suffix_outputs", 0) for result in results[2:]]
    assert sum(later) > 0, [result.stats.strategy_accepted_tokens for result in results]


def test_a_step_reads_a_bounded_number_of_continuations_however_much_is_stored(tmp_path):
    """What keeps drafting well under a millisecond per request per step (printed with -s; README
    has this machine's figures): at most max_occurrences continuations per source, whatever the
    outputs and the store hold."""
    import time

    rng = np.random.default_rng(0)
    documents = [rng.integers(0, 30, 200).tolist() for _ in range(500)]  # a 30-token vocabulary: every 2-gram is common
    store = build_datastore(documents, tmp_path / "store", {})
    drafter = SuffixDrafter(3, 2, 0, store=store, max_occurrences=32)
    for document in documents:
        drafter.learn(document)
    context = DraftContext(rng.integers(0, 30, 400).tolist(), 3)
    started, from_store = time.perf_counter(), 0
    for _ in range(200):
        _, found = drafter.matches(context, 8)
        assert found and all(len(rows) <= 32 for rows in found.values()), {k: len(v) for k, v in found.items()}
        from_store += "store" in found
        drafter.propose(context, 1, 8)
        context.append([int(rng.integers(0, 30))])
    per_step = (time.perf_counter() - started) / 200
    assert from_store > 150, from_store  # the store took part (it holds the outputs too: it matches as long)
    print(f"suffix drafting: {per_step * 1e3:.3f} ms per request per step over {len(drafter.outputs.tokens)} stored "
          f"outputs' tokens and a store of {len(store)}")
