"""ray.data.llm's processor API on our engine and drafter. A program written for ray.data.llm runs
with one import changed:

    from pipeline.llm import build_processor, vLLMEngineProcessorConfig   # was: from ray.data.llm

`build_processor(config, preprocess, postprocess)` returns a `Processor`; `processor(ds)` is a lazy
Dataset: the preprocess, one stage of actors each holding our engine (speculative decoding with the
config's drafter), and the postprocess. A row carries `messages` (chat-templated), `prompt` (text,
tokenized as it is) or `tokenized_prompt`, and `sampling_params` (vLLM's names); it comes back with
its own columns, ray.data.llm's (`generated_text`, `generated_tokens`, ...) and ours (the request's
acceptance statistics, `finish_reason`, the drafter that ran).

Errors as ray.data.llm has them: a row that cannot be generated raises (`should_continue_on_error`
False, its default); with True it comes back with `__inference_error__` naming the row and the field,
its generated columns empty ("", [], 0), past the postprocess, and the other rows' postprocess
output gets `__inference_error__` "". `sampling_params` keys our engine cannot run (logprobs,
n > 1, ...) are such an error, never ignored.
"""
from __future__ import annotations

import itertools
import json
import logging
import math
import secrets
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import pyarrow as pa
# How Ray Data turns a column of Python values into Arrow (its own types where it can, else its
# object extension type), as ray.data.llm's rows get it.
from ray.data._internal.tensor_extensions.arrow import convert_to_pyarrow_array

from pipeline.actor_pool import generation_stage, prepared_tables
from pipeline.config import Config, ConfigError, DecoderConfig, build
from pipeline.engines.base import Request, RequestError, Result
from pipeline.output import SCHEMA
from pipeline.sampling import SamplingParams, request_seed
from pipeline.stage import GenerationStage

logger = logging.getLogger(__name__)

INFERENCE_ERROR = "__inference_error__"

# What ray.data.llm's vLLM stage adds to a row (ray/llm/_internal/batch/stages/vllm_engine_stage.py:
# vLLMOutputData, then request_id, batch_uuid, time_taken_llm, params).
RAY_LLM_COLUMNS = pa.schema([
    ("prompt", pa.string()),
    ("prompt_token_ids", pa.list_(pa.int64())),
    ("num_input_tokens", pa.int64()),
    ("generated_tokens", pa.list_(pa.int64())),
    ("generated_text", pa.string()),
    ("num_generated_tokens", pa.int64()),
    ("embeddings", pa.null()),
    ("metrics", pa.null()),  # the engine's per-request record (vLLM's RequestStateStats): its type is the data's
    ("logprobs", pa.null()),
    ("prompt_logprobs", pa.null()),
    ("request_id", pa.int64()),
    ("batch_uuid", pa.string()),
    ("time_taken_llm", pa.float64()),
    ("params", pa.string()),
])
# Ours: the output table's columns that ray.data.llm lacks (its id/text/token_ids/error are the job's names).
STATISTICS = [f for f in SCHEMA if f.name not in {*RAY_LLM_COLUMNS.names, "id", "text", "token_ids", "error"}]
GENERATED = pa.schema([*RAY_LLM_COLUMNS, *STATISTICS, (INFERENCE_ERROR, pa.string())])
# ray.data.llm's columns whose Arrow type is the data's (vLLM's per-request metrics; log
# probabilities, keyed by token id), converted as Ray Data converts them.
TYPED_BY_THE_DATA = ("metrics", "logprobs", "prompt_logprobs")

# engine_kwargs (vLLM's names) -> (our config section, key); a value maps through as it is.
ENGINE_KWARGS = {"max_num_seqs": ("engine", "max_num_seqs"),
                 "max_num_batched_tokens": ("engine", "max_num_batched_tokens"),
                 "max_model_len": ("engine", "max_model_len"),
                 "gpu_memory_utilization": ("engine", "gpu_memory_utilization"),
                 "dtype": ("model", "dtype"),
                 "tensor_parallel_size": ("engine", "tensor_parallel_size"),
                 "trust_remote_code": ("model", "trust_remote_code")}
# engine_kwargs that map through a conversion.
ENGINE_KWARGS_CONVERTED = {"enforce_eager": ("engine", "execution", lambda eager: "eager" if eager else "compiled"),
                           "seed": ("decoder", "seed", int)}  # sampled rows without a seed derive theirs from it
# engine_kwargs accepted only at the value our engine runs with (vLLM's defaults).
# (pipeline_parallel_size: vLLM 0.32 cannot speculate with pipeline parallelism.)
ENGINE_KWARGS_FIXED = {"enable_chunked_prefill": True, "pipeline_parallel_size": 1}
# Every other engine_kwargs key goes to vLLM as it is (engine.vllm_args), but these, which the
# processor sets from its own keywords.
ENGINE_KWARGS_SET_HERE = {"model": "model_source", "tokenizer": "model_source",
                          "distributed_executor_backend": "the engine (its ranks are the actor's processes)",
                          "per_request_spec_decode_metrics": "the engine (the rows' statistics need it)",
                          "disable_log_stats": "log_engine_metrics"}
