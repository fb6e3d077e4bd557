"""Tensor parallelism on vLLM's CPU backend (the only one here): the tiny model split over two
ranks, each a worker process of the engine with its own core and its own copy of our drafter,
gives exactly the same engine's plain greedy tokens, with drafts verified and accepted. Two vLLM
starts (plain and ours, both with two ranks), so it is in the slow tier."""

import psutil
import pytest

from pipeline.config import load_config
from pipeline.engines.base import Request
from pipeline.engines.build import ModelRefused, build_engine, check_engine_can_run, checked_config
from jobs.benchmark.datasets import encode_prompt

pytestmark = pytest.mark.slow

PROMPTS = [
    "def fib(n):\n    if n < 2:\n        return n",
    "Count: one two three one two three one",
    "The cat sat on the mat. The cat",
    "x = [1, 2, 3]\ny = [1, 2, 3]\nz = [",
]


def config(tiny_model_dir, tmp_path, *overrides):
    return checked_config(
        load_config(
            "configs/default.yaml",
            [
                "engine.name=vllm",
                f"model.name={tiny_model_dir}",
                "vllm.execution=eager",
                "vllm.cpu_kv_cache_gib=1",
                "vllm.max_model_len=384",
                "vllm.max_num_seqs=4",
                "model.num_threads=2",
                "vllm.tensor_parallel_size=2",
                *overrides,
            ],
        )
    )


def generate(engine_config) -> list:
    """The engine's results; closing it ends the worker processes it started (one per rank)."""
    before = {child.pid for child in psutil.Process().children(recursive=True)}
    engine = build_engine(engine_config)
    workers = [
        child
        for child in psutil.Process().children(recursive=True)  # not Python's resource tracker
        if child.pid not in before and child.name().startswith("VLLM::Worker")
    ]
    try:
        assert engine.feeder.llm.llm_engine.vllm_config.parallel_config.tensor_parallel_size == 2
        requests = [
            Request(f"r{i}", encode_prompt(engine.tokenizer, prompt, f"r{i}"), 48) for i, prompt in enumerate(PROMPTS)
        ]
        return engine.generate(requests)
    finally:
        engine.close()
        assert len(workers) == 2  # one per rank
        _, alive = psutil.wait_procs(workers, timeout=30)
        assert not alive, f"worker processes left running after close: {alive}"


def test_two_ranks_with_our_drafter_give_the_same_engines_plain_greedy(tiny_model_dir, tmp_path):
    plain = generate(config(tiny_model_dir, tmp_path, "drafting.drafter=none", "drafting.w=0"))
    ours = generate(config(tiny_model_dir, tmp_path, "drafting.drafter=batch_suffix", "drafting.w=auto"))
    assert [r.token_ids for r in ours] == [r.token_ids for r in plain]
    assert all(len(r.token_ids) == 48 or r.finish_reason == "eos" for r in ours)
    assert sum(r.stats.num_target_calls for r in ours) < sum(r.stats.num_target_calls for r in plain)


def test_a_split_the_model_or_the_cores_cannot_take_fails_at_start(tiny_model_dir, tmp_path):
    """The tiny model has 2 attention heads (1 key/value head, copied to each rank)."""
    with pytest.raises(ModelRefused, match="cannot split its 2 attention heads"):
        check_engine_can_run(
            config(tiny_model_dir, tmp_path, "vllm.tensor_parallel_size=4", "model.num_threads=0"), tiny_model_dir
        )
    with pytest.raises(ModelRefused, match="2 ranks on a CPU need as many cores; this actor has 1"):
        check_engine_can_run(config(tiny_model_dir, tmp_path, "model.num_threads=1"), tiny_model_dir)
