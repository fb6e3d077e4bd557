"""One request's life in the transformers engine, the same in the single-request and the batched
decoder: start (budget, random state, context, statistics, adaptive controller), each step's
accepted verdict (statistics, EOS, stop strings, budget, adaptive scoring), and the final result.

The decoders own the model calls; everything a request decides about itself is here, once:
- the *budget*: the tokens it may generate (engines/base.budget);
- *EOS*: emitted tokens are cut after the first end-of-sequence token;
- *stop strings*: the fewest tokens whose text contains one (`stop_cut`), checked on a tail;
- *adaptive scoring*: every proposal is judged against the tokens that followed (judge_proposals);
- the *result*: generated tokens, their text cut before a stop string, the finish reason, stats.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from drafters.adaptive import (
    AcceptanceEstimate,
    AdaptiveController,
    RowKind,
    judge_proposals,
)
from drafters.base import DraftContext, Drafts
from drafters.budget import StepCostFit
from pipeline.engines.base import Request, Result, budget, cut_at_stop
from pipeline.engines.transformers.verification import Verdict
from drafters.primitives.sampling import RandomState
from pipeline.engines.stats import RequestStats

# A stop string of n characters spans at most n tokens that decode to text; a few more cover
# tokens that decode to nothing alone (special tokens, the first bytes of a character).
STOP_MARGIN_TOKENS = 4


@dataclass(frozen=True)
class DecodingRules:
    """What every request of one decoder is decoded by."""

    tokenizer: object  # decodes text for stop strings and results (None: token ids only)
    eos_ids: frozenset[int]
    max_positions: int | None  # the model's context length, when it has one
    k: int  # draft rows per step, at most
    w: int  # tokens per draft row, at most (0: plain decoding)
    ngram_max_q: int  # longest n-gram the context index keeps
    # The decoder's step cost, learned from its calls: with it, each step's shape is chosen (drafters/adaptive.py).
    costs: StepCostFit | None = None
    # What earlier requests accepted, per row kind: a new request's prior (shared, it grows).
    acceptance_pool: dict[RowKind, AcceptanceEstimate] = field(default_factory=dict, compare=False)


@dataclass
class RequestState:
    request: Request
    rules: DecodingRules
    budget: int  # tokens it may generate
    context: DraftContext  # prompt and generated tokens, indexed for drafting
    random: RandomState | None  # sampling only
    stats: RequestStats
    controller: AdaptiveController | None
    started: float
    generated: list[int] = field(default_factory=list)
    pending: list[tuple[int, Drafts]] = field(default_factory=list)  # proposals to judge (adaptive)
    finish_reason: str | None = None

    @classmethod
    def start(cls, request: Request, rules: DecodingRules) -> RequestState:
        """Raises RequestError (naming the request) when it cannot be generated."""
        budget_ = budget(request, rules.max_positions)
        sampling = request.sampling
        random = None if sampling.greedy else RandomState(sampling.seed, budget_)
        stats = RequestStats(
            num_input_tokens=len(request.prompt_ids),
            accepted_length_histogram=[0] * (rules.w + 1),
            accepted_rank_histogram=[0] * rules.k,
        )
        controller = AdaptiveController(rules.costs, rules.acceptance_pool) if rules.costs is not None else None
        state = cls(
            request,
            rules,
            budget_,
            DraftContext(request.prompt_ids, rules.ngram_max_q, sampling, random),
            random,
            stats,
            controller,
            time.perf_counter(),
        )
        if budget_ <= 0:
            state.finish_reason = "length"
        return state

    def draft_w(self) -> int:
        """The longest draft worth proposing: a step emits at most w + 1 tokens, within the budget."""
        return min(self.rules.w, self.budget - len(self.generated) - 1)

    def uniforms(self, w: int):
        """[w+1] the position uniforms of the tokens a step with w-token drafts may emit (None: greedy)."""
        if self.random is None:
            return None
        position = len(self.generated)
        return self.random.position_uniforms[position : position + w + 1]

    def proposed(self, drafts: Drafts) -> None:
        """Keeps a proposal (all its rows, verified or not) to be judged once its tokens are known."""
        if self.controller is not None and drafts.tokens.shape[1] > 0:
            self.pending.append((len(self.generated), drafts))

    def accept(
        self,
        verdict: Verdict,
        drafts: Drafts,
        num_fed_tokens: int,
        draft_seconds: float,
        verify_seconds: float,
        share: float = 1.0,
    ) -> None:
        """Records a verified step (`drafts`: the rows verified; `share` of a forward call) and
        emits its tokens; sets finish_reason when the request is done."""
        self.stats.observe(drafts, verdict, num_fed_tokens, draft_seconds, verify_seconds, share)
        emitted, finish = cut_at_eos(verdict.tokens, self.rules.eos_ids)
        self.generated += emitted
        self.context.append(emitted)
        if self.controller is not None:
            self.pending = judge_proposals(self.controller, self.pending, self.generated)
        cut = stop_cut(self.rules.tokenizer, self.generated, len(self.generated) - len(emitted), self.request.stop)
        if cut is not None:
            self.generated, finish = self.generated[:cut], "stop"
        if finish is None and len(self.generated) >= self.budget:
            finish = "length"
        self.finish_reason = finish

    def result(self) -> Result:
        stats = self.stats
        stats.num_generated_tokens = len(self.generated)
        stats.finish_reason = self.finish_reason
        stats.time_taken_llm = time.perf_counter() - self.started
        tokenizer = self.rules.tokenizer
        text = tokenizer.decode(self.generated, skip_special_tokens=True) if tokenizer is not None else ""
        return Result(
            self.request.request_id,
            self.generated,
            cut_at_stop(text, self.request.stop),
            self.finish_reason,
            stats,
            params=settings_print(self.request),
        )


def settings_print(request: Request) -> str:
    """The request's settings as the `params` column prints them (in vLLM's form)."""
    sampling = request.sampling
    return (
        f"SamplingParams(max_tokens={request.max_new_tokens}, temperature={sampling.temperature}, "
        f"top_p={sampling.top_p}, top_k={sampling.top_k}, seed={sampling.seed}, stop={list(request.stop)})"
    )


def cut_at_eos(tokens: list[int], eos_ids: frozenset[int]) -> tuple[list[int], str | None]:
    for i, token in enumerate(tokens):
        if token in eos_ids:
            return tokens[: i + 1], "eos"
    return tokens, None


def stop_cut(tokenizer, generated: list[int], checked: int, stop: tuple[str, ...]) -> int | None:
    """Fewest tokens whose text contains a stop string, if one ended among generated[checked:]
    (none ended earlier: it would have been cut then). Only a tail is decoded, long enough to
    hold any stop string that ends among the new tokens, so checking stays linear in length."""
    if not stop:
        return None
    start = max(0, checked - max(map(len, stop)) - STOP_MARGIN_TOKENS)

    def stopped(end: int) -> bool:
        text = tokenizer.decode(generated[start:end], skip_special_tokens=True)
        return any(s in text for s in stop)

    if not stopped(len(generated)):
        return None
    return next(length for length in range(checked + 1, len(generated) + 1) if stopped(length))
