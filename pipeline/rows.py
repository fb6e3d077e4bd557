"""One row of ray.data.llm's form (`messages`, `prompt` or `tokenized_prompt`, and vLLM's
`sampling_params`) read as our settings, and the columns a generated row gets. The one request
parser: the job's rows reach it through the job's preprocess (pipeline/job_rows.py)."""
from __future__ import annotations

import json
import math
import secrets
from dataclasses import dataclass
from typing import Any, Callable

import pyarrow as pa

from pipeline.engines.base import RequestError
from pipeline.output import SCHEMA
from pipeline.sampling import SamplingParams
from pipeline.stats import RequestStats

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
        usable = (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
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



assert set(RequestStats().as_row()) <= set(SCHEMA.names), "every statistics field must be an output column"
