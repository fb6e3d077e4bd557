"""The suffix drafter: drafts from the request's context, this process's finished outputs and a
store of earlier runs' outputs, ranked by the acceptance model; bounded memory; decoding stays greedy."""
from collections import Counter

import numpy as np
import pytest

from drafters.acceptance import AcceptanceModel
from drafters.base import PADDING, DraftContext
from drafters.bigram import BigramDrafter
from drafters.datastore import build_datastore
from drafters.suffix import (
    FEATURES,
    PRIOR,
    SOURCES,
    OutputStore,
    SuffixDrafter,
    majority_path,
)
from pipeline.engines.base import Request
from pipeline.engines.transformers.batched_decoder import BatchedDecoder
from pipeline.engines.transformers.decoder import SpeculativeDecoder


def sure() -> AcceptanceModel:
    """A model that accepts every drafted token (sigmoid(10)): rows run as long as the evidence."""
    return AcceptanceModel(np.array([10.0] + [0.0] * (len(FEATURES) - 1)), refit_every=10**9)


def test_each_source_is_named_on_the_rows_it_drafts(tmp_path):
    drafter = SuffixDrafter(3, 2, 0, model=sure())
    context = DraftContext([5, 6, 7, 1, 5, 6], 3)
    drafts = drafter.propose(context, 1, 3)
    assert drafts.strategies == ("suffix_context",) and drafts.tokens[0].tolist() == [7, 1, 5]
    drafter.learn([40, 41, 42, 43, 44])
    drafts = drafter.propose(DraftContext([9, 40, 41], 3), 1, 3)
    assert drafts.strategies == ("suffix_outputs",) and drafts.tokens.tolist() == [[42, 43, 44]]
    store = build_datastore([[70, 71, 72, 73, 74]] * 3, tmp_path / "store", {})
    drafter = SuffixDrafter(3, 2, 0, store=store, model=sure())
    drafts = drafter.propose(DraftContext([9, 71, 72], 3), 1, 2)
    assert drafts.strategies == ("suffix_store",) and drafts.tokens.tolist() == [[73, 74]]


def test_the_majority_path_follows_the_most_frequent_continuation_with_its_shares():
    rows = Counter([(3, 4, 5)] * 3 + [(9, 9, 9), (3, 7)])
    path, shares, counts = majority_path(rows, 3)
    # 3 of 5 continuations start with 3 (one unseen counted: 4 / 6); of those 4, three go on with 4; then all.
    assert path == [3, 4, 5] and shares == pytest.approx([4 / 6, 3 / 4, 1.0]) and counts == [4, 3, 3]
    assert majority_path(Counter([(8, 1), (6, 1)]), 2)[0] == [6, 1]  # a tie: the smaller token id
    assert majority_path(Counter(), 3) == ([], [], [])


def test_rows_are_cut_where_the_model_gives_them_too_little_chance():
    drafter = SuffixDrafter(2, 1, 0, min_probability=0.3)
    context = DraftContext([1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3], 2)  # one earlier occurrence of (1, 2, 3)
    drafts = drafter.propose(context, 1, 6)
    confidence = drafts.confidence[0]
    assert 1 <= len(confidence) == drafts.lengths[0] < 6  # one occurrence does not vouch for 6 tokens
    assert drafts.tokens[0, :drafts.lengths[0]].tolist() == [4, 5, 6, 7, 8, 9][:drafts.lengths[0]]
    assert all(a >= b for a, b in zip(confidence, confidence[1:])) and confidence[-1] >= 0.3
    full = drafter.model.cumulative(drafter.candidates(context, 6)[0].features)  # [6]
    assert full[len(confidence)] < 0.3 and full[:len(confidence)].tolist() == pytest.approx(confidence)
    strict = SuffixDrafter(2, 1, 0, min_probability=0.99)
    assert strict.propose(context, 1, 3).strategies == (PADDING,)  # nothing sure enough


