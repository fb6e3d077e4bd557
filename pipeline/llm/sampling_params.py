"""A row's `sampling_params` (vLLM's names and defaults) read as our settings: the keys every engine
runs are checked here; any other key goes to the engine as it is where the engine runs it (it
declares which: its `sampling_keys`), and is the row's error where it does not."""

from __future__ import annotations

import json
import math
import secrets
from dataclasses import dataclass
from typing import Any
from collections.abc import Callable

from pipeline.engines.base import SAMPLING_KEYS, EngineSampling
from pipeline.engines.errors import RequestError
from drafters.primitives.sampling import SamplingParams

# vLLM's StructuredOutputsParams: one constraint, and options.
CONSTRAINTS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")
CONSTRAINT_OPTIONS = ("disable_any_whitespace", "disable_additional_properties", "whitespace_pattern")
# max_tokens None: as many as the model's length leaves (each engine cuts a request's budget to it).
UP_TO_THE_MODELS_LENGTH = 2**31 - 1
VLLM_DEFAULTS = {"max_tokens": 16, "temperature": 1.0, "top_p": 1.0, "top_k": 0}
# Samples one row may ask for (sampling_params.n), as OpenAI's chat completions allow.
MAX_SAMPLES = 128


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
        raise RequestError(
            f"{where} must set one of {', '.join(CONSTRAINTS)} (and options "
            f"{', '.join(CONSTRAINT_OPTIONS)}); got {sorted(value)}"
        )
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
    if "choice" in value and not (
        isinstance(value["choice"], list) and value["choice"] and all(isinstance(c, str) for c in value["choice"])
    ):
        raise RequestError(f"{where}.choice must be a non-empty list of strings")
    return value


@dataclass(frozen=True)
class RowSettings:
    sampling: SamplingParams
    max_tokens: int
    stop: tuple[str, ...]
    structured_outputs: dict | None
    engine_sampling: dict | None = None  # the engine's own other sampling keys, as given
    n: int = 1  # samples of the row, each its own row (sample_index 0 to n - 1)


def sampling_of(params: Any, name: str, seed: int | None, engine: EngineSampling) -> RowSettings:
    """vLLM's `sampling_params` (its defaults where a key is absent or None) as our settings; `seed`
    for a row without one (None: a fresh one, as vLLM draws). `engine` says what else it runs."""
    if not isinstance(params, (dict, type(None))):
        raise RequestError(f"{name}: sampling_params must be a mapping, got {type(params).__name__}")
    # Arrow gives a struct column every key any row has: None is "not set", as in vLLM.
    # max_tokens given as None: vLLM's "up to the model's length" (absent: its default, 16).
    to_the_end = "max_tokens" in (params or {}) and params["max_tokens"] is None
    params = {key: value for key, value in (params or {}).items() if value is not None}
    extra = {key: params.pop(key) for key in sorted(set(params) - set(SAMPLING_KEYS))}
    for key in extra:
        engine.check(key, name)
    structured = extra.pop("structured_outputs", None)
    values = {**VLLM_DEFAULTS, **params}

    def number(key: str, kind: type, ok: Callable, allowed: str):
        value = values[key]
        usable = (
            isinstance(value, (int, float))
            and not isinstance(value, bool)
            and math.isfinite(value)
            and (kind is float or value == int(value))
            and ok(value)
        )
        if not usable:
            raise RequestError(f"{name}: sampling_params.{key} must be {allowed}, got {value!r}")
        return kind(value)

    stop = values.get("stop") or ()
    stop = (stop,) if isinstance(stop, str) else tuple(stop)
    if not all(isinstance(text, str) and text for text in stop):
        raise RequestError(f"{name}: sampling_params.stop must be a string or a list of non-empty strings")
    top_k = number("top_k", int, lambda v: v >= -1, "an integer >= -1 (0 or -1: no cut)")
    sampling = SamplingParams(
        temperature=number("temperature", float, lambda v: v >= 0, "a number >= 0"),
        top_k=max(top_k, 0),
        top_p=number("top_p", float, lambda v: 0 < v <= 1, "a number in (0, 1]"),
        seed=number("seed", int, lambda v: 0 <= v < 2**63, "an integer in [0, 2**63)")
        if "seed" in values
        else (seed if seed is not None else secrets.randbits(63)),
    )  # vLLM: no seed, a fresh one
    max_tokens = (
        UP_TO_THE_MODELS_LENGTH if to_the_end else number("max_tokens", int, lambda v: v >= 1, "an integer >= 1")
    )
    n = number("n", int, lambda v: 1 <= v <= MAX_SAMPLES, f"an integer from 1 to {MAX_SAMPLES}") if "n" in values else 1
    return RowSettings(
        sampling,
        max_tokens,
        stop,
        None if structured is None else structured_outputs_of(structured, name),
        extra or None,
        n,
    )