# ray.data.llm's ChatTemplateStageConfig fields.
CHAT_TEMPLATE_STAGE_KEYS = ("enabled", "model_source", "chat_template", "chat_template_kwargs", "batch_size",
                            "concurrency", "runtime_env", "num_cpus", "memory")
# A user's speculative_config: vLLM's learning-free methods, run as vLLM has them (our drafters
# vllm_ngram and vllm_suffix), with its keys -> ours.
SPECULATIVE_METHODS = {"ngram": "vllm_ngram", "suffix": "vllm_suffix"}
SPECULATIVE_KEYS = {"method": None, "num_speculative_tokens": "w", "prompt_lookup_min": "ngram_min_q",
                    "prompt_lookup_max": "ngram_max_q"}

# sampling_params keys both engines run (checked here). Any other key of vLLM's SamplingParams goes
# to vLLM as it is on the vLLM engine (vLLM checks its value), but REFUSED_SAMPLING's.
SAMPLING_KEYS = ("max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "n", "structured_outputs")
REFUSED_SAMPLING = {
    "min_p": "vLLM does not run it with speculative decoding",
    "logit_bias": "vLLM does not run it with speculative decoding",
    "logits_processors": "vLLM does not run it with speculative decoding",
    "spaces_between_special_tokens": "the actor decodes the text itself (skip_special_tokens is honoured)",
    "output_kind": "the processor takes each request's final output", "extra_args": "not run here"}
# vLLM's StructuredOutputsParams: one constraint, and options.
CONSTRAINTS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")
CONSTRAINT_OPTIONS = ("disable_any_whitespace", "disable_additional_properties", "whitespace_pattern")
# max_tokens None: as many as the model's length leaves (each engine cuts a request's budget to it).
UP_TO_THE_MODELS_LENGTH = 2**31 - 1
VLLM_DEFAULTS = {"max_tokens": 16, "temperature": 1.0, "top_p": 1.0, "top_k": 0}


@dataclass(frozen=True)
class vLLMEngineProcessorConfig:  # noqa: N801 - ray.data.llm's name, kept so one import changes
    """ray.data.llm's keywords with its meanings, plus ours (after `task_type`)."""
    model_source: str
    batch_size: int = 32
    concurrency: int | tuple[int, int] = 1
    accelerator_type: str | None = None
    engine_kwargs: Mapping[str, Any] = field(default_factory=dict)
    runtime_env: Mapping[str, Any] | None = None
    max_pending_requests: int | None = None
    max_concurrent_batches: int = 8
    should_continue_on_error: bool = False
    # True, False (`messages` are not templated: a row needs prompt or tokenized_prompt), or as Ray's
    # ChatTemplateStageConfig (or a dict of its fields): enabled, chat_template (a Jinja template
    # instead of the tokenizer's), chat_template_kwargs (for apply_chat_template). Its actor pool's
    # keys (batch_size, concurrency, num_cpus, ...) are accepted: our actor templates in its process.
    chat_template_stage: Any = True
    # Accepted, and the same either way: our actor tokenizes and detokenizes in the engine's
    # process, with no stage of its own (ray.data.llm runs each as an actor pool).
    tokenize_stage: bool = True
    detokenize_stage: bool = True
    placement_group_config: Mapping[str, Any] | None = None
    # Live metrics from every actor, through Ray's metrics (Ray's dashboard, Prometheus): the job's
    # counters (pipeline/metrics.py: rows, tokens, target calls, accepted drafts, engine steps and
    # occupancy), tagged run_id "processor-<id>".
    log_engine_metrics: bool = True
    task_type: str = "generate"
    # Ours: decoder.* settings as in a job's config (our default drafter when empty), and the engine.
    decoder: Mapping[str, Any] = field(default_factory=dict)
    engine: str = "vllm"
    # Ours: which of our columns a row gets (None: all of STATISTICS; () none, ray.data.llm's only).
    statistics_columns: Sequence[str] | None = None
    # Ours: resume. With both, processor(ds) turns on Ray Data's checkpointing for ds's pipeline
    # (ds.context.checkpoint_config): writing the Dataset records each id under checkpoint_path, kept
    # after success, and running it again generates only the ids no earlier run wrote.
    id_column: str | None = None
    checkpoint_path: str | None = None

    def __post_init__(self):
        check(isinstance(self.model_source, str) and self.model_source, "model_source", "a model directory, "
              "a .gguf file, a Hugging Face hub id in the local cache or 'smollm2-135m-instruct'")
        check(isinstance(self.batch_size, int) and self.batch_size >= 1, "batch_size", "an integer >= 1")
        check(self.task_type == "generate", "task_type", "'generate' (embed, classify and score are not ours)")
        check(self.max_concurrent_batches >= 1, "max_concurrent_batches", "an integer >= 1")
        check(self.max_pending_requests is None or self.max_pending_requests >= 1, "max_pending_requests",
              "an integer >= 1 or None")
        check(self.engine in ("vllm", "transformers"), "engine", "'vllm' or 'transformers'")
        self.actors()
        self.statistics()
        self.chat_template()
        check((self.id_column is None) == (self.checkpoint_path is None), "id_column",
              "set together with checkpoint_path (resuming needs both), or neither")
        for name in ("id_column", "checkpoint_path"):
            value = getattr(self, name)
            check(value is None or (isinstance(value, str) and value), name, "a non-empty string or None")
        for key, value in self.engine_kwargs.items():
            check(isinstance(key, str), "engine_kwargs", "a mapping of vLLM's engine argument names to values")
            if key in ENGINE_KWARGS_FIXED:
                check(value == ENGINE_KWARGS_FIXED[key], f"engine_kwargs.{key}",
                      f"{ENGINE_KWARGS_FIXED[key]!r} (the only value this engine runs)")
            check(key not in ENGINE_KWARGS_SET_HERE, f"engine_kwargs.{key}",
                  f"left out: {ENGINE_KWARGS_SET_HERE.get(key)} sets it")
        self.pipeline_config()  # its own checks, naming decoder.* and engine.* fields

    def chat_template(self, fallback_kwargs: Mapping[str, Any] | None = None) -> dict:
        """chat_template_stage as ProcessorStage's settings: enabled, template, template_kwargs
        (the stage's own chat_template_kwargs, else build_processor's)."""
        stage = self.chat_template_stage
        if isinstance(stage, bool):
            stage = {"enabled": stage}
        elif hasattr(stage, "model_dump"):  # ray.data.llm's ChatTemplateStageConfig
            stage = stage.model_dump()
        check(isinstance(stage, Mapping), "chat_template_stage",
              "True, False, a ChatTemplateStageConfig or a dict of its fields")
        unknown = sorted(set(stage) - set(CHAT_TEMPLATE_STAGE_KEYS))
        check(not unknown, f"chat_template_stage.{unknown[0] if unknown else ''}",
              f"one of {list(CHAT_TEMPLATE_STAGE_KEYS)}")
        check(stage.get("model_source") in (None, self.model_source), "chat_template_stage.model_source",
              "model_source or None (the engine's tokenizer templates the rows)")
        template, kwargs = stage.get("chat_template"), stage.get("chat_template_kwargs") or fallback_kwargs or {}
        check(template is None or isinstance(template, str), "chat_template_stage.chat_template",
              "a Jinja template string or None")
        check(isinstance(kwargs, Mapping), "chat_template_stage.chat_template_kwargs", "a mapping or None")
        return {"chat_template": bool(stage.get("enabled", True)), "template": template,
                "template_kwargs": dict(kwargs)}

    def actors(self) -> tuple[int, int]:
        """(min, max) actors, as ray.data.llm reads `concurrency`: n is an autoscaling pool of 1 to n."""
        concurrency = self.concurrency
        if isinstance(concurrency, int) and not isinstance(concurrency, bool) and concurrency >= 1:
            return 1, concurrency
        check(isinstance(concurrency, (tuple, list)) and len(concurrency) == 2
              and all(isinstance(n, int) for n in concurrency) and 1 <= concurrency[0] <= concurrency[1],
              "concurrency", "an integer >= 1 or (min, max) with 1 <= min <= max")
        return tuple(concurrency)

    def statistics(self) -> tuple[str, ...]:
        """Our columns a row gets, in the output's order."""
        if self.statistics_columns is None:
            return tuple(f.name for f in STATISTICS)
        chosen = self.statistics_columns
        check(not isinstance(chosen, str) and all(isinstance(name, str) for name in chosen), "statistics_columns",
              "a list of column names or None")
        known = [f.name for f in STATISTICS]
        for name in chosen:
            check(name in known, f"statistics_columns ({name!r})", f"one of {known}")
        return tuple(name for name in known if name in chosen)

    def checkpoint(self):
        """Ray Data's checkpointing for these keywords, or None."""
        if self.id_column is None:
            return None
        from ray.data.checkpoint import CheckpointConfig
        return CheckpointConfig(id_column=self.id_column, checkpoint_path=self.checkpoint_path,
                                delete_checkpoint_on_success=False)

    def resources(self) -> dict[str, float]:
        """One actor's resources: the placement group's bundles summed (ray.data.llm places one per
        replica; our engine's ranks are the actor's own processes, so they are on its node), a CPU
        where they name none. Without bundles, ray.data.llm's default: a GPU per tensor-parallel rank."""
        ranks = self.engine_kwargs.get("tensor_parallel_size", 1)
        check(isinstance(ranks, int) and ranks >= 1, "engine_kwargs.tensor_parallel_size", "an integer >= 1")
        bundles = (self.placement_group_config or {}).get("bundles") or [{"GPU": 1}] * ranks
        check(all(isinstance(bundle, dict) for bundle in bundles), "placement_group_config.bundles",
              "a list of resource mappings, e.g. [{'CPU': 1}] or [{'GPU': 1}]")
        gpus = sum(bundle.get("GPU", 0) for bundle in bundles)
        check(gpus in (0, ranks), "placement_group_config.bundles",
              f"no GPU (a CPU engine) or one GPU per tensor-parallel rank ({ranks}), not {gpus}")
        return {"CPU": sum(bundle.get("CPU", 0) for bundle in bundles) or 1.0, "GPU": gpus}

    def pipeline_config(self) -> Config:
        resources = self.resources()
        # On a CPU the engine's threads are the CPUs the actor reserved (Ray starts it with one otherwise).
        threads = 0 if resources["GPU"] else max(1, int(resources["CPU"]))
        # The job's default drafter (pipeline/config.py's defaults) unless `decoder` names another.
        sections: dict[str, dict] = {"model": {"name": self.model_source, "num_threads": threads},
                                     "engine": {"name": self.engine, "request_metrics": self.engine == "vllm"},
                                     "decoder": dict(self.decoder), "ray": {}}
        vllm_args = {}
        for key, value in self.engine_kwargs.items():
            if key in ENGINE_KWARGS:
                section, name = ENGINE_KWARGS[key]
                sections[section][name] = value
            elif key in ENGINE_KWARGS_CONVERTED:
                section, name, convert = ENGINE_KWARGS_CONVERTED[key]
                sections[section][name] = convert(value)
            elif key == "speculative_config":
                sections["decoder"].update(self.speculative_decoder(value))
            elif key not in ENGINE_KWARGS_FIXED:
                vllm_args[key] = value
        sections["engine"]["vllm_args"] = vllm_args
        low, high = self.actors()
        batches = self.max_concurrent_batches if self.engine == "vllm" else 1  # transformers: one at a time
        if self.max_pending_requests:
            batches = max(1, min(batches, math.ceil(self.max_pending_requests / self.batch_size)))
        if self.engine == "transformers" and "max_batch_requests" not in self.decoder:
            # its requests per forward call come from one batch: no more than the batch holds
            default = build(DecoderConfig, dict(self.decoder), "decoder")
            sections["decoder"]["max_batch_requests"] = min(default.max_batch_requests, self.batch_size)
        sections["ray"] = {"min_actors": low, "max_actors": high, "batch_size": self.batch_size,
                           "max_concurrent_batches": batches, "num_cpus_per_actor": resources["CPU"],
                           "num_gpus_per_actor": resources["GPU"], "accelerator_type": self.accelerator_type or ""}
        return build(Config, sections)


    def speculative_decoder(self, spec: Any) -> dict:
        """A user's engine_kwargs.speculative_config as our decoder settings: vLLM's own method runs."""
        name = "engine_kwargs.speculative_config"
        check(isinstance(spec, Mapping), name, "a mapping such as {'method': 'suffix', 'num_speculative_tokens': 16}")
        check(not self.decoder, name, "left out when `decoder` is set (one or the other names the drafter)")
        check(spec.get("method") in SPECULATIVE_METHODS, f"{name}.method",
              f"one of {sorted(SPECULATIVE_METHODS)}: vLLM's learning-free methods (a draft model or an EAGLE "
              "head is not run here; our drafters are `decoder`)")
        unknown = sorted(set(spec) - set(SPECULATIVE_KEYS))
        check(not unknown, f"{name}.{unknown[0] if unknown else ''}", f"one of {sorted(SPECULATIVE_KEYS)}")
        return {"drafter": SPECULATIVE_METHODS[spec["method"]],
                **{SPECULATIVE_KEYS[key]: value for key, value in spec.items() if SPECULATIVE_KEYS[key]}}


def check(ok: bool, name: str, allowed: str) -> None:
    if not ok:
        raise ConfigError(f"vLLMEngineProcessorConfig.{name}: must be {allowed}")


# --- One row: its prompt and sampling params ----------------------------------------------------

def without_nulls(value: Any) -> Any:
    """A mapping as an Arrow struct column gives it back: with every key any row had, None where
    this row had none."""
    if isinstance(value, dict):
        return {key: without_nulls(item) for key, item in value.items() if item is not None}
    if isinstance(value, list):
        return [without_nulls(item) for item in value]
    return value


def structured_outputs_of(value: Any, name: str) -> dict:
    """`sampling_params.structured_outputs` checked here, so that a bad one names its row and key."""
    import jsonschema

    where = f"{name}: sampling_params.structured_outputs"
    if not isinstance(value, dict):
        raise RequestError(f"{where} must be a mapping such as {{'json': schema}}, got {type(value).__name__}")
    value = without_nulls(value)
    unknown = sorted(set(value) - {*CONSTRAINTS, *CONSTRAINT_OPTIONS})
    given = [key for key in CONSTRAINTS if key in value]
    if unknown or len(given) != 1:
        raise RequestError(f"{where} must set one of {', '.join(CONSTRAINTS)} (and options "
                           f"{', '.join(CONSTRAINT_OPTIONS)}); got {sorted(value)}")
    schema = value.get("json")
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError as error:
            raise RequestError(f"{where}.json is not JSON: {error}") from error
    if "json" in value:
        try:
            jsonschema.validators.validator_for(schema).check_schema(schema)
        except (jsonschema.SchemaError, TypeError, AttributeError) as error:
            message = error.message if isinstance(error, jsonschema.SchemaError) else str(error)
            raise RequestError(f"{where}.json is not a JSON schema: {message}") from error
        value["json"] = schema
    if "choice" in value and not (isinstance(value["choice"], list) and value["choice"]
                                  and all(isinstance(c, str) for c in value["choice"])):
        raise RequestError(f"{where}.choice must be a non-empty list of strings")
    return value


@dataclass(frozen=True)
class RowSettings:
    sampling: SamplingParams
    max_tokens: int
    stop: tuple[str, ...]
    structured_outputs: dict | None
    vllm_sampling: dict | None = None  # vLLM's other SamplingParams keys, as given


def vllm_sampling_keys() -> frozenset:
    from vllm import SamplingParams as VllmSamplingParams

    return frozenset(VllmSamplingParams.__struct_fields__)


def sampling_of(params: Any, name: str, seed: int | None = None, vllm_keys: frozenset | None = None) -> RowSettings:
    """vLLM's `sampling_params` (its defaults where a key is absent or None) as our settings.
    `vllm_keys`: vLLM's SamplingParams fields, on the vLLM engine (None: the transformers engine)."""
    if not isinstance(params, (dict, type(None))):
        raise RequestError(f"{name}: sampling_params must be a mapping, got {type(params).__name__}")
    # Arrow gives a struct column every key any row has: None is "not set", as in vLLM.
    # max_tokens given as None: vLLM's "up to the model's length" (absent: its default, 16).
    to_the_end = "max_tokens" in (params or {}) and params["max_tokens"] is None
    params = {key: value for key, value in (params or {}).items() if value is not None}
    extra = {key: params.pop(key) for key in sorted(set(params) - set(SAMPLING_KEYS))}
    for key in extra:
        if vllm_keys is None:
            raise RequestError(f"{name}: sampling_params.{key} runs on the vLLM engine only (this one runs "
                               f"{', '.join(SAMPLING_KEYS)})")
        if key not in vllm_keys:
            raise RequestError(f"{name}: sampling_params.{key} is not one of vLLM's SamplingParams")
        if key in REFUSED_SAMPLING:
            raise RequestError(f"{name}: sampling_params.{key} is not run here: {REFUSED_SAMPLING[key]}")
    values = {**VLLM_DEFAULTS, **params}

    def number(key: str, kind: type, ok: Callable, allowed: str):
        value = values[key]
        usable = (isinstance(value, (int, float)) and not isinstance(value, bool)
                  and (kind is float or value == int(value)) and ok(value))
        if not usable:
            raise RequestError(f"{name}: sampling_params.{key} must be {allowed}, got {value!r}")
        return kind(value)

    if values.get("n", 1) != 1:
        raise RequestError(f"{name}: sampling_params.n must be 1 (one completion per row), got {values['n']!r}")
    stop = values.get("stop") or ()
    stop = (stop,) if isinstance(stop, str) else tuple(stop)
    if not all(isinstance(text, str) and text for text in stop):
        raise RequestError(f"{name}: sampling_params.stop must be a string or a list of non-empty strings")
    top_k = number("top_k", int, lambda v: v >= -1, "an integer >= -1 (0 or -1: no cut)")
    sampling = SamplingParams(
        temperature=number("temperature", float, lambda v: v >= 0, "a number >= 0"),
        top_k=max(top_k, 0), top_p=number("top_p", float, lambda v: 0 < v <= 1, "a number in (0, 1]"),
        seed=number("seed", int, lambda v: v >= 0, "an integer >= 0") if "seed" in values
        else (seed if seed is not None else secrets.randbits(63)))  # vLLM: no seed, a fresh one
    structured = values.get("structured_outputs")
    max_tokens = (UP_TO_THE_MODELS_LENGTH if to_the_end
                  else number("max_tokens", int, lambda v: v >= 1, "an integer >= 1"))
    return RowSettings(sampling, max_tokens, stop,
                       None if structured is None else structured_outputs_of(structured, name), extra or None)


class ProcessorStage:
    """The actor's callable: the engine (built once), rows in, rows out with ray.data.llm's columns
    and ours appended to their own."""

    def __init__(self, config: Config, tables=None, chat_template: bool = True, continue_on_error: bool = False,
                 seed: int | None = None, statistics: Sequence[str] | None = None, template: str | None = None,
                 template_kwargs: Mapping[str, Any] | None = None, live_metrics: bool = False, run_id: str = ""):
        import ray

        # Live metrics (log_engine_metrics): the job's counters (pipeline/metrics.py), tagged with
        # this processor's run id, from each actor Ray Data runs (not from a stage built outside Ray).
        self.stage = GenerationStage(config, tables, run_id=run_id, live_metrics=live_metrics and ray.is_initialized())
        self.dropped = [] if statistics is None else [f.name for f in STATISTICS if f.name not in statistics]
        self.seed = seed  # engine_kwargs' seed: a row without one samples with one derived from it
        self.vllm_keys = vllm_sampling_keys() if config.engine.name == "vllm" else None
        self.chat_template = chat_template
        self.template, self.template_kwargs = template, dict(template_kwargs or {})
        self.continue_on_error = continue_on_error
        self.request_ids = itertools.count()

    @staticmethod
    def input_columns_of(config: Config) -> tuple[dict[str, str], dict[str, str]]:
        """(required, optional) input columns and what each holds, as ray.data.llm logs them."""
        return ({"messages | prompt | tokenized_prompt": "chat messages (templated), a text prompt (tokenized as "
                 "it is) or token ids: one of them"},
                {"sampling_params": "vLLM's SamplingParams keys (vLLM's defaults where absent)"})

    def prompt(self, row: dict, name: str) -> tuple[str, list[int]]:
        """The text prompt and its ids, as ray.data.llm's chat-template and tokenize stages make them."""
        tokenizer = self.stage.engine.tokenizer
        if row.get("tokenized_prompt") is not None:
            ids = [int(t) for t in row["tokenized_prompt"]]
            return row.get("prompt") or "", ids
        if self.chat_template and row.get("messages") is not None:
            messages = row["messages"]
            if not (isinstance(messages, list) and messages and all(isinstance(m, dict) for m in messages)):
                raise RequestError(f"{name}: messages must be a non-empty list of chat messages")
            last_is_user = messages[-1].get("role") == "user"
            try:
                prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=last_is_user,
                                                       continue_final_message=not last_is_user,
                                                       chat_template=self.template, **self.template_kwargs)
            except Exception as error:  # a template's own errors are of any type
                raise RequestError(f"{name}: messages cannot be chat-templated: {error}") from error
        elif isinstance(row.get("prompt"), str):
            prompt = row["prompt"]
        else:
            need = "messages, prompt or tokenized_prompt" if self.chat_template else "prompt or tokenized_prompt"
            raise RequestError(f"{name}: the row has no {need}")
        ids = list(tokenizer(prompt)["input_ids"])
        if not ids:
            raise RequestError(f"{name}: the prompt is empty")
        return prompt, ids

    def request(self, row: dict, request_id: int) -> tuple[Request, str]:
        name = f"row (request_id {request_id})"
        seed = request_seed(self.seed, name) if self.seed is not None else None
        settings = sampling_of(row.get("sampling_params"), name, seed, self.vllm_keys)
        with self.stage.tokenizer_lock:
            prompt, ids = self.prompt(row, name)
        return Request(str(request_id), ids, settings.max_tokens, settings.stop, settings.sampling,
                       settings.structured_outputs, settings.vllm_sampling, self.adapter(row, name)), prompt

    def adapter(self, row: dict, name: str) -> str | None:
        """The row's LoRA adapter: its `model`, where it names another than model_source (as
        ray.data.llm reads it: a local directory; vLLM needs engine_kwargs enable_lora)."""
        model = row.get("model")
        if model is None or model == self.stage.config.model.name:
            return None
        if not isinstance(model, str) or not model:
            raise RequestError(f"{name}: model must be a LoRA adapter's directory (or model_source), got {model!r}")
        if "://" in model:
            raise RequestError(f"{name}: model {model!r}: a LoRA adapter is read from a local directory here "
                               "(dynamic_lora_loading_path is not taken); copy it to the nodes first")
        if not (Path(model) / "adapter_config.json").is_file():  # vLLM would fail its engine step, not the row
            raise RequestError(f"{name}: model {model!r} is neither model_source nor a LoRA adapter's directory "
                               "(one holding adapter_config.json) on this node")
        return model

    def __call__(self, batch: pa.Table) -> pa.Table:
        batch_uuid, started = uuid.uuid4().hex, time.time()

        def request_of(row: dict) -> tuple[Request, str]:
            return self.request(row, next(self.request_ids))

        def error_of(row: dict, made: tuple | None, message: str) -> dict:
            if made is None:  # the message names the row already
                return self.failed(message, row.get("prompt"), batch_uuid)
            request, prompt = made
            return self.failed(f"row (request_id {request.request_id}): {message}", prompt, batch_uuid, request.adapter)

        out = self.stage.run_requests(batch.to_pylist(), request_of,
                                      lambda made, result, seconds: self.generated(*made, result, batch_uuid, seconds),
                                      error_of)
        self.stage.report(out, [bool(row.get(INFERENCE_ERROR)) for row in out], started)
        generated = pa.Table.from_pylist(out, schema=pa.schema([f for f in GENERATED if f.name not in TYPED_BY_THE_DATA]))
        for name in TYPED_BY_THE_DATA:  # in GENERATED's order, each at its place
            generated = generated.add_column(GENERATED.get_field_index(name), name,
                                             convert_to_pyarrow_array([row.get(name) for row in out], name))
        kept = batch.drop_columns([name for name in GENERATED.names if name in batch.column_names])
        for column in generated.drop_columns(self.dropped).schema:
            kept = kept.append_column(column, generated.column(column.name))
        return kept

    def generated(self, request: Request, prompt: str, result: Result, batch_uuid: str, seconds: float) -> dict:
        sampling = request.sampling
        row = {"prompt": prompt, "prompt_token_ids": request.prompt_ids, "num_input_tokens": len(request.prompt_ids),
               "generated_tokens": result.token_ids, "generated_text": result.text,
               "num_generated_tokens": len(result.token_ids), "request_id": int(request.request_id),
               "metrics": result.engine_metrics, "logprobs": result.logprobs, "prompt_logprobs": result.prompt_logprobs,
               # The request's own time in the engine (scheduled to its last token), as ray.data.llm's.
               "batch_uuid": batch_uuid, "time_taken_llm": result.stats.total_seconds or seconds,
               "params": result.params or (f"SamplingParams(max_tokens={request.max_new_tokens}, temperature="
                                           f"{sampling.temperature}, top_p={sampling.top_p}, top_k={sampling.top_k}, "
                                           f"seed={sampling.seed}, stop={list(request.stop)})"),
               "temperature": sampling.temperature, "top_k": sampling.top_k, "top_p": sampling.top_p,
               "seed": sampling.seed, INFERENCE_ERROR: ""}
        row.update(result.stats.as_row())
        row.update(self.stage.settings)
        if request.adapter is not None:
            row["model"] = request.adapter  # what ran: the adapter on model_source
        return row

    def failed(self, message: str, prompt: Any, batch_uuid: str, adapter: str | None = None) -> dict:
        """ray.data.llm's error row (request_id -1, time_taken_llm -1), or the error raised."""
        if not self.continue_on_error:
            raise ValueError(message)
        return {"prompt": prompt if isinstance(prompt, str) else "", "num_input_tokens": 0, "generated_tokens": [],
                "generated_text": "", "num_generated_tokens": 0, "request_id": -1, "batch_uuid": batch_uuid,
                "time_taken_llm": -1.0, "params": "", INFERENCE_ERROR: message, **self.stage.settings,
                **({"model": adapter} if adapter is not None else {})}