def test_the_occurrences_that_repeat_the_most_context_decide_not_the_most_frequent():
    # (1, 2) was followed by 4 twice and by 3 once, but only the 3 came after the same 5 as now.
    context = DraftContext([5, 1, 2, 3, 6, 1, 2, 4, 6, 1, 2, 4, 5, 1, 2], 2)
    drafts = SuffixDrafter(2, 2, 0, model=sure()).propose(context, 1, 2)
    assert drafts.tokens[0].tolist() == [3, 6]
    assert SuffixDrafter(2, 2, 0, max_match=2, model=sure()).propose(context, 1, 1).tokens[0].tolist() == [4]


def test_sources_draft_apart_and_the_one_the_model_trusts_goes_first():
    # The context repeats (1, 2) -> 3 once, after a long match; the outputs saw (1, 2) -> 7 five times.
    drafter = SuffixDrafter(2, 2, 0)
    for _ in range(5):
        drafter.learn([9, 9, 1, 2, 7, 8])
    context = DraftContext([5, 8, 4, 1, 2, 3, 6, 5, 8, 4, 1, 2], 2)
    found = {c.source: c for c in drafter.candidates(context, 2)}
    assert found["context"].tokens == (3, 6) and found["outputs"].tokens == (7, 8)
    assert found["context"].features[0, FEATURES.index("log_match")] == pytest.approx(np.log(5))
    drafts = drafter.propose(context, 2, 2)
    assert drafts.strategies == ("suffix_context", "suffix_outputs")  # the prior trusts a long own repeat more
    # A model that has learned to trust the outputs more ranks them first: the features decide.
    weights = drafter.model.weights.copy()
    weights[FEATURES.index("from_outputs")] = 5.0
    drafter.model.weights = weights
    assert drafter.propose(context, 2, 2).strategies == ("suffix_outputs", "suffix_context")


def test_sources_that_draft_the_same_prefix_mark_it_agreed():
    drafter = SuffixDrafter(2, 2, 0)
    drafter.learn([1, 2, 3, 4])
    found = {c.source: c for c in drafter.candidates(DraftContext([1, 2, 3, 9, 1, 2], 2), 3)}
    assert found["context"].tokens == (3, 9, 1) and found["outputs"].tokens == (3, 4)
    agreed = FEATURES.index("agreed")
    assert found["context"].features[:, agreed].tolist() == [1.0, 0.0, 0.0]
    assert found["outputs"].features[:, agreed].tolist() == [1.0, 0.0]


def test_every_candidate_is_judged_against_the_tokens_the_request_emits():
    drafter = SuffixDrafter(2, 2, 0, model=AcceptanceModel(PRIOR, refit_every=10**9))
    drafter.learn([1, 2, 3, 4, 5])
    context = DraftContext([7, 1, 2], 2)
    drafter.propose(context, 1, 3)  # the outputs' candidate (3, 4, 5)
    context.append([3, 4])  # right so far: its third token is not known yet
    drafter.propose(context, 1, 3)  # the outputs' candidate (5,) after (3, 4)
    assert drafter.model.seen == 0
    context.append([6])  # the first candidate's third token was wrong, and so was the second's first
    drafter.propose(context, 1, 3)
    assert drafter.model.seen == 4 and drafter.model.outcomes[:4].tolist() == [1.0, 1.0, 0.0, 0.0]


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
    drafter = SuffixDrafter(3, 2, 0, store=store)  # the default: at most 256 occurrences per source
    for document in documents:
        drafter.learn(document)
    context = DraftContext(rng.integers(0, 30, 400).tolist(), 3)
    drafting, from_store = 0.0, 0
    for _ in range(200):
        for source in SOURCES:
            _, members = drafter.source_match(context, source, 8)
            assert sum(members.values()) <= drafter.max_occurrences, (source, members)
            from_store += source == "store" and bool(members)
        started = time.perf_counter()
        drafter.propose(context, 1, 8)
        drafting += time.perf_counter() - started
        context.append([int(rng.integers(0, 30))])
    per_step = drafting / 200
    assert from_store > 150, from_store  # the store took part (it holds the outputs too: it matches as long)
    print(f"suffix drafting: {per_step * 1e3:.3f} ms per request per step over {len(drafter.outputs.tokens)} stored "
          f"outputs' tokens and a store of {len(store)}")
