"""A request's settings as vLLM's SamplingParams, and which of vLLM's sampling keys the engine
runs (those it refuses, each with why)."""

from __future__ import annotations

import functools

from pipeline.engines.base import SAMPLING_KEYS, EngineSampling, Request, RequestError
from pipeline.engines.vllm.v2.options import KEYED_KEY, PREDICTION_KEY
from pipeline.engines.vllm.versions import runs_speculator

# vLLM SamplingParams keys refused here, each with why (any other goes to vLLM, which checks it).
REFUSED_SAMPLING = {
    "min_p": "vLLM does not run it with speculative decoding",
    "logit_bias": "vLLM does not run it with speculative decoding",
    "logits_processors": "vLLM does not run it with speculative decoding",
    "spaces_between_special_tokens": "the actor decodes the text itself (skip_special_tokens is honoured)",
    "output_kind": "the processor takes each request's final output",
    "extra_args": "not run here",
}
# vLLM SamplingParams keys that shape the text, which the engine decodes itself (`detokenize`: the
# text is decoded either way, as ray.data.llm's detokenize stage does).
TEXT_SETTINGS = ("skip_special_tokens", "include_stop_str_in_output", "detokenize")


def vllm_params(request: Request, max_tokens: int):
    """The request's settings as vLLM's SamplingParams; RequestError names what vLLM refuses.
    Greedy requests with only the common settings share one object per distinct settings, as
    vLLM's LLM.generate shares its one (vLLM copies it for each request it admits): building one
    costs about as much as the rest of a short row's way through the stage. A sampled request has
    a seed of its own, so it would never share one."""
    from vllm.exceptions import VLLMError

    sampling = request.sampling
    seed = None if sampling.greedy else sampling.seed
    common = (max_tokens, sampling.temperature, sampling.top_k, sampling.top_p, seed, tuple(request.stop))
    keyed = not sampling.greedy and runs_speculator()
    plain = not (request.structured_outputs or request.engine_sampling or request.prediction or keyed)
    own = {} if plain else own_settings(request)  # (its RequestError names the setting)
    if keyed:  # vLLM 0.34: greedy in vLLM, drawn by our keyed-draw processor (v2/keyed_draws.py)
        settings = {"temperature": sampling.temperature, "top_k": max(sampling.top_k, 0), "top_p": sampling.top_p}
        own["extra_args"] = {**own.get("extra_args", {}), KEYED_KEY: {**settings, "seed": seed}}
        common = (max_tokens, 0.0, 0, 1.0, None, tuple(request.stop))
    try:
        return shared_params(*common) if plain and seed is None else sampling_params(*common, **own)
    except (TypeError, ValueError, VLLMError) as error:
        raise RequestError(f"request {request.request_id!r}: sampling_params: {error}") from error


def sampling_params(max_tokens, temperature, top_k, top_p, seed, stop: tuple, named_logprobs=False, **own):
    """vLLM's SamplingParams. The text is decoded here from the tokens (result()): vLLM detokenizes
    only to find stop strings and to name the tokens of log probabilities (unless the request says
    detokenize False)."""
    from vllm import SamplingParams

    return SamplingParams(
        max_tokens=max_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        seed=seed,
        stop=list(stop) or None,
        detokenize=bool(stop) or named_logprobs,
        **own,
    )


shared_params = functools.lru_cache(maxsize=4096)(sampling_params)


def own_settings(request: Request) -> dict:
    """A request's settings beyond the common ones: structured outputs, vLLM's other settings, its
    prediction (for our proposer, proposer.py, which reads it from the runner's request)."""
    from vllm.exceptions import VLLMError
    from vllm.sampling_params import StructuredOutputsParams

    own = {}
    if request.structured_outputs:
        try:
            own["structured_outputs"] = StructuredOutputsParams(**request.structured_outputs)
        except (TypeError, ValueError, VLLMError) as error:
            raise RequestError(f"request {request.request_id!r}: structured_outputs: {error}") from error
    settings = request.engine_sampling or {}
    own.update((key, value) for key, value in settings.items() if key not in TEXT_SETTINGS)
    if request.prediction:
        own["extra_args"] = {PREDICTION_KEY: list(request.prediction)}
    own["named_logprobs"] = settings.get("detokenize", True) and (
        settings.get("logprobs") is not None or settings.get("prompt_logprobs") is not None
    )
    return own


def vllm_sampling() -> EngineSampling:
    """The sampling_params keys vLLM runs here: its SamplingParams' fields, but REFUSED_SAMPLING's."""
    from vllm import SamplingParams

    keys = frozenset(SamplingParams.__struct_fields__) - set(REFUSED_SAMPLING) - set(SAMPLING_KEYS)
    return EngineSampling("vllm", keys, "vLLM's SamplingParams", REFUSED_SAMPLING)
