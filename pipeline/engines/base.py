"""What every engine shares: requests in, results with our statistics out.

An *engine* turns a list of requests into one result per request, in the same order, each with
its per-request statistics (pipeline/stats.py). The Ray stage holds one engine and never asks
which: `vllm` (vLLM with our drafters as its proposer) and `transformers` (our own decoder)
implement the same three members below.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

from pipeline.prompts import RequestError
from pipeline.sampling import GREEDY, SamplingParams
from pipeline.stats import FINISH_REASONS, RequestStats

__all__ = ["FINISH_REASONS", "Engine", "Failed", "Request", "RequestError", "Result", "budget", "cut_at_stop"]


@dataclass(frozen=True)
class Request:
    request_id: str
    prompt_ids: list[int]
    max_new_tokens: int
    stop: tuple[str, ...] = ()
    sampling: SamplingParams = GREEDY


@dataclass
class Result:
    request_id: str
    token_ids: list[int]  # generated tokens only, EOS included when it ended the request
    text: str  # decoded generated text, cut before a stop string
    finish_reason: str  # one of FINISH_REASONS
    stats: RequestStats


@dataclass(frozen=True)
class Failed:
    """A request that could not be generated; the message names it and the cause."""
    request_id: str
    message: str


class Engine(Protocol):
    # "vllm" or "transformers": the `engine` column of every row it generates.
    name: str
    # The tokenizer the engine's model was trained with: the stage encodes prompts with it.
    tokenizer: object

    def columns(self) -> dict:
        """The settings that actually run (drafter, k, w, verify, ...), one output column each."""
        ...

    def generate(self, requests: Sequence[Request]) -> list[Result | Failed]:
        """One result per request, in the order given; a request that fails does so alone."""
        ...


def budget(request: Request, max_positions: int | None) -> int:
    """Tokens `request` may generate: its max_new_tokens, cut to what fits the model's context.
    Raises RequestError when the prompt leaves no room to generate."""
    prompt = len(request.prompt_ids)
    if not prompt:
        raise RequestError(f"request {request.request_id!r}: the prompt encodes to no tokens")
    if max_positions is None:
        return request.max_new_tokens
    if prompt >= max_positions:
        raise RequestError(f"request {request.request_id!r}: the prompt has {prompt} tokens; the model allows "
                           f"{max_positions} in all, leaving no room to generate")
    return min(request.max_new_tokens, max_positions - prompt)


def cut_at_stop(text: str, stop: tuple[str, ...]) -> str:
    """The text before the first stop string in it (all of it when none occurs)."""
    cuts = [text.index(s) for s in stop if s in text]
    return text[:min(cuts)] if cuts else text
