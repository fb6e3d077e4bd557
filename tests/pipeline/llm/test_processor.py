"""pipeline.llm: ray.data.llm's processor API on our engine. The config and row checks run without
Ray; the stage runs in-process on the tiny model; the Ray runs (ours against ray.data.llm's own, on
SmolLM2 with vLLM) are in test_llm_ray.py."""

from __future__ import annotations

import dataclasses
import re

import pytest

from pipeline.config import ConfigError, load_config
from pipeline.engines.base import FINISH_REASONS, EngineSampling, Request
from pipeline.engines.errors import RequestError
from pipeline.engines.build import checked_config
from pipeline.llm import build_processor, vLLMEngineProcessorConfig
from pipeline.llm.row_values import rows_table
from pipeline.llm.sampling_params import sampling_of
from pipeline.llm.schema import GENERATED, INFERENCE_ERROR, RAY_LLM_COLUMNS
from pipeline.llm.prompts import TokenizeStage, prompt_of
from pipeline.llm.stage import GenerationStage, StageSettings


def test_the_config_maps_ray_data_llm_keywords_onto_ours():
    config = vLLMEngineProcessorConfig(
        model_source="smollm2-135m-instruct",
        batch_size=8,
        concurrency=(1, 3),
        engine_kwargs={
            "max_num_seqs": 12,
            "max_model_len": 512,
            "dtype": "float32",
            "enable_chunked_prefill": True,
            "max_restarts": 5,
            "hang_timeout_s": 60,
        },
        placement_group_config={"bundles": [{"CPU": 1}]},
        max_concurrent_batches=4,
        max_pending_requests=16,
        drafting={"drafter": "context_ngram", "w": 4},
    )
    ours = config.pipeline_config()
    assert (ours.vllm.max_num_seqs, ours.vllm.max_model_len, ours.model.dtype) == (12, 512, "float32")
    assert (ours.engine.max_restarts, ours.engine.hang_timeout_s, ours.vllm.engine_args) == (5, 60, {})
    assert (ours.ray.min_actors, ours.ray.max_actors, ours.ray.batch_size) == (1, 3, 8)
    assert (ours.ray.num_cpus_per_actor, ours.ray.num_gpus_per_actor) == (1, 0)
    assert ours.ray.max_concurrent_batches == 2  # 16 pending rows at most: two batches of 8
    assert (ours.drafting.drafter, ours.drafting.w) == ("context_ngram", 4)
    autoscaling = vLLMEngineProcessorConfig(model_source="smollm2-135m-instruct", concurrency=3).pipeline_config()
    assert (autoscaling.ray.min_actors, autoscaling.ray.max_actors) == (1, 3)  # as ray.data.llm reads an int
    default = vLLMEngineProcessorConfig(model_source="smollm2-135m-instruct").pipeline_config()
    job = checked_config(load_config("configs/default.yaml", ["engine.name=vllm"]))  # as the job starts it
    # the job's default drafter: batch_suffix, w auto
    assert (default.drafting.drafter, default.drafting.w, default.drafting.auto_w) == (
        job.drafting.drafter,
        job.drafting.w,
        job.drafting.auto_w,
    )
    assert (default.drafting.drafter, default.drafting.auto_w) == ("batch_suffix", True)
    assert (
        vLLMEngineProcessorConfig(model_source="smollm2-135m-instruct", drafting={"w": "auto", "drafter": "mixed"})
        .pipeline_config()
        .drafting.auto_w
    )
    assert (default.ray.num_gpus_per_actor, default.ray.batch_size) == (1, 32)  # ray.data.llm's: a GPU, 32 rows


def test_vllms_other_engine_arguments_pass_through_and_its_speculation_runs_as_vllm_has_it():
    config = vLLMEngineProcessorConfig(
        model_source="smollm2-135m-instruct",
        engine_kwargs={
            "enable_prefix_caching": False,
            "kv_cache_dtype": "auto",
            "max_num_seqs": 8,
            "speculative_config": {
                "method": "ngram",
                "num_speculative_tokens": 4,
                "prompt_lookup_min": 1,
                "prompt_lookup_max": 3,
            },
        },
    )
    ours = config.pipeline_config()
    assert ours.vllm.engine_args == {"enable_prefix_caching": False, "kv_cache_dtype": "auto"}
    assert ours.vllm.max_num_seqs == 8
    assert (ours.drafting.drafter, ours.drafting.w, ours.drafting.ngram.min_q, ours.drafting.ngram.max_q) == (
        "vllm_ngram",
        4,
        1,
        3,
    )


