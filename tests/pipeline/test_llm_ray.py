"""ray.data.llm's own documentation example (a vLLM processor with engine_kwargs, preprocess,
postprocess and sampling_params) run twice on the same rows, SmolLM2 on vLLM: through ray.data.llm,
and through pipeline.llm with only the import changed. Greedy, so the texts must be equal."""
from __future__ import annotations

import pytest
import ray

from pipeline.config import ModelConfig
from pipeline.engines.base import FINISH_REASONS
from pipeline.rows import INFERENCE_ERROR, RAY_LLM_COLUMNS
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


def hub_cache(tmp_path, model_dir) -> tuple[str, dict]:
    """A Hugging Face cache holding the embedded model under a hub id, as huggingface_hub lays one
    out, and the environment that finds it offline."""
    import shutil

    snapshot = tmp_path / "hub" / "models--HuggingFaceTB--SmolLM2-135M-Instruct" / "snapshots" / ("b" * 40)
    shutil.copytree(model_dir, snapshot)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("b" * 40)
    return "HuggingFaceTB/SmolLM2-135M-Instruct", {"HF_HOME": str(tmp_path), "HF_HUB_OFFLINE": "1"}


USERS_ITEMS = [*ITEMS[:3], "BAD: no tokens asked for", "word " * 2100]  # the last two fail, each its own way


def users_program(llm, model_source: str, env: dict):
    """Held out from the project's own programs: the settings Ray's docs and its users pass most (a hub
    id, prefix caching, a seed, errors kept as rows, penalties, stop token ids, log probabilities),
    each row's sampling_params with the same keys; two bad rows."""
    config = llm.vLLMEngineProcessorConfig(
        model_source=model_source,
        engine_kwargs={"enable_prefix_caching": True, "max_model_len": 2048, "max_num_seqs": 8, "dtype": "float32",
                       "enforce_eager": True, "seed": 0},
        runtime_env={"env_vars": {"VLLM_CPU_KVCACHE_SPACE": "1", **env}},
        placement_group_config={"bundles": [{"CPU": 1}]}, log_engine_metrics=False,
        should_continue_on_error=True, concurrency=1, batch_size=4)
    processor = llm.build_processor(
        config,
        preprocess=lambda row: dict(
            messages=[{"role": "user", "content": row["item"]}],
            sampling_params=dict(temperature=0, max_tokens=0 if row["item"].startswith("BAD") else 24,
                                 repetition_penalty=1.2, stop_token_ids=[2], logprobs=2)),
        postprocess=lambda row: dict(item=row["item"], answer=row["generated_text"], logprobs=row["logprobs"],
                                     request_id=row["request_id"]))
    return processor(ray.data.from_items(USERS_ITEMS)).take_all()


@pytest.mark.slow  # two vLLM engines in Ray actors: make test-slow
def test_a_users_program_gives_the_same_rows_and_errors_on_ours(local_ray, tmp_path, monkeypatch):
    import ray.data.llm

    import pipeline.llm

    model_id, env = hub_cache(tmp_path, resolve_model_dir(ModelConfig())[0])
    for name, value in env.items():
        monkeypatch.setenv(name, value)  # the driver resolves the hub id too (ours at construction)
    theirs = {row["item"]: row for row in users_program(ray.data.llm, model_id, env)}
    ours = {row["item"]: row for row in users_program(pipeline.llm, model_id, env)}
    assert set(ours) == set(theirs) == set(USERS_ITEMS)
    for item in USERS_ITEMS:
        mine, their = ours[item], theirs[item]
        assert bool(mine[INFERENCE_ERROR]) == bool(their[INFERENCE_ERROR]) == (item in USERS_ITEMS[3:]), item[:20]
        if their[INFERENCE_ERROR]:  # past the postprocess, whole, as ray.data.llm's
            assert mine["generated_text"] == their["generated_text"] == ""
            assert mine.get("answer") is None and their.get("answer") is None
            assert mine["request_id"] == their["request_id"] == -1
            continue
        assert mine["answer"] == their["answer"] and mine[INFERENCE_ERROR] == their[INFERENCE_ERROR] == ""
        assert len(mine["logprobs"]) == len(their["logprobs"]) > 0
