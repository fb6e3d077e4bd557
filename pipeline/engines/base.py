"""What every engine shares: requests in, results with our statistics out.

An *engine* turns a list of requests into one result per request, in the same order, each with
its per-request statistics (pipeline/engines/stats.py). The Ray stage holds one engine and never asks
which: `vllm` (vLLM with our drafters as its proposer) and `transformers` (our own decoder)
implement the same three members below.
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import Any, Protocol
from collections.abc import Callable, Mapping, Sequence

from drafters.primitives.sampling import GREEDY, SamplingParams
from pipeline.config import Config
from pipeline.engines.errors import RequestError
from pipeline.engines.stats import FINISH_REASONS, RequestStats

__all__ = [
    "FINISH_REASONS",
    "SAMPLING_KEYS",
    "Engine",
    "EngineKind",
    "EngineSampling",
    "EngineSteps",
    "Failed",
    "Request",
    "Result",
    "budget",
    "cut_at_stop",
    "engine_summary",
]


@dataclass(frozen=True)
class EngineKind:
    """What an engine declares of its settings, for pipeline/engines/build.py (the one place that
    maps `engine.name` to an engine) to read: the config, the stage and the processor never ask
    which engine they have. Each engine's is its package's KIND (its settings.py)."""

    name: str
    # The config sections it reads: two configs alike in these run alike on it.
    sections: tuple[str, ...]
    # The config as it runs it: its own values resolved, what it cannot honour refused (a
    # ConfigError naming the field), when the job or the processor starts. Idempotent.
    checked: Callable[[Config], Config]
    # Refuses, from the model's files alone (no weights loaded), a model it cannot run (ModelRefused).
    check_model: Callable[[Config, Path], None]
    # Rows per Ray batch: ray.batch_size, or for 0 (auto) the engine's own size.
    batch_size: Callable[[Config], int]
    # Batches one actor works on at once (the stage runs them on as many threads).
    concurrent_batches: Callable[[Config], int]
    # Whether a row's `prediction` is drafted from (drafters/prediction.py).
    drafts_from_predictions: Callable[[Config], bool]
    # Requests one engine runs at once (its slots): the concurrency the speculation rule reads.
    slots: Callable[[Config], int]
    # Drafters of the engine's library that keep its async scheduling on the config's actors:
    # further candidates of drafting.speculation auto (pipeline/engines/speculation.py).
    async_drafters: Callable[[Config], tuple[str, ...]]
    # Whose speculation RULES apply to the config's actors (pipeline/engines/speculation.py): "cpu",
    # "gpu" (vLLM 0.32's GPU path: ours on the host, synchronous) or "gpu_v2" (vLLM 0.34: every
    # method on the device, asynchronous).
    platform: Callable[[Config], str] = lambda config: "gpu" if config.ray.num_gpus_per_actor > 0 else "cpu"


class EngineFailed(RuntimeError):
    """The engine itself failed, not one request (an error out of its step, a worker process gone):
    every request it held is lost with it. The stage closes it, builds a new one and runs the
    batches again (pipeline/llm/stage.py)."""


class EngineHung(EngineFailed):
    """A step that made no progress for engine.hang_timeout_s: its thread cannot be stopped, so the
    stage ends the actor's process and Ray starts it again."""


