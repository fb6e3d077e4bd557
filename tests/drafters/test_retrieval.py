import numpy as np
import pytest
import torch

from drafters.base import PADDING, DraftContext
from drafters.datastore import SEPARATOR, build_datastore
from drafters.retrieval import RetrievalDrafter, prefix_counts, select_rows
from pipeline.engines.base import Request
from pipeline.engines.transformers.speculative_decoder import SpeculativeDecoder, Verifying
from pipeline.engines.transformers.request_state import RequestState
from drafters.primitives.sampling import SamplingParams

DOCUMENTS = [
    [1, 2, 3, 4, 5, 6],
    [9, 2, 3, 4, 5, 7],
    [8, 2, 3, 4, 5, 6],
    [3, 4, 8, 8],
    [7, 7, 2, 3],  # 2, 3 at a document's end: no continuation
]


@pytest.fixture
def datastore(tmp_path):
    return build_datastore(DOCUMENTS, tmp_path / "store", {"model": "toy"})


def test_prefix_counts_weight_every_prefix_by_its_continuations():
    continuations = np.array([[5, 6], [5, 7], [5, 6], [8, SEPARATOR]], dtype=np.uint32)
    assert prefix_counts(continuations) == {(5,): 3, (5, 6): 2, (5, 7): 1, (8,): 1}


def test_select_rows_keeps_the_most_frequent_nodes_as_a_tree():
    trie = {(5,): 3, (5, 6): 2, (5, 7): 1, (8,): 1, (5, 6, 1): 2}
    # Three nodes: (5,), (5, 6), (5, 6, 1): one leaf, one row.
    assert select_rows(trie, 3, 3) == [[5, 6, 1]]
    # Two nodes: (5,), (5, 6): its row continues with the most frequent child to w tokens.
    assert select_rows(trie, 2, 3) == [[5, 6, 1]]
    # Everything: leaves by count: (5, 6, 1), then (5, 7) and (8,) (count 1, shorter first).
    assert select_rows(trie, 10, 3) == [[5, 6, 1], [8], [5, 7]]


def test_the_longest_match_drafts_its_most_frequent_continuations(datastore):
    drafter = RetrievalDrafter(datastore, pad_token=0, max_match=4, min_match=2)
    # "2 3 4 5" occurs three times, followed by 6 twice and 7 once.
    drafts = drafter.propose(DraftContext([0, 2, 3, 4, 5], 3), k=3, w=1)
    assert drafts.tokens.tolist() == [[6], [7], [0]] and drafts.strategies == ("retrieval", "retrieval", PADDING)
    # "8 2 3 4": only in document 3, so only its continuation "5 6".
    assert drafter.propose(DraftContext([8, 2, 3, 4], 3), k=2, w=2).tokens.tolist()[0] == [5, 6]


def test_no_match_means_no_drafts_and_no_guess(datastore):
    drafter = RetrievalDrafter(datastore, pad_token=0, min_match=2)
    drafts = drafter.propose(DraftContext([40, 41, 42], 3), k=2, w=3)
    assert drafts.strategies == (PADDING, PADDING)
    # "7 2 3" matches at document 4's end, where nothing follows: no rows either.
    assert drafter.rows(DraftContext([7, 2, 3], 3), 2, 3) == []


def test_a_continuation_never_crosses_into_the_next_document(datastore):
    drafter = RetrievalDrafter(datastore, pad_token=0, max_match=3, min_match=3)
    # "3 4 8" occurs only in document 3 ("3 4 8 8"), then a separator: the row is [8] + padding.
    assert drafter.propose(DraftContext([3, 4, 8], 3), k=1, w=3).tokens.tolist() == [[8, 0, 0]]


@pytest.mark.parametrize("verify", ["batch", "tree"])
def test_rest_decoding_is_plain_decoding(tiny_model, tmp_path, verify):
    plain = SpeculativeDecoder(tiny_model, None, None, 1, 0)
    prompt = [1, 5, 9, 2, 5, 9]
    reference = plain.generate(prompt, 40).token_ids
    # A datastore of the model's own outputs (and noise) so retrieved drafts are often right.
    noise = np.random.default_rng(0).integers(2, 90, size=(20, 30)).tolist()
    store = build_datastore([reference[:25], prompt + reference[:10]] + noise, tmp_path / "s", {})
    decoder = SpeculativeDecoder(
        tiny_model, None, RetrievalDrafter(store, 0, max_nodes=16), 4, 4, Verifying(verify_mode=verify)
    )
    for sampling in (SamplingParams(), SamplingParams(0.8, seed=4)):
        result = decoder.generate(prompt, 40, sampling=sampling)
        assert result.token_ids == plain.generate(prompt, 40, sampling=sampling).token_ids
    assert decoder.generate(prompt, 40).stats.strategy_wins.get("retrieval", 0) > 0
    assert torch.is_tensor(decoder.draft(RequestState.start(Request("r", prompt, 40), decoder.rules)).tokens)


def test_a_datastore_of_another_tokenizer_is_refused(tmp_path):
    from drafters.retrieval import check_vocabulary

    store = build_datastore(DOCUMENTS, tmp_path / "s", {"vocab_size": 96, "model": "toy"})
    check_vocabulary(store, 96)
    with pytest.raises(ValueError, match="drafting.datastore: built with a tokenizer of 96 tokens .* has 49152"):
        check_vocabulary(store, 49152)


def test_make_drafter_refuses_a_datastore_of_another_tokenizer(tmp_path):
    from pipeline.loading.drafters import DrafterTables, make_drafter
    from pipeline.config import DraftingConfig

    build_datastore(DOCUMENTS, tmp_path / "s", {"vocab_size": 96})
    config = DraftingConfig(drafter="rest", w=2, datastore=str(tmp_path / "s"))
    assert make_drafter(config, DrafterTables(), 0, vocab_size=96) is not None
    with pytest.raises(ValueError, match="drafting.datastore: built with a tokenizer of 96 tokens"):
        make_drafter(config, DrafterTables(), 0, vocab_size=49152)
