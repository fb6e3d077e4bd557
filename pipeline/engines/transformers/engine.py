"""The transformers engine: our own speculative decoder over a Hugging Face model.

The only engine with k > 1 drafts, tree verification, draft models (and the self-draft) and
lenience, its own section of the config (`transformers:`, settings.py); with
transformers.max_batch_requests > 1 it batches requests in throughput mode.
"""

from __future__ import annotations

from collections.abc import Sequence

from drafters.budget import StepCostFit
from pipeline.loading.drafters import DrafterTables, load_draft_model, make_drafter
from pipeline.config import Config
from pipeline.engines.base import EngineSampling, Failed, Request, Result
from pipeline.engines.errors import RequestError
from pipeline.engines.transformers.attention import use_gqa_attention
from pipeline.engines.transformers.batched_decoder import BatchedDecoder
from pipeline.engines.transformers.speculative_decoder import SpeculativeDecoder, Verifying
from pipeline.loading.model import LoadedModel


def build_decoder(config: Config, loaded: LoadedModel, tables: DrafterTables) -> SpeculativeDecoder:
    """The decoder `config` describes (its decoder and transformers sections): its drafter over
    `tables`, the draft model if it has one, and with k or w auto a step cost it learns from its
    own calls (drafters/budget.py)."""
    decoder, own = config.drafting, config.transformers
    tokenizer = loaded.tokenizer
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    use_gqa_attention(loaded.model)
    draft_model = None
    if decoder.drafter == "draft_model" and decoder.w > 0:
        draft_model = load_draft_model(own, config.model, loaded)
        use_gqa_attention(draft_model)
    drafter = make_drafter(decoder, tables, pad, draft_model, len(tokenizer))
    costs = StepCostFit() if own.auto_k or decoder.auto_w else None
    verifying = Verifying(decoder.ngram.max_q, own.lenience, own.verify, own.auto_k, decoder.auto_w)
    return SpeculativeDecoder(loaded.model, tokenizer, drafter, own.k, decoder.w, verifying, costs)


class TransformersEngine:
    name = "transformers"
    sampling = EngineSampling("transformers")  # the common keys alone: no structured outputs, no penalties

    def __init__(self, config: Config, loaded: LoadedModel, tables: DrafterTables):
        self.config = config
        self.tokenizer = loaded.tokenizer
        self.decoder = build_decoder(config, loaded, tables)
        own = config.transformers
        # Throughput mode (transformers.max_batch_requests > 1): the requests share forward calls.
        self.batched = None
        if own.max_batch_requests > 1:
            self.batched = BatchedDecoder(self.decoder, own.max_batch_requests, own.max_batch_tokens)

    def columns(self) -> dict:
        decoder, own = self.config.drafting, self.config.transformers
        return {
            "engine": self.name,
            "drafter": decoder.drafter,
            "k": self.decoder.k,
            "w": self.decoder.w,
            "auto_k": own.auto_k,
            "auto_w": decoder.auto_w,
            "lenience": own.lenience,
            "verify": self.verify_mode(),
        }

    def verify_mode(self) -> str:
        """The mode that runs: throughput mode merges each request's rows into a tree (for one row
        of drafts, a tree and a batch are the same call)."""
        own = self.config.transformers
        if self.batched is not None and (own.k > 1 or own.auto_k):
            return "tree"
        return own.verify

    def steps(self) -> None:
        """The transformers engine keeps no step accounting (its throughput mode drains each batch)."""
        return None

    def close(self) -> None:
        """Its model and caches go with it; a KV cache lives only while its requests run."""
        self.decoder = self.batched = None

    def generate(self, requests: Sequence[Request]) -> list[Result | Failed]:
        # Results come back as requests finish; ids may repeat, so they are matched by object.
        index_of = {id(request): index for index, request in enumerate(requests)}
        results: list[Result | Failed | None] = [None] * len(requests)
        runnable = []
        for request in requests:
            if request.adapter is not None:
                results[index_of[id(request)]] = Failed(
                    request.request_id,
                    f"request {request.request_id!r}: LoRA adapters (model {request.adapter!r}) run on the vLLM engine",
                )
            else:
                runnable.append(request)
        if self.batched is None:
            finished = ((request, self.generate_one(request)) for request in runnable)
        else:
            finished = self.batched.generate_many(runnable) if runnable else ()
        for request, result in finished:
            results[index_of[id(request)]] = result
        return results

    def generate_one(self, request: Request) -> Result | Failed:
        try:
            return self.decoder.generate(
                request.prompt_ids, request.max_new_tokens, request.stop, request.request_id, request.sampling
            )
        except RequestError as error:
            return Failed(request.request_id, str(error))
