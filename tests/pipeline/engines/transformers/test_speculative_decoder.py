import pytest
import torch

from drafters import model_tables
from pipeline.loading.drafters import DrafterTables, make_drafter
from pipeline.config import DraftingConfig
from pipeline.config.drafting import BigramConfig, NgramConfig
from pipeline.engines.errors import RequestError
from pipeline.engines.transformers.speculative_decoder import SpeculativeDecoder, Verifying
from pipeline.engines.transformers.request_state import stop_cut
from drafters.primitives.sampling import SamplingParams
from tests.conftest import TINY_EOS

PROMPTS = [[1, 5, 9, 2, 5, 9, 2, 7], [1, 40, 41, 42, 43, 40, 41], [1, 3], [1]]


def decoder_for(model, tables, drafter, k, w, tokenizer=None, min_q=2):
    config = DraftingConfig(drafter=drafter, w=w, bigram=BigramConfig(top_k=8), ngram=NgramConfig(max_q=3, min_q=min_q))
    if tables.bigram is not None:
        extended = None
        if drafter == "extended_bigram":
            extended = model_tables.model_extension(model, tables.bigram, [], k, w, batch_size=512)
        tables = DrafterTables(
            unigram=tables.unigram,
            bigram=tables.bigram,
            chained=model_tables.chain_extension(tables.bigram, k, w),
            extended=extended,
        )
    return SpeculativeDecoder(model, tokenizer, make_drafter(config, tables, 0), k, w, Verifying(config.ngram.max_q))


def plain(model, prompt, n):
    return SpeculativeDecoder(model, None, None, 1, 0).generate(prompt, n).token_ids


def test_plain_decoding_equals_transformers_generate(tiny_model):
    for prompt in PROMPTS:
        ours = plain(tiny_model, prompt, 40)
        theirs = tiny_model.generate(
            torch.tensor([prompt]),
            do_sample=False,
            max_new_tokens=40,
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
        )
        assert ours == theirs[0, len(prompt) :].tolist(), f"prompt {prompt}"


@pytest.mark.parametrize(
    "drafter,k,w",
    [
        ("context_ngram", 1, 1),
        ("context_ngram", 3, 4),
        ("unigram", 2, 2),
        ("bigram", 1, 1),
        ("bigram", 4, 3),
        ("extended_bigram", 2, 5),
        ("mixed", 4, 4),
        ("mixed", 8, 2),
    ],
)
def test_speculative_output_is_token_identical_to_plain_greedy(tiny_model, tables, drafter, k, w):
    # min_q=1 drafts more often, so more steps accept drafts and exercise the cache bookkeeping.
    decoder = decoder_for(tiny_model, tables, drafter, k, w, min_q=1)
    for prompt in PROMPTS:
        result = decoder.generate(prompt, 60)
        assert result.token_ids == plain(tiny_model, prompt, 60), f"{drafter} k={k} w={w} prompt {prompt}"
        stats = result.stats
        assert stats.num_generated_tokens == len(result.token_ids)
        assert sum(stats.accepted_length_histogram) == stats.num_target_calls
        # Every step that accepted a draft token has a winning row; the others have none.
        assert sum(stats.accepted_rank_histogram) == stats.num_target_calls - stats.accepted_length_histogram[0]
        assert len(stats.accepted_length_histogram) == w + 1


def test_drafts_that_are_accepted_save_target_calls(tiny_model, tables):
    # Greedy decoding of the tiny model revisits tokens, which the context n-gram predicts.
    prompt = PROMPTS[0]
    result = decoder_for(tiny_model, tables, "context_ngram", 2, 4, min_q=1).generate(prompt, 80)
    assert result.stats.num_target_calls < len(result.token_ids)
    assert result.stats.tokens_per_call == len(result.token_ids) / result.stats.num_target_calls
    assert sum(result.stats.accepted_length_histogram[1:]) > 0
    assert result.stats.strategy_wins.get("context_ngram", 0) > 0


def test_max_new_tokens_is_exact_even_mid_draft(tiny_model, tables):
    decoder = decoder_for(tiny_model, tables, "mixed", 2, 5)
    for n in (1, 2, 7, 13):
        result = decoder.generate(PROMPTS[0], n)
        assert len(result.token_ids) == n and result.finish_reason == "length"


def test_generation_stops_at_eos(tiny_model, tables):
    reference = plain(tiny_model, PROMPTS[1], 200)
    # Make EOS the token greedy decoding emits at some position, then check we stop right there.
    stop_token = reference[10]
    tiny_model.generation_config.eos_token_id = stop_token
    try:
        result = decoder_for(tiny_model, tables, "mixed", 3, 4).generate(PROMPTS[1], 200)
    finally:
        tiny_model.generation_config.eos_token_id = TINY_EOS
    first = reference.index(stop_token)
    assert result.finish_reason == "eos" and result.token_ids == reference[: first + 1]