def test_engine_arguments_vllm_does_not_take_fail_in_the_driver_naming_them(tmp_path):
    from pipeline.engines.build import ModelRefused
    from pipeline.engines.vllm.settings import check_engine_args
    from pipeline.loading.model import resolve_model_dir

    def config(**engine_kwargs):
        return vLLMEngineProcessorConfig(
            model_source="smollm2-135m-instruct", engine_kwargs=engine_kwargs
        ).pipeline_config()

    model_dir, _ = resolve_model_dir(config().model)
    check_engine_args(config(enable_prefix_caching=False), model_dir)
    with pytest.raises(ModelRefused, match="vllm.engine_args.enable_prefix_cache: not one of vLLM's engine arguments"):
        check_engine_args(config(enable_prefix_cache=False), model_dir)
    with pytest.raises(ModelRefused, match="(?s)vllm.engine_args: vLLM refuses them.*cache_dtype"):
        check_engine_args(config(kv_cache_dtype="fp7"), model_dir)


def test_tensor_parallel_ranks_are_the_actors_resources():
    """ray.data.llm asks a placement group of a GPU per rank; our ranks are the actor's own worker
    processes, so the actor asks for all of them, on one node (Ray places an actor whole)."""
    gpus = vLLMEngineProcessorConfig(
        model_source="smollm2-135m-instruct", engine_kwargs={"tensor_parallel_size": 2}
    ).pipeline_config()
    assert (gpus.vllm.tensor_parallel_size, gpus.ray.num_gpus_per_actor) == (2, 2)
    cpus = vLLMEngineProcessorConfig(
        model_source="smollm2-135m-instruct",
        engine_kwargs={"tensor_parallel_size": 2},
        placement_group_config={"bundles": [{"CPU": 1}, {"CPU": 1}]},
    ).pipeline_config()
    assert (cpus.ray.num_cpus_per_actor, cpus.ray.num_gpus_per_actor, cpus.model.num_threads) == (2, 0, 2)


@pytest.mark.parametrize(
    "kwargs, named",
    [
        ({"engine_kwargs": {"pipeline_parallel_size": 2}}, "engine_kwargs.pipeline_parallel_size"),
        (
            {"engine_kwargs": {"tensor_parallel_size": 2}, "placement_group_config": {"bundles": [{"GPU": 1}]}},
            "placement_group_config.bundles",
        ),
        (
            {
                "engine_kwargs": {"tensor_parallel_size": 2},
                "engine": "transformers",
                "placement_group_config": {"bundles": [{"CPU": 1}]},
            },
            "vllm.tensor_parallel_size",
        ),
        (
            {"engine_kwargs": {"speculative_config": {"method": "eagle", "model": "x"}}},
            "engine_kwargs.speculative_config.method",
        ),
        (
            {"engine_kwargs": {"speculative_config": {"method": "suffix", "suffix_decoding_max_tree_depth": 8}}},
            "engine_kwargs.speculative_config.suffix_decoding_max_tree_depth",
        ),
        (
            {"engine_kwargs": {"speculative_config": {"method": "suffix"}}, "drafting": {"drafter": "suffix"}},
            "engine_kwargs.speculative_config",
        ),
        ({"engine_kwargs": {"model": "/elsewhere"}}, "engine_kwargs.model"),
        ({"engine_kwargs": {"enable_prefix_caching": True}, "engine": "transformers"}, "vllm.engine_args"),
        (
            {"chat_template_stage": {"enabled": True, "chat_template_kwarg": {}}},
            "chat_template_stage.chat_template_kwarg",
        ),
        ({"chat_template_stage": {"model_source": "/another/model"}}, "chat_template_stage.model_source"),
        ({"chat_template_stage": "yes"}, "chat_template_stage"),
        ({"concurrency": (3, 1)}, "concurrency"),
        ({"batch_size": 0}, "batch_size"),
        ({"task_type": "embed"}, "task_type"),
        ({"drafting": {"drafter": "nonsense"}}, "drafting.drafter"),
        ({"drafting": {"k_typo": 1}}, "k_typo"),
        ({"decoder": {"drafter": "mixed"}}, "decoder: must be left out: it is `drafting` now"),
        ({"drafting": {"k": 4}, "engine": "transformers"}, "unknown key(s) 'k'"),
        ({"transformers": {"verify": "tree"}}, "transformers.verify: must be 'batch' with engine.name vllm"),
        ({"statistics_columns": ["finish_reason", "tokens_per_cal"]}, "statistics_columns ('tokens_per_cal')"),
        ({"statistics_columns": "finish_reason"}, "statistics_columns"),
        ({"checkpoint_path": "/tmp/c"}, "checkpoint_path"),  # resuming needs the ids
        ({"checkpoint_path": "/tmp/c", "id_column": ""}, "id_column"),
    ],
)
def test_a_setting_the_engine_cannot_run_fails_at_the_config_naming_it(kwargs, named):
    with pytest.raises(ConfigError, match=re.escape(named)):
        vLLMEngineProcessorConfig(model_source="smollm2-135m-instruct", **kwargs)


