"""ray.data.llm's own documentation example (a vLLM processor with engine_kwargs, preprocess,
postprocess and sampling_params) run twice on the same rows, SmolLM2 on vLLM: through ray.data.llm,
and through pipeline.llm with only the import changed. Greedy, so the texts must be equal."""
from __future__ import annotations

import pytest
import ray

from pipeline.config import ModelConfig
from pipeline.engines.base import FINISH_REASONS
from pipeline.llm import INFERENCE_ERROR, RAY_LLM_COLUMNS
from pipeline.model_loading import resolve_model_dir

ITEMS = ["Start of the haiku is: Complete this for me...", "Write a haiku about the sea.",
         "A haiku on autumn leaves, please.", "Finish this: The old pond, a frog jumps"]


@pytest.fixture(scope="module")
def local_ray():
    # ray.data.llm's chat-template, tokenize and detokenize stages are actor pools of a whole CPU
    # each beside its engine's: on 2 CPUs they wait forever. Logical CPUs, for that alone.
    ray.init(num_cpus=6, include_dashboard=False)
    yield
    ray.shutdown()


def docs_example(llm, model_source: str):
    """The example as ray.data.llm's documentation writes it; what differs is for this CPU (the
    engine_kwargs after the first three, the placement group, the runtime_env) and for equality
    (temperature 0, shorter answers) and log probabilities asked for (each row the same keys: rows
    whose sampling_params differ in keys hang ray.data.llm's engine)."""
    config = llm.vLLMEngineProcessorConfig(
        model_source=model_source,
        engine_kwargs={"enable_chunked_prefill": True, "max_num_batched_tokens": 4096, "max_model_len": 2048,
                       "max_num_seqs": 8, "dtype": "float32", "enforce_eager": True, "gpu_memory_utilization": 0.3},
        runtime_env={"env_vars": {"VLLM_CPU_KVCACHE_SPACE": "1"}},
        placement_group_config={"bundles": [{"CPU": 1}]}, log_engine_metrics=False,
        concurrency=1, batch_size=2)
    processor = llm.build_processor(
        config,
        preprocess=lambda row: dict(
            messages=[{"role": "system", "content": "You are a bot that responds with haikus."},
                      {"role": "user", "content": row["item"]}],
            sampling_params=dict(temperature=0, max_tokens=40, logprobs=1)),
        postprocess=lambda row: dict(answer=row["generated_text"], **row))
    ds = ray.data.from_items(ITEMS)
    return processor(ds).materialize()


@pytest.mark.slow  # two vLLM engines in Ray actors: make test-slow
def test_ray_data_llms_example_runs_on_ours_with_the_import_changed_and_the_same_text(local_ray):
    import ray.data.llm

    import pipeline.llm

    model_dir = str(resolve_model_dir(ModelConfig())[0])
    theirs = docs_example(ray.data.llm, model_dir)
    ours = docs_example(pipeline.llm, model_dir)
    their_rows = {row["item"]: row for row in theirs.take_all()}
    our_rows = {row["item"]: row for row in ours.take_all()}
    assert set(our_rows) == set(their_rows) == set(ITEMS)
    for item in ITEMS:
        assert our_rows[item]["generated_text"] == their_rows[item]["generated_text"], item
        assert our_rows[item]["answer"] == our_rows[item]["generated_text"]
        assert list(our_rows[item]["prompt_token_ids"]) == list(their_rows[item]["prompt_token_ids"])
        assert our_rows[item][INFERENCE_ERROR] == "" and our_rows[item]["finish_reason"] in FINISH_REASONS
        ours_logprobs, their_logprobs = our_rows[item]["logprobs"], their_rows[item]["logprobs"]
        assert len(ours_logprobs) == len(their_logprobs) == len(our_rows[item]["generated_tokens"])
        for token, mine, theirs_at in zip(our_rows[item]["generated_tokens"], ours_logprobs, their_logprobs):
            assert mine[token]["logprob"] == pytest.approx(theirs_at[token]["logprob"], abs=1e-3)
            assert mine[token]["decoded_token"] == theirs_at[token]["decoded_token"]
        assert our_rows[item]["params"].startswith("SamplingParams(") and "logprobs=1" in our_rows[item]["params"]
    their_schema, our_schema = theirs.schema(), ours.schema()
    # Every column of theirs, the same type; but the input's `messages`, which ray.data.llm's rows
    # carry as pickled objects once a column beside them (the log probabilities) needed pickling.
    for name, kind in zip(their_schema.names, their_schema.types):
        assert name in our_schema.names, name
        assert our_schema.types[our_schema.names.index(name)] == kind or name == "messages", (name, kind)
    assert set(RAY_LLM_COLUMNS.names) - {"embeddings", "metrics", "prompt_logprobs"} <= set(their_schema.names)