# --- The processor ------------------------------------------------------------------------------

def merged(preprocess: Callable) -> Callable:
    """ray.data.llm's preprocess: the row, updated with what the function returns."""
    def apply(row: dict) -> dict:
        return {**row, **preprocess(row)}
    return apply


def unless_failed(postprocess: Callable, continue_on_error: bool) -> Callable:
    """ray.data.llm's postprocess: error rows bypass it, whole; with should_continue_on_error the
    others' output gets `__inference_error__` "" (every row then has the column)."""
    def apply(row: dict) -> dict:
        if row.get(INFERENCE_ERROR):
            return row
        out = postprocess(row)
        return {**out, INFERENCE_ERROR: ""} if continue_on_error else out
    return apply


@dataclass(frozen=True)
class RowFormat:
    """The rows the actors take and give: the stage class each actor builds once (with the config,
    the drafter tables and these settings), and the batch format Ray Data hands it. ray.data.llm's
    rows are ProcessorStage's; the job's (pipeline.ray_job) are GenerationStage's. Both run their
    requests through GenerationStage.run_requests on the same engine."""
    stage: type
    settings: Mapping[str, Any] = field(default_factory=dict)
    batch_format: str = "pyarrow"


@dataclass(frozen=True)
class Processor:
    """A Dataset in, the lazy Dataset of its generated rows out: the preprocess, the stage of
    actors, the postprocess. build_processor makes one from ray.data.llm's config; the job makes
    one from its own."""
    config: Config  # the pipeline's settings: model, engine, drafter, actors
    rows: RowFormat
    checkpoint: Any = None  # ray.data.checkpoint.CheckpointConfig for the input's pipeline, or None
    runtime_env: Mapping[str, Any] = field(default_factory=dict)
    preprocess: Callable | None = None
    postprocess: Callable | None = None
    preprocess_map_kwargs: Mapping[str, Any] = field(default_factory=dict)
    postprocess_map_kwargs: Mapping[str, Any] = field(default_factory=dict)

    def __call__(self, dataset):
        """The lazy Dataset. The model is checked (and drafter tables built) here, once: a model or
        setting the engine cannot run fails now, not inside the actors. The checkpoint and how long
        the actors may take to start are the Dataset's (its context), not the process's."""
        config = self.config
        if self.checkpoint is not None:
            present, checkpoint = dataset.context.checkpoint_config, self.checkpoint
            if present is not None and (present.id_column, present.checkpoint_path) != (
                    checkpoint.id_column, checkpoint.checkpoint_path):
                raise ValueError(f"processor(ds): ds already checkpoints ({present.id_column!r} under "
                                 f"{present.checkpoint_path!r}, its context's checkpoint_config); the config's "
                                 f"id_column and checkpoint_path would replace it")
            dataset.context.checkpoint_config = checkpoint  # shared by ds's pipeline, its read included
        dataset.context.wait_for_min_actors_s = int(math.ceil(config.ray.wait_for_actors_s))
        tables = prepared_tables(config)
        if self.preprocess is not None:
            dataset = dataset.map(merged(self.preprocess), **self.preprocess_map_kwargs)
        dataset = generation_stage(dataset, config, self.rows.stage,
                                   {"config": config, "tables": tables, **self.rows.settings},
                                   self.rows.batch_format, dict(self.runtime_env))
        if self.postprocess is not None:
            dataset = dataset.map(unless_failed(self.postprocess, self.rows.settings.get("continue_on_error", False)),
                                  **self.postprocess_map_kwargs)
        return dataset


    def list_stage_names(self) -> list[str]:
        """The stages between the preprocess and the postprocess, as ray.data.llm names its own: one."""
        return [self.rows.stage.__name__]

    def get_stage_by_name(self, name: str) -> RowFormat:
        if name in self.list_stage_names():
            return self.rows
        raise ValueError(f"Stage {name} not found (this processor has {self.list_stage_names()})")

    def log_input_column_names(self) -> None:
        """Logs the first stage's input columns, as ray.data.llm's processor does."""
        required, optional = self.rows.stage.input_columns_of(self.config)
        message = f"The first stage of the processor is {self.list_stage_names()[0]}."
        message += "\nRequired input columns:\n" + "\n".join(f"\t{k}: {v}" for k, v in required.items())
        message += "\nOptional input columns:\n" + "\n".join(f"\t{k}: {v}" for k, v in optional.items())
        logger.info(message)