def test_build_processor_takes_ray_data_llm_arguments_and_refuses_its_other_configs():
    config = vLLMEngineProcessorConfig(model_source="smollm2-135m-instruct")
    processor = build_processor(
        config,
        preprocess=lambda row: {"prompt": row["item"]},
        postprocess=lambda row: {"answer": row["generated_text"]},
        preprocess_map_kwargs={"num_cpus": 0.25},
    )
    assert processor.preprocess_map_kwargs == {"num_cpus": 0.25}
    with pytest.raises(TypeError, match="vLLMEngineProcessorConfig"):
        build_processor({"model_source": "x"})


# What the engines declare of sampling_params (vLLM's: pipeline/engines/vllm/engine.py).
TRANSFORMERS = EngineSampling("transformers")
STRUCTURED = EngineSampling("structured", frozenset({"structured_outputs"}))


def test_sampling_params_take_vllms_names_and_defaults():
    settings = sampling_of(
        {"temperature": 0, "max_tokens": 7, "stop": "\n\n", "top_k": -1, "seed": 3, "top_p": None},
        "row",
        None,
        TRANSFORMERS,
    )
    sampling = settings.sampling
    assert (sampling.temperature, sampling.top_k, sampling.top_p, sampling.seed) == (0.0, 0, 1.0, 3)
    assert (settings.max_tokens, settings.stop, settings.structured_outputs) == (7, ("\n\n",), None)
    settings = sampling_of(None, "row", None, TRANSFORMERS)
    assert (settings.sampling.temperature, settings.max_tokens) == (1.0, 16)  # vLLM's SamplingParams defaults
    # A schema as an Arrow struct column gives it back, with None for the keys other rows' schemas had.
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": None}}, "required": ["name"]}
    settings = sampling_of({"structured_outputs": {"json": schema, "regex": None}}, "row", None, STRUCTURED)
    assert settings.structured_outputs == {
        "json": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    }
    assert sampling_of(
        {"structured_outputs": {"json": '{"type": "integer"}'}}, "row", None, STRUCTURED
    ).structured_outputs == {"json": {"type": "integer"}}


@pytest.mark.parametrize(
    "params, named",
    [
        ({"max_tokens": -1}, "sampling_params.max_tokens"),
        ({"max_tokens": 2.5}, "sampling_params.max_tokens"),
        ({"temperature": "hot"}, "sampling_params.temperature"),
        ({"seed": 2**63}, "sampling_params.seed"),
        ({"top_p": 0}, "sampling_params.top_p"),
        ({"n": 0}, "sampling_params.n must be an integer from 1 to 128"),
        ({"n": 2.5}, "sampling_params.n"),
        ({"frequency_penalty_typo": 1}, "sampling_params.frequency_penalty_typo"),
        (
            {"structured_outputs": {"json": {"type": "objekt"}}},
            "sampling_params.structured_outputs.json is not a JSON schema",
        ),
        ({"structured_outputs": {"json": "{not json"}}, "sampling_params.structured_outputs.json is not JSON"),
        (
            {"structured_outputs": {"json": {"type": "object"}, "regex": "a+"}},
            "sampling_params.structured_outputs must set one",
        ),
        ({"structured_outputs": {"choice": []}}, "sampling_params.structured_outputs.choice"),
        ({"structured_outputs": "json"}, "sampling_params.structured_outputs must be a mapping"),
        ({"stop": [""]}, "sampling_params.stop"),
        ("greedy", "sampling_params must be a mapping"),
    ],
)
def test_bad_sampling_params_name_the_row_and_the_key(params, named):
    with pytest.raises(RequestError, match=f"row 7: {named}"):
        sampling_of(params, "row 7", None, STRUCTURED)


