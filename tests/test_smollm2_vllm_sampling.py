"""Sampling with speculation on the real SmolLM2 in vLLM (fp32): with our default drafter and with
vLLM's own n-gram method, every sampled token follows the model's distribution at temperature 0.7
with top-k 50 and 1.0 with top-p 0.9, and the text's log-likelihood is the target's; with ours (whose
drafts the test sees) the tokens after a rejected draft too (tests/pipeline/engines/vllm/sampling_checks.py
says how). Without pipeline/engines/vllm/cpu_sampling.py, on vLLM's CPU build, each
of these failed (docs/vllm-cpu-sampling.md).
make test-nightly: two vLLM starts of SmolLM2 and four runs of 48 sampled requests (about 4 minutes).
The same checks run in CI on a tiny model (tests/pipeline/engines/vllm/test_engine_sampling.py)."""

from __future__ import annotations

import dataclasses

import pytest

from pipeline.config import load_config
from pipeline.engines.base import Request
from pipeline.engines.build import build_engine, checked_config
from jobs.benchmark.datasets import encode_prompt, load_prompts
from drafters.primitives.sampling import SamplingParams
from tests.pipeline.engines.vllm.sampling_checks import assert_exact, generate_tracking

pytestmark = pytest.mark.nightly

SEEDS, NEW_TOKENS = 48, 48
CASES = {"t0.7-top_k50": SamplingParams(0.7, 50, 1.0), "t1.0-top_p0.9": SamplingParams(1.0, 0, 0.9)}


def smollm2_config(*overrides):
    return checked_config(
        load_config(
            "configs/default.yaml",
            [
                "engine.name=vllm",
                "vllm.execution=eager",
                "vllm.cpu_kv_cache_gib=1",
                "vllm.max_model_len=1024",
                "vllm.max_num_seqs=16",
                *overrides,
            ],
        )
    )


@pytest.fixture(scope="module")
def engines():
    ours = build_engine(smollm2_config())  # the default drafter
    ngram = build_engine(smollm2_config("drafting.drafter=vllm_ngram", "drafting.w=4", "drafting.ngram.min_q=1"))
    yield {"ours": ours, "vllm_ngram": ngram}
    ours.close()
    ngram.close()


@pytest.fixture(scope="module")
def prompts(engines) -> list[list[int]]:
    """HumanEval prompts: code answers repeat their prompt's names, so both methods draft."""
    tokenizer = engines["ours"].tokenizer
    return [encode_prompt(tokenizer, p.prompt, p.request_id) for p in load_prompts("humaneval", 6)]


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("method", ["ours", "vllm_ngram"])
def test_sampled_tokens_follow_the_target_distribution(engines, smollm2, prompts, method, case):
    requests = [
        Request(
            f"s{seed}", prompts[seed % len(prompts)], NEW_TOKENS, sampling=dataclasses.replace(CASES[case], seed=seed)
        )
        for seed in range(SEEDS)
    ]
    results, tracked = generate_tracking(engines[method], requests)
    assert_exact(
        smollm2.model,
        requests,
        results,
        tracked,
        min_checked=150,
        min_accepted=50,
        min_rejected=40 if method == "ours" else 0,
    )
