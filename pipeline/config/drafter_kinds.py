"""The names `drafting.drafter` takes and what each needs, known to the config (which validates
against them), to the drafter registry (which builds them: pipeline/loading/drafters.py) and to the
engines (each refuses, by these properties, the ones it cannot run) alike.

A new drafter is one module in drafters/, one entry here and one factory in the registry.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DrafterKind:
    tables: tuple[str, ...] = ()  # DrafterTables fields it drafts from, built once per model
    # Its drafts carry the draft model's probabilities, verified by speculative sampling (an engine
    # that verifies point drafts only refuses it).
    draft_probabilities: bool = False
    vllm_method: str = ""  # vLLM's own speculative_config method, for a method vLLM runs itself
    datastore: bool = False  # whether it drafts from drafting.datastore
    batched: bool = False  # a BatchDrafter itself (drafters/base.py); else drafters/per_request.py adapts it for vLLM


DRAFTER_KINDS: dict[str, DrafterKind] = {
    "none": DrafterKind(),  # plain decoding
    "context_ngram": DrafterKind(),
    "unigram": DrafterKind(("unigram",)),
    "bigram": DrafterKind(("chained",)),
    "extended_bigram": DrafterKind(("extended",)),
    "mixed": DrafterKind(("chained",)),
    "draft_model": DrafterKind(draft_probabilities=True),
    "rest": DrafterKind(datastore=True),
    # The suffix drafter: the request's context, other requests' outputs (in flight too) and
    # (drafting.datastore) earlier runs' outputs, scored by an acceptance model learned online, for
    # every request of a step in one compiled call, with a step budget under `w: auto` (drafters/suffix/).
    "batch_suffix": DrafterKind(datastore=True, batched=True),
    # vLLM's own learning-free methods, run by vLLM itself: n-gram prompt lookup and suffix
    # decoding (arctic-inference).
    "vllm_ngram": DrafterKind(vllm_method="ngram"),
    "vllm_suffix": DrafterKind(vllm_method="suffix"),
    # vLLM's n-gram lookup on the GPU (a Triton kernel over each request's tokens): the one method of
    # vLLM 0.32 that keeps async scheduling on; GPU actors only.
    "vllm_ngram_gpu": DrafterKind(vllm_method="ngram_gpu"),
}
DRAFTER_NAMES = tuple(DRAFTER_KINDS)
VLLM_METHODS = {name: kind.vllm_method for name, kind in DRAFTER_KINDS.items() if kind.vllm_method}