def build_processor(config: vLLMEngineProcessorConfig, preprocess: Callable | None = None,
                    postprocess: Callable | None = None, preprocess_map_kwargs: dict | None = None,
                    postprocess_map_kwargs: dict | None = None, builder_kwargs: dict | None = None) -> Processor:
    if not isinstance(config, vLLMEngineProcessorConfig):
        raise TypeError(f"build_processor: config must be pipeline.llm.vLLMEngineProcessorConfig, "
                        f"got {type(config).__name__}")
    unknown = sorted(set(builder_kwargs or {}) - {"chat_template_kwargs"})
    if unknown:
        raise TypeError(f"build_processor: builder_kwargs {unknown} are not taken by this processor "
                        "(it takes chat_template_kwargs)")
    rows = RowFormat(ProcessorStage, {**config.chat_template((builder_kwargs or {}).get("chat_template_kwargs")),
                                      "continue_on_error": config.should_continue_on_error,
                                      "live_metrics": config.log_engine_metrics, "run_id": f"processor-{uuid.uuid4().hex[:8]}",
                                      "seed": config.engine_kwargs.get("seed"), "statistics": config.statistics()})
    return Processor(config.pipeline_config(), rows, config.checkpoint(), dict(config.runtime_env or {}),
                     preprocess, postprocess, dict(preprocess_map_kwargs or {}), dict(postprocess_map_kwargs or {}))


__all__ = ["Processor", "RowFormat", "build_processor", "vLLMEngineProcessorConfig"]