def test_vllms_other_sampling_params_pass_through_on_vllm_and_fail_by_name_elsewhere():
    from pipeline.engines.vllm.request_params import vllm_sampling

    vllm = vllm_sampling()
    given = {
        "repetition_penalty": 1.2,
        "stop_token_ids": [2],
        "min_tokens": 3,
        "ignore_eos": True,
        "skip_special_tokens": False,
        "detokenize": False,
    }
    assert sampling_of({**given, "temperature": 0}, "row 7", None, vllm).engine_sampling == given
    assert sampling_of({"temperature": 0}, "row 7", None, vllm).engine_sampling is None
    assert sampling_of({"logprobs": 2, "prompt_logprobs": 0}, "row 7", None, vllm).engine_sampling == {
        "logprobs": 2,
        "prompt_logprobs": 0,
    }
    assert sampling_of({"structured_outputs": {"regex": "a+"}}, "row 7", None, vllm).structured_outputs == {
        "regex": "a+"
    }
    for params, named in [
        ({"logit_bias": {2: 1.0}}, "sampling_params.logit_bias is not run here: vLLM does not run it"),
        ({"min_p": 0.1}, "sampling_params.min_p is not run here: vLLM does not run it with speculative"),
        (
            {"frequency_penalty_typo": 1},
            "sampling_params.frequency_penalty_typo is not a setting "
            "the vllm engine runs \\(it runs vLLM's SamplingParams\\)",
        ),
    ]:
        with pytest.raises(RequestError, match=f"row 7: {named}"):
            sampling_of(params, "row 7", None, vllm)
    for key in ("repetition_penalty", "structured_outputs"):
        with pytest.raises(
            RequestError,
            match=f"row 7: sampling_params.{key} is not a setting the transformers engine "
            "runs \\(it runs max_tokens, temperature",
        ):
            sampling_of({key: {"regex": "a"} if key == "structured_outputs" else 1.2}, "row 7", None, TRANSFORMERS)


def test_stop_strings_cut_the_text_with_or_without_themselves():
    from pipeline.engines.base import cut_at_stop

    assert cut_at_stop("a b STOP c END", ("END", "STOP")) == "a b "
    assert cut_at_stop("a b STOP c END", ("END", "STOP"), keep_stop=True) == "a b STOP"
    assert cut_at_stop("a b", ("END",), keep_stop=True) == "a b"


@pytest.fixture(scope="module")
def stage(tiny_model_dir):
    # A fixed w and speculation on: under `w: auto` whether a draft pays depends on the step costs
    # this machine measures, and under `speculation: auto` whether drafting does.
    config = vLLMEngineProcessorConfig(
        model_source=str(tiny_model_dir),
        engine="transformers",
        engine_kwargs={"speculation": "on"},
        drafting={"drafter": "batch_suffix", "w": 4},
        transformers={"max_batch_requests": 4},
    )
    return GenerationStage(config.pipeline_config(), StageSettings(continue_on_error=True))


def test_a_batch_is_tokenized_at_once_as_each_row_alone(stage):
    """The batch's text prompts are tokenized in one call: each row's prompt and ids are the ones
    prompt_of makes for it alone; a row given as ids, or whose prompt fails, is left to its own
    (None), and its error still names it."""
    rows = [
        {"messages": [{"role": "user", "content": "Count to three"}]},
        {"prompt": "été: 日本語\tand tabs"},
        {"tokenized_prompt": [5, 6, 7]},
        {"prompt": "   "},
        {"messages": "not a list"},
    ]
    encoded = stage.encode_batch(rows)
    assert encoded[:2] == [prompt_of(stage.tokenizer, row, stage.settings, "row") for row in rows[:2]]
    assert encoded[2:] == [None, None, None]
    out = stage.generate([{**row, "sampling_params": {"temperature": 0, "max_tokens": 2}} for row in rows])
    errors = [row["__inference_error__"] for row in out]
    assert [bool(e) for e in errors] == [False, False, False, True, True]
    assert "the prompt is empty" in errors[3] and "messages must be a non-empty list" in errors[4], errors