# sampling_params keys every engine runs (pipeline/llm/sampling_params.py reads them). Any other key is
# the engine's own (EngineSampling), given to it as it is.
SAMPLING_KEYS = ("max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "n")


@dataclass(frozen=True)
class EngineSampling:
    """What an engine declares of sampling_params: the keys it runs beyond SAMPLING_KEYS (`runs`
    says them in words), and the ones it knows but refuses, each with why."""

    engine: str
    keys: frozenset = frozenset()
    runs: str = ", ".join(SAMPLING_KEYS)
    refused: Mapping[str, str] = field(default_factory=dict)

    def check(self, key: str, name: str) -> None:
        if key in self.refused:
            raise RequestError(f"{name}: sampling_params.{key} is not run here: {self.refused[key]}")
        if key not in self.keys:
            raise RequestError(
                f"{name}: sampling_params.{key} is not a setting the {self.engine} engine runs (it runs {self.runs})"
            )


@dataclass(frozen=True)
class Request:
    request_id: str
    prompt_ids: list[int]
    max_new_tokens: int
    _: KW_ONLY  # the rest by name
    stop: tuple[str, ...] = ()
    sampling: SamplingParams = GREEDY
    # vLLM's StructuredOutputsParams fields ({"json": schema}, {"regex": ...}, ...): output held to
    # them (an engine that declares structured_outputs; vLLM cuts drafts that leave the grammar).
    structured_outputs: Mapping[str, Any] | None = field(default=None, hash=False)
    # The engine's own other sampling keys (EngineSampling: vLLM's penalties, stop_token_ids,
    # min_tokens, ...), given to it as they are.
    engine_sampling: Mapping[str, Any] | None = field(default=None, hash=False)
    # A LoRA adapter's directory to run the request with (ray.data.llm's per-row `model`): vLLM
    # engine started with enable_lora only; vLLM refuses the request otherwise.
    adapter: str | None = None
    # Token ids of the text the answer is expected to resemble (the row's `prediction`): the vLLM
    # engine's proposer drafts from it first (drafters/prediction.py); it never changes the text.
    prediction: tuple[int, ...] = ()


@dataclass
class Result:
    request_id: str
    token_ids: list[int]  # generated tokens only, EOS included when it ended the request
    text: str  # decoded generated text, cut before a stop string
    finish_reason: str  # one of FINISH_REASONS
    stats: RequestStats
    engine_metrics: dict | None = None  # the engine's own per-request record (vLLM's RequestStateStats), if any
    # Asked for with vLLM's logprobs / prompt_logprobs: per position {token id: {"logprob", "rank",
    # "decoded_token"}} (the prompt's first position None), as ray.data.llm's rows hold them.
    logprobs: list | None = None
    prompt_logprobs: list | None = None
    params: str | None = None  # the engine's own settings of the request, as it prints them (vLLM's SamplingParams)


@dataclass(frozen=True)
class Failed:
    """A request that could not be generated; the message names it and the cause."""

    request_id: str
    message: str


@dataclass(frozen=True)
class EngineSteps:
    """What one engine's steps did since it started, for the run's occupancy.

    Steps *while input remained* are those followed by another admission of requests; the steps
    since the last admission are the drain, which is the final one once the input is exhausted."""

    slots: int = 0  # requests the engine runs at once (vLLM's max_num_seqs)
    steps: int = 0  # steps while input remained
    running: int = 0  # the running requests of those steps, summed
    idle_seconds: float = 0.0  # waited with no request to run, while input remained
    drain_steps: int = 0  # steps since the last admission
    drain_running: int = 0
    drain_seconds: float = 0.0  # from the last admission to the last request's end
    # What the draft budget measured a step to cost: (a, b), a step feeding n tokens taking a + b n
    # seconds (StepCostFit); None where no budget measured one.
    step_cost: tuple[float, float] | None = None


def engine_summary(engines: Sequence[EngineSteps]) -> dict:
    """The run's engine columns over its engines (one per actor): occupancy is the mean running
    requests per step over the slots, across every engine's steps while input remained."""
    slot_steps = sum(e.slots * e.steps for e in engines)
    return {
        "engine_occupancy": round(sum(e.running for e in engines) / slot_steps, 4) if slot_steps else None,
        "engine_steps": sum(e.steps + e.drain_steps for e in engines) if engines else None,
        "engine_idle_seconds": round(sum(e.idle_seconds for e in engines), 3) if engines else None,
        "engine_drain_seconds": round(sum(e.drain_seconds for e in engines), 3) if engines else None,
        "engine_step_cost": step_cost([e.step_cost for e in engines if e.step_cost is not None]),
    }


def step_cost(fits: list[tuple[float, float]]) -> dict | None:
    """The engines' measured step costs, averaged: a step's seconds whatever it feeds, the seconds
    per token it feeds, and their ratio (what a verified draft token costs, in steps)."""
    if not fits:
        return None
    a, b = (sum(values) / len(fits) for values in zip(*fits))
    return {"seconds": round(a, 5), "seconds_per_fed_token": round(b, 6), "fed_token_share": round(b / a, 4)}


class Engine(Protocol):
    # "vllm" or "transformers": the `engine` column of every row it generates.
    name: str
    # The tokenizer the engine's model was trained with: the stage encodes prompts with it.
    tokenizer: object
    # The sampling_params keys it runs beyond SAMPLING_KEYS, and those it refuses.
    sampling: EngineSampling

    def columns(self) -> dict:
        """The settings that actually run (drafter, k, w, verify, ...), one output column each."""
        ...

    def generate(self, requests: Sequence[Request]) -> list[Result | Failed]:
        """One result per request, in the order given; a request that fails does so alone. The
        stage calls it from as many threads at once as pipeline/engines/build.concurrent_batches says
        (one for an engine that cannot take more)."""
        ...

    def steps(self) -> EngineSteps | None:
        """Its step accounting so far; None where the engine does not keep one."""
        ...

    def close(self) -> None:
        """Gives back what it holds (a KV cache, worker processes, threads)."""
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
        raise RequestError(
            f"request {request.request_id!r}: the prompt has {prompt} tokens; the model allows "
            f"{max_positions} in all, leaving no room to generate"
        )
    return min(request.max_new_tokens, max_positions - prompt)


def cut_at_stop(text: str, stop: tuple[str, ...], keep_stop: bool = False) -> str:
    """The text before the first stop string in it (with it, if `keep_stop`; all of it when none occurs)."""
    cuts = [(text.index(s), -len(s)) for s in stop if s in text]
    if not cuts:
        return text
    start, minus_length = min(cuts)
    return text[: start - minus_length if keep_stop else start]
