"""A request's prediction, handed to our speculator: vLLM's V2 sampler hands every logits processor
each new request's SamplingParams (the speculator sees only its slot), so this processor, which
changes no logits, copies SamplingParams.extra_args[PREDICTION_KEY] to the drafter of its worker.
The speculator and the processor of one worker are built from the same RequestState: the drafter
is found by its token history's identity."""

from __future__ import annotations

import weakref

from pipeline.engines.vllm import compat
from pipeline.engines.vllm.v2.options import PREDICTION_KEY

# id of a runner's token history -> its speculator's DeviceDrafter (weak: an engine's drafter, and its
# device buffers, go with the engine, and a recycled id finds nothing)
_DRAFTERS: weakref.WeakValueDictionary[int, object] = weakref.WeakValueDictionary()


def attach(token_history, drafter) -> None:
    """The drafter that drafts from `token_history` (a RequestState's all_token_ids) takes its requests' predictions."""
    _DRAFTERS[id(token_history)] = drafter


def prediction_of(sampling_params) -> list[int] | None:
    tokens = (getattr(sampling_params, "extra_args", None) or {}).get(PREDICTION_KEY)
    if tokens is None:
        return None
    if not isinstance(tokens, (list, tuple)) or not all(isinstance(t, int) and t >= 0 for t in tokens):
        raise ValueError(
            f"SamplingParams.extra_args[{PREDICTION_KEY!r}] must be a list of token ids, got {tokens!r:.80}"
        )
    return list(tokens)


class PredictionProcessor(compat.logits_processor_base()):
    def __init__(self, vllm_config, req_states):
        self.key = id(req_states.all_token_ids)

    @classmethod
    def validate_params(cls, sampling_params) -> None:
        prediction_of(sampling_params)

    def add_request(self, req_idx: int, sampling_params) -> bool:
        tokens = prediction_of(sampling_params)
        drafter = _DRAFTERS.get(self.key)
        if tokens and drafter is not None:
            drafter.set_prediction(req_idx, tokens)  # staged: on the device at the speculator's next step
        return False  # no logits work

    def apply(self, logits, ctx):
        return logits