def test_rows_the_tokenize_stage_encoded_come_back_as_the_stage_alone_makes_them(stage):
    """The tokenize stage's batch (its two columns added) gives the generation stage's rows
    exactly, its columns taken off; a row it could not encode is made, and named, by the stage."""
    greedy = {"temperature": 0, "max_tokens": 3}
    rows = [
        {"item": "a", "messages": [{"role": "user", "content": "Count to three"}], "prompt": None},
        {"item": "b", "messages": None, "prompt": "def add(a, b):"},
        {"item": "c", "messages": None, "prompt": "   "},
        {"item": "d", "messages": None, "prompt": None},
    ]
    batch = rows_table([{**row, "sampling_params": greedy} for row in rows])
    tokenized = TokenizeStage(stage.tokenizer, stage.settings)(batch)
    assert tokenized.column("__prompt_ids__").null_count == 2 and tokenized.num_rows == 4
    via, alone = stage(tokenized), stage(batch)
    assert via.column_names == alone.column_names and "__prompt_ids__" not in via.column_names
    same = ("item", "prompt", "generated_tokens", "num_input_tokens")
    assert via.select(same).to_pylist() == alone.select(same).to_pylist()
    errors = [
        [error.partition("): ")[2] for error in table.column("__inference_error__").to_pylist()]
        for table in (via, alone)
    ]
    assert errors[0] == errors[1] and [bool(e) for e in errors[0]] == [False, False, True, True]  # (request ids differ)


def test_rows_come_back_with_their_columns_ray_data_llms_and_ours(stage):
    greedy = {"temperature": 0, "max_tokens": 12}
    rows = [
        {
            "item": "a",
            "messages": [{"role": "user", "content": "Count to three"}],
            "prompt": None,
            "sampling_params": greedy,
        },
        {"item": "b", "messages": None, "prompt": "def add(a, b):", "sampling_params": greedy},
        {"item": "c", "messages": None, "prompt": None, "sampling_params": {**greedy, "max_tokens": -1}},
        {"item": "d", "messages": None, "prompt": None, "sampling_params": greedy},
    ]
    table = stage(rows_table(rows))
    out = table.to_pylist()
    assert [row["item"] for row in out] == ["a", "b", "c", "d"]  # every row back, in order, its columns kept
    assert set(GENERATED.names) <= set(table.column_names)
    for field in RAY_LLM_COLUMNS:
        assert table.schema.field(field.name).type == field.type, field.name
    first, second, bad, empty = out
    assert first["prompt"].startswith("<|im_start|>") and first["prompt"].endswith("<|im_start|>assistant\n")
    assert first["prompt_token_ids"] == list(stage.engine.tokenizer(first["prompt"])["input_ids"])
    assert second["prompt"] == "def add(a, b):"  # a text prompt is tokenized as it is, no chat template
    for row in (first, second):
        assert row[INFERENCE_ERROR] == "" and 1 <= row["num_generated_tokens"] <= 12
        assert row["finish_reason"] in FINISH_REASONS and row["drafter"] == "batch_suffix"
        assert row["num_input_tokens"] == len(row["prompt_token_ids"]) and row["request_id"] >= 0
        assert 0 < row["time_taken_llm"] < 60  # the request's own time, not its batch's
    assert "sampling_params.max_tokens" in bad[INFERENCE_ERROR] and bad["request_id"] == -1
    assert "has no messages, prompt or tokenized_prompt" in empty[INFERENCE_ERROR]
    assert (bad["generated_text"], bad["generated_tokens"], bad["num_generated_tokens"]) == ("", [], 0)  # as Ray's
    assert bad["time_taken_llm"] == -1


def test_greedy_output_equals_plain_decoding_of_the_same_rows(stage, tiny_model_dir):
    rows = [
        {"prompt": f"Count from {i} to {i + 20}:", "sampling_params": {"temperature": 0, "max_tokens": 24}}
        for i in range(6)
    ]
    rows.append({"tokenized_prompt": [1, 2, 3, 4, 5, 1, 2, 3], "sampling_params": {"temperature": 0, "max_tokens": 24}})
    plain = GenerationStage(
        vLLMEngineProcessorConfig(
            model_source=str(tiny_model_dir),
            engine="transformers",
            drafting={"drafter": "none", "w": 0},
            transformers={"max_batch_requests": 4},
        ).pipeline_config()
    )
    ours, reference = stage(rows_table(rows)).to_pylist(), plain(rows_table(rows)).to_pylist()
    assert [row["generated_tokens"] for row in ours] == [row["generated_tokens"] for row in reference]
    assert sum(row["num_target_calls"] for row in ours) < sum(row["num_target_calls"] for row in reference)


