"""ray.data.llm's own documentation example, with the settings Ray's users pass most, run twice on
the same rows, SmolLM2 on vLLM: through ray.data.llm, and through pipeline.llm with only the import
changed. Greedy, so the texts must be equal; two bad rows fail the same way on both."""

from __future__ import annotations

import pytest
import ray

from pipeline.config import ModelConfig
from pipeline.engines.base import FINISH_REASONS
from pipeline.loading.model import resolve_model_dir
from pipeline.llm.schema import INFERENCE_ERROR, RAY_LLM_COLUMNS

ITEMS = [
    "Start of the haiku is: Complete this for me...",
    "Write a haiku about the sea.",
    "A haiku on autumn leaves, please.",
    "Finish this: The old pond, a frog jumps",
]
BAD_ITEMS = ["BAD: no tokens asked for", "word " * 2100]  # each fails its own way


@pytest.fixture(scope="module")
def local_ray():
    # ray.data.llm's chat-template, tokenize and detokenize stages are actor pools of a whole CPU
    # each beside its engine's: on 2 CPUs they wait forever. Logical CPUs, for that alone.
    ray.init(num_cpus=6, include_dashboard=False)
    yield
    ray.shutdown()


def hub_cache(tmp_path, model_dir) -> tuple[str, dict]:
    """A Hugging Face cache holding the embedded model under a hub id, as huggingface_hub lays one
    out, and the environment that finds it offline."""
    import shutil

    snapshot = tmp_path / "hub" / "models--HuggingFaceTB--SmolLM2-135M-Instruct" / "snapshots" / ("b" * 40)
    shutil.copytree(model_dir, snapshot)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("b" * 40)
    return "HuggingFaceTB/SmolLM2-135M-Instruct", {"HF_HOME": str(tmp_path), "HF_HUB_OFFLINE": "1"}


def docs_example(llm, model_source: str, env: dict):
    """The example as ray.data.llm's documentation writes it (its engine_kwargs, preprocess and
    postprocess), with what its users add most: a hub id, prefix caching, a seed, errors kept as
    rows, a penalty, stop token ids and log probabilities (each row's sampling_params with the same
    keys: rows whose keys differ hang ray.data.llm's engine). What else differs is for this CPU
    (the engine_kwargs after the first three, the placement group, the runtime_env) and for
    equality (temperature 0, shorter answers)."""
    config = llm.vLLMEngineProcessorConfig(
        model_source=model_source,
        engine_kwargs={
            "enable_chunked_prefill": True,
            "max_num_batched_tokens": 4096,
            "max_model_len": 2048,
            "max_num_seqs": 8,
            "dtype": "float32",
            "enforce_eager": True,
            "gpu_memory_utilization": 0.3,
            "enable_prefix_caching": True,
            "seed": 0,
        },
        runtime_env={"env_vars": {"VLLM_CPU_KVCACHE_SPACE": "1", **env}},
        placement_group_config={"bundles": [{"CPU": 1}]},
        log_engine_metrics=False,
        should_continue_on_error=True,
        concurrency=1,
        batch_size=2,
    )
    processor = llm.build_processor(
        config,
        preprocess=lambda row: dict(
            messages=[
                {"role": "system", "content": "You are a bot that responds with haikus."},
                {"role": "user", "content": row["item"]},
            ],
            sampling_params=dict(
                temperature=0,
                max_tokens=0 if row["item"].startswith("BAD") else 40,
                repetition_penalty=1.2,
                stop_token_ids=[2],
                logprobs=2,
            ),
        ),
        postprocess=lambda row: dict(answer=row["generated_text"], **row),
    )
    return processor(ray.data.from_items(ITEMS + BAD_ITEMS)).materialize()


def generated_schema(dataset):
    """The schema of a block of generated rows (ray.data.llm's error rows have time_taken_llm -1, an
    integer, and a Dataset's schema is its first block's)."""
    for block in dataset.iter_batches(batch_size=None, batch_format="pyarrow"):
        if not any(block.column(INFERENCE_ERROR).to_pylist()):
            return block.schema
    raise AssertionError("no block of generated rows")


@pytest.mark.slow  # two vLLM engines in Ray actors: make test-slow
def test_ray_data_llms_example_runs_on_ours_with_the_import_changed_and_the_same_rows(local_ray, tmp_path, monkeypatch):
    import ray.data.llm

    import pipeline.llm

    model_id, env = hub_cache(tmp_path, resolve_model_dir(ModelConfig())[0])
    for name, value in env.items():
        monkeypatch.setenv(name, value)  # the driver resolves the hub id too (ours at construction)
    theirs = docs_example(ray.data.llm, model_id, env)
    ours = docs_example(pipeline.llm, model_id, env)
    assert ours.context.execution_no_progress_timeout_s == -1  # a long block is no stall (the engine's hang check is)
    their_rows = {row["item"]: row for row in theirs.take_all()}
    our_rows = {row["item"]: row for row in ours.take_all()}
    assert set(our_rows) == set(their_rows) == set(ITEMS + BAD_ITEMS)
    for item in BAD_ITEMS:  # past the postprocess, whole, as ray.data.llm's
        mine, their = our_rows[item], their_rows[item]
        assert mine[INFERENCE_ERROR] and their[INFERENCE_ERROR], item[:20]
        assert mine["generated_text"] == their["generated_text"] == ""
        assert mine.get("answer") is None and their.get("answer") is None
        assert mine["request_id"] == their["request_id"] == -1
    for item in ITEMS:
        mine, their = our_rows[item], their_rows[item]
        assert mine["generated_text"] == their["generated_text"] and mine["answer"] == their["answer"], item
        assert list(mine["prompt_token_ids"]) == list(their["prompt_token_ids"])
        assert mine[INFERENCE_ERROR] == their[INFERENCE_ERROR] == "" and mine["finish_reason"] in FINISH_REASONS
        assert len(mine["logprobs"]) == len(their["logprobs"]) == len(mine["generated_tokens"])
        for token, at, theirs_at in zip(mine["generated_tokens"], mine["logprobs"], their["logprobs"]):
            assert at[token]["logprob"] == pytest.approx(theirs_at[token]["logprob"], abs=1e-3)
            assert at[token]["decoded_token"] == theirs_at[token]["decoded_token"]
        assert mine["params"].startswith("SamplingParams(") and "logprobs=2" in mine["params"]
    # Every column of theirs, the same type; but the input's `messages`, which ray.data.llm's rows
    # carry as pickled objects once a column beside them (the log probabilities) needed pickling.
    # (The rows generated: ray.data.llm's error rows have another type for time_taken_llm, -1.)
    their_schema, our_schema = generated_schema(theirs), generated_schema(ours)
    for name, kind in zip(their_schema.names, their_schema.types):
        assert name in our_schema.names, name
        assert our_schema.types[our_schema.names.index(name)] == kind or name == "messages", (name, kind)
    assert set(RAY_LLM_COLUMNS.names) - {"embeddings", "metrics", "prompt_logprobs"} <= set(their_schema.names)
