"""vLLM 0.34's speculator classes on this CPU (the `make test-vllm034` tier, in its own venv): Triton's
interpreter and CPU tensors, set before vLLM is imported (shared/notes: the recipe)."""

import pytest

from jobs.benchmark.speculators import prepare_cpu, tiny_model_dir, vllm_config

prepare_cpu()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model_dir(128, 256, tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def config(model_dir):
    """Ours at k = 4 for 4 slots of 256 tokens, a small corpus."""
    return vllm_config("ngrammys", 4, 4, 256, 128, {"max_depth": 8, "corpus_tokens": 4096}, model_dir)