def test_statistics_columns_choose_which_of_ours_a_row_gets(tiny_model_dir):
    config = vLLMEngineProcessorConfig(
        model_source=str(tiny_model_dir), engine="transformers", statistics_columns=["tokens_per_call", "finish_reason"]
    )
    assert config.statistics() == ("finish_reason", "tokens_per_call")  # the output's order
    chosen = GenerationStage(
        config.pipeline_config(), StageSettings(statistics=config.statistics(), continue_on_error=True)
    )
    rows = [
        {"item": "a", "prompt": "Hi", "sampling_params": {"temperature": 0, "max_tokens": 4}},
        {"item": "b", "prompt": "Hi", "sampling_params": {"max_tokens": 0}},
    ]  # an error row too
    table = chosen(rows_table(rows))
    assert table.column_names == [
        "item",
        "sampling_params",
        *RAY_LLM_COLUMNS.names,
        "sample_index",  # which of the row's n samples (always: it names the row, it is no statistic)
        "finish_reason",
        "tokens_per_call",
        INFERENCE_ERROR,
    ]
    assert table.column("finish_reason").to_pylist()[0] in FINISH_REASONS
    none = vLLMEngineProcessorConfig(model_source=str(tiny_model_dir), engine="transformers", statistics_columns=[])
    assert none.statistics() == ()


def test_the_postprocess_sees_errors_as_ray_data_llms_does():
    from pipeline.llm.processor import rows_postprocess

    def postprocess(row):
        return {"answer": row["generated_text"]}

    block = rows_table(
        [{"generated_text": "hi", INFERENCE_ERROR: ""}, {"generated_text": "", INFERENCE_ERROR: "row 1: why"}]
    )
    good, bad = rows_postprocess(postprocess, True)(block).to_pylist()
    assert good == {"answer": "hi", INFERENCE_ERROR: "", "generated_text": None}
    assert bad == {"answer": None, INFERENCE_ERROR: "row 1: why", "generated_text": ""}  # past the postprocess, whole
    assert rows_postprocess(postprocess, False)(block.slice(0, 1)).to_pylist() == [{"answer": "hi"}]


def test_the_chat_template_stage_takes_rays_forms_and_its_template_and_kwargs(tiny_model_dir):
    from ray.data.llm import ChatTemplateStageConfig

    def settings(**kwargs):
        config = vLLMEngineProcessorConfig(model_source=str(tiny_model_dir), engine="transformers", **kwargs)
        processor = build_processor(config, builder_kwargs=kwargs.pop("builder", None))
        return {key: value for key, value in vars(processor.settings).items() if key != "run_id"}  # each its own

    template = "{% for m in messages %}[{{ m.role }}] {{ m.content }}{% if shout %}!{% endif %}\n{% endfor %}"
    assert settings(chat_template_stage=False)["chat_template_enabled"] is False
    ray_form = settings(
        chat_template_stage=ChatTemplateStageConfig(
            enabled=True, chat_template=template, chat_template_kwargs={"shout": True}, batch_size=4
        )
    )
    dict_form = settings(chat_template_stage={"chat_template": template, "chat_template_kwargs": {"shout": True}})
    assert (
        ray_form
        == dict_form
        == {
            **dict_form,
            "chat_template_enabled": True,
            "chat_template": template,
            "chat_template_kwargs": {"shout": True},
        }
    )
    stage = GenerationStage(
        vLLMEngineProcessorConfig(model_source=str(tiny_model_dir), engine="transformers").pipeline_config(),
        StageSettings(chat_template=template, chat_template_kwargs={"shout": True}),
    )
    prompt, _ = prompt_of(
        stage.engine.tokenizer, {"messages": [{"role": "user", "content": "hi"}]}, stage.settings, "row 0"
    )
    assert prompt == "[user] hi!"  # (Jinja drops the last newline)