def test_stop_strings_cut_text_and_tokens(tiny_model, tables, char_tokenizer):
    reference = plain(tiny_model, PROMPTS[0], 40)
    stop = char_tokenizer.decode(reference[6:8])
    decoder = decoder_for(tiny_model, tables, "context_ngram", 2, 4, tokenizer=char_tokenizer)
    result = decoder.generate(PROMPTS[0], 40, stop=(stop,))
    full_text = char_tokenizer.decode(reference)
    assert result.finish_reason == "stop"
    assert result.text == full_text[: full_text.index(stop)]
    assert stop in char_tokenizer.decode(result.token_ids)
    assert stop not in char_tokenizer.decode(result.token_ids[:-1])


def test_prompt_without_room_names_the_request(tiny_model):
    decoder = SpeculativeDecoder(tiny_model, None, None, 1, 0)
    with pytest.raises(RequestError, match="request 'too-long'.*256"):
        decoder.generate([1] * 256, 10, request_id="too-long")
    with pytest.raises(RequestError, match="request 'empty'"):
        decoder.generate([], 10, request_id="empty")


def test_generation_stops_at_the_models_context_length(tiny_model):
    result = SpeculativeDecoder(tiny_model, None, None, 1, 0).generate([2] * 250, 100)
    assert len(result.token_ids) == 6 and result.finish_reason == "length"


def sampled(decoder, prompt, seed, n=40, temperature=0.9, top_p=0.95):
    return decoder.generate(prompt, n, sampling=SamplingParams(temperature, top_p=top_p, seed=seed)).token_ids


@pytest.mark.parametrize("drafter,k,w", [("context_ngram", 3, 4), ("mixed", 4, 3)])
def test_point_drafts_sample_exactly_what_plain_sampling_samples(tiny_model, tables, drafter, k, w):
    """Both use the t-th position uniform for the t-th token, so the same seed gives the same text."""
    plain_decoder = SpeculativeDecoder(tiny_model, None, None, 1, 0)
    decoder = decoder_for(tiny_model, tables, drafter, k, w, min_q=1)
    accepted = 0
    for seed in range(4):
        for prompt in PROMPTS[:2]:
            result = decoder.generate(prompt, 40, sampling=SamplingParams(0.9, top_p=0.95, seed=seed))
            assert result.token_ids == sampled(plain_decoder, prompt, seed), f"seed {seed} prompt {prompt}"
            accepted += sum(a * n for a, n in enumerate(result.stats.accepted_length_histogram))
    assert accepted > 0, "no draft was ever accepted: the comparison tested nothing"


def test_same_seed_same_sample_other_seed_other_sample(tiny_model, tables):
    decoder = decoder_for(tiny_model, tables, "context_ngram", 2, 3)
    assert sampled(decoder, PROMPTS[0], 7) == sampled(decoder, PROMPTS[0], 7)
    assert len({tuple(sampled(decoder, PROMPTS[0], seed)) for seed in range(5)}) > 1
    # Temperature 0 ignores the seed and stays plain greedy.
    greedy = SamplingParams(0.0, seed=3)
    assert decoder.generate(PROMPTS[0], 20, sampling=greedy).token_ids == plain(tiny_model, PROMPTS[0], 20)


@pytest.mark.parametrize("drafter,k,w", [("context_ngram", 3, 4), ("mixed", 4, 3), ("bigram", 4, 3)])
def test_tree_mode_emits_what_batch_mode_emits_with_fewer_tokens(tiny_model, tables, drafter, k, w):
    batch = decoder_for(tiny_model, tables, drafter, k, w, min_q=1)
    tree = decoder_for(tiny_model, tables, drafter, k, w, min_q=1)
    tree.verify_mode = "tree"
    fed = {"batch": 0, "tree": 0}
    for prompt in PROMPTS:
        for sampling in (SamplingParams(), SamplingParams(0.9, top_p=0.95, seed=1)):
            a, b = batch.generate(prompt, 40, sampling=sampling), tree.generate(prompt, 40, sampling=sampling)
            assert b.token_ids == a.token_ids, f"prompt {prompt} {sampling}"
            assert b.stats.accepted_length_histogram == a.stats.accepted_length_histogram
            assert b.stats.accepted_rank_histogram == a.stats.accepted_rank_histogram
            fed["batch"] += a.stats.num_verified_tokens
            fed["tree"] += b.stats.num_verified_tokens
    assert fed["tree"] < fed["batch"], fed


def test_stop_strings_are_found_from_the_tail_as_from_the_whole_text(tiny_model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    text = "def f(x):\n    return x * 2  # é, ü and 漢字\n" * 30 + "print(f(3))\n\nclass Done:\n    pass"
    tokens = tokenizer(text, add_special_tokens=False)["input_ids"]
    for stop in (("\nclass",), ("漢字\nprint",), ("never there", "(3))\n\n")):
        reference = next(
            (n for n in range(1, len(tokens) + 1) if any(s in tokenizer.decode(tokens[:n]) for s in stop)), None
        )
        found = None
        for checked in range(0, len(tokens), 3):  # steps of 3 new tokens, as a decoder emits them
            found = stop_cut(tokenizer, tokens[: checked + 3], checked, stop)
            if found is not None:
                break
        assert found == reference, stop