def test_build_processor_takes_chat_template_kwargs_as_ray_data_llms_builder_does(tiny_model_dir):
    config = vLLMEngineProcessorConfig(model_source=str(tiny_model_dir), engine="transformers")
    processor = build_processor(config, builder_kwargs={"chat_template_kwargs": {"enable_thinking": False}})
    assert processor.settings.chat_template_kwargs == {"enable_thinking": False}
    with pytest.raises(TypeError, match="builder_kwargs \\['telemetry_agent'\\]"):
        build_processor(config, builder_kwargs={"telemetry_agent": None})


def test_a_bad_row_raises_by_default_as_ray_data_llms_does(tiny_model_dir):
    config = vLLMEngineProcessorConfig(model_source=str(tiny_model_dir), engine="transformers")
    assert config.should_continue_on_error is False
    strict = GenerationStage(config.pipeline_config(), StageSettings(continue_on_error=config.should_continue_on_error))
    with pytest.raises(ValueError, match="sampling_params.top_p"):
        strict(rows_table([{"prompt": "Hi", "sampling_params": {"top_p": 2.0}}]))


def test_structured_outputs_on_the_transformers_engine_fail_their_row_alone(stage):
    rows = [
        {
            "prompt": "Hi",
            "sampling_params": {"temperature": 0, "max_tokens": 4, "structured_outputs": {"json": {"type": "integer"}}},
        },
        {"prompt": "Hi", "sampling_params": {"temperature": 0, "max_tokens": 4}},
    ]
    refused, ran = stage(rows_table(rows)).to_pylist()
    assert (
        "sampling_params.structured_outputs is not a setting the transformers engine runs" in refused[INFERENCE_ERROR]
    )
    assert ran[INFERENCE_ERROR] == "" and ran["num_generated_tokens"] >= 1


def test_the_processor_lists_its_stage_and_logs_its_input_columns_as_ray_data_llms(tiny_model_dir, caplog):
    import logging

    config = vLLMEngineProcessorConfig(model_source=str(tiny_model_dir), engine="transformers")
    processor = build_processor(config)
    assert processor.list_stage_names() == ["GenerationStage"]  # the engine's actor tokenizes
    assert processor.get_stage_by_name("GenerationStage") is processor.settings
    assert dataclasses.replace(processor, tokenize=True).list_stage_names() == ["TokenizeStage", "GenerationStage"]
    with pytest.raises(ValueError, match="Stage vLLMEngineStage not found"):
        processor.get_stage_by_name("vLLMEngineStage")
    with caplog.at_level(logging.INFO, logger="pipeline.llm.processor"):
        processor.log_input_column_names()
    assert "Required input columns:\n\tmessages | prompt | tokenized_prompt" in caplog.text
    assert "sampling_params" in caplog.text


def test_max_tokens_none_runs_to_the_models_length_as_in_vllm():
    from pipeline.engines.base import budget
    from pipeline.llm.sampling_params import UP_TO_THE_MODELS_LENGTH

    settings = sampling_of({"temperature": 0, "max_tokens": None}, "row 7", None, TRANSFORMERS)
    assert settings.max_tokens == UP_TO_THE_MODELS_LENGTH
    assert sampling_of({"temperature": 0}, "row 7", None, TRANSFORMERS).max_tokens == 16  # absent: vLLM's default
    request = Request("r", [1] * 100, settings.max_tokens)
    assert budget(request, 2048) == 1948  # every engine cuts it to what the model's length leaves


def test_rows_whose_sampling_params_carry_different_keys_run_together(stage):
    """Arrow gives the batch's struct column every key any row has (None where a row had none):
    each row runs with its own (ray.data.llm's engine thread dies on such a batch)."""
    rows = [
        {"prompt": "Hi", "sampling_params": {"temperature": 0, "max_tokens": 3}},
        {"prompt": "Hi", "sampling_params": {"temperature": 0.8, "max_tokens": 5, "seed": 1, "top_p": 0.9}},
        {"prompt": "Hi", "sampling_params": {"stop": ["\n"], "max_tokens": 4, "temperature": 0}},
    ]
    table = rows_table(rows)
    assert table.schema.field("sampling_params").type.num_fields == 5
    out = stage(table).to_pylist()
    assert [row[INFERENCE_ERROR] for row in out] == ["", "", ""]
    assert [row["temperature"] for row in out] == [0.0, 0.8, 0.0] and out[1]["seed"] == 1
    assert [row["num_generated_tokens"] <= limit for row, limit in zip(out, (3, 5, 4))] == [True] * 3


def test_log_engine_metrics_reports_each_batch_to_the_live_metrics(tiny_model_dir, monkeypatch):
    """The processor's actors count rows, errors, tokens, target calls and accepted drafts into
    the job's live counters (pipeline/llm/metrics.py), tagged with the processor's run id."""
    import ray

    import pipeline.llm.stage

    recorded, tags = [], []

    class Recording:
        def __init__(self, engine, run_id):
            tags.append((engine, run_id))

        def record(self, counts, steps=None, previous=None, drafter="", switches=0):
            recorded.append(counts)
            tags.append((drafter, switches))

    monkeypatch.setattr(pipeline.llm.stage, "RunMetrics", Recording)
    monkeypatch.setattr(ray, "is_initialized", lambda: True)  # as in a Ray Data actor

    class Context:
        def get_node_id(self):
            return "node"

        def get_actor_id(self):
            return "actor"

    monkeypatch.setattr(ray, "get_runtime_context", Context)
    config = vLLMEngineProcessorConfig(
        model_source=str(tiny_model_dir),
        engine="transformers",
        engine_kwargs={"speculation": "on"},  # (auto's rule at this concurrency on a CPU: plain)
        should_continue_on_error=True,
    )
    processor = build_processor(config)
    settings = processor.settings
    assert settings.live_metrics and settings.run_id.startswith("processor-")
    stage = GenerationStage(processor.config, settings)
    assert tags == [("transformers", settings.run_id)]
    rows = [
        {"prompt": "Count: 1 2 3 4 1 2 3 4", "sampling_params": {"temperature": 0, "max_tokens": 8}},
        {"prompt": "x", "sampling_params": {"max_tokens": 0}},
    ]
    out = stage(rows_table(rows)).to_pylist()
    (counts,) = recorded
    assert tags[1:] == [("batch_suffix", 0)]  # the drafter that generated the batch, no switch
    assert (counts["rows"], counts["errored_rows"]) == (2, 1)
    assert counts["generated_tokens"] == out[0]["num_generated_tokens"] > 0
    assert counts["target_calls"] == out[0]["num_target_calls"]
    assert counts["accepted_draft_tokens"] == counts["generated_tokens"] - counts["target_calls"]
    quiet = GenerationStage(processor.config, dataclasses.replace(settings, live_metrics=False))
    quiet(rows_table(rows[:1]))
    assert len(recorded) == 1 and len(tags) == 2  # no metrics made, none recorded


def test_a_rows_model_names_its_lora_adapter_as_ray_data_llm_reads_it(stage, tiny_model_dir, tmp_path):
    """model_source (or none) runs the model; another local directory holding an adapter is the
    row's LoRA adapter, which runs on the vLLM engine only (tests/pipeline/engines/vllm/test_engine.py);
    a directory that holds none, or a remote path, is refused by name, as the row's error."""
    lora = tmp_path / "my-lora"
    lora.mkdir()
    (lora / "adapter_config.json").write_text("{}")
    greedy = {"temperature": 0, "max_tokens": 4}
    rows = [
        {"model": str(tiny_model_dir), "prompt": "Hi", "sampling_params": greedy},
        {"model": None, "prompt": "Hi", "sampling_params": greedy},
        {"model": str(lora), "prompt": "Hi", "sampling_params": greedy},
        {"model": str(tmp_path / "missing"), "prompt": "Hi", "sampling_params": greedy},
        {"model": "s3://bucket/my-lora", "prompt": "Hi", "sampling_params": greedy},
    ]
    base, unnamed, adapter, missing, remote = stage(rows_table(rows)).to_pylist()
    assert base[INFERENCE_ERROR] == unnamed[INFERENCE_ERROR] == ""
    assert (
        base["model"] == unnamed["model"] == str(tiny_model_dir)
        and base["generated_tokens"] == unnamed["generated_tokens"]
    )
    assert f"LoRA adapters (model {str(lora)!r}) run on the vLLM engine" in adapter[INFERENCE_ERROR]
    assert adapter["model"] == str(lora)  # what the row asked for
    assert "is neither model_source nor a LoRA adapter's directory" in missing[INFERENCE_ERROR]
    assert "read from a local directory here" in remote[INFERENCE_ERROR]
    (request,), _, _ = stage.requests({"model": str(lora), "prompt": "Hi", "sampling_params": greedy})
    assert request.adapter == str(lora)
