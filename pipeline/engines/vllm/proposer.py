"""Our drafters as vLLM's proposer: vLLM loads `NgrammysProposer` by name and asks it, every
engine step, for one draft per running request (`speculative_config={"method": "custom_class",
"model": "pipeline.engines.vllm.proposer.NgrammysProposer", "num_speculative_tokens": w}`).

vLLM builds the class with its VllmConfig only; the engine then hands it the drafter, the model
runner (to read request ids) and the settings through `configure` (`attach_drafter`, called on
the worker with `LLM.collective_rpc`). Until then it proposes nothing.

Per request it keeps the context's n-gram index (grown by the tokens each step emitted, never
rebuilt), the acceptance rate of each strategy (learned by judging every proposed draft against
the tokens the request went on to emit, as drafters/adaptive.py does), and the drafts it
proposed, which the engine reads back after generation for the per-request statistics.

With `w: auto` the draft length is chosen per request and per step: a step's cost is learned
online from the engine's own steps (drafters/budget.py StepCostFit), and the batch's draft tokens go, one at a time,
to the request whose next token is most likely accepted, while that raises the batch's expected
tokens per second. How likely: where the drafter gives its own confidence (the suffix drafter's
acceptance model, calibrated online on what requests emit), that; otherwise the first token as
often as the request's drafts of that strategy have been right, each later one as often as the
strategy's verified drafts held at that depth (all requests of the actor). A token fed costs at least `prior_slope` of a step, so a
noisy cost fit never makes drafts free. A request whose drafts fail stops drafting.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from drafters.adaptive import (
    AcceptanceEstimate,
    AdaptiveController,
    RowKind,
    judge_proposals,
)
from drafters.base import PADDING, DraftContext, Drafter, Drafts, common_prefix
from drafters import budget
from drafters.budget import StepCostFit, cost_table

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Proposal:
    """A draft this proposer gave vLLM for one request: the first generated position it guesses."""
    position: int  # generated tokens before the draft
    tokens: tuple[int, ...]
    strategy: str


@dataclass
class Tracked:
    """What the proposer knows of one running request."""
    context: DraftContext | None  # prompt + generated tokens so far, with its n-gram index (None: a batched drafter's)
    prompt_length: int
    limit: int  # the most tokens (prompt + generated) it may reach: a draft never goes past it
    controller: AdaptiveController | None  # acceptance rates per strategy (costs unused here; None: batched)
    steps: int = 0  # engine steps that emitted tokens for it (the prefill's included)
    failed_steps: int = 0  # steps whose drafting failed for it (it went on without a draft)
    draft_seconds: float = 0.0
    proposals: list[Proposal] = field(default_factory=list)  # drafts vLLM verified or will
    pending: list[tuple[int, Drafts]] = field(default_factory=list)  # full candidates to judge
    last_draft: tuple[int, tuple[int, ...], str] | None = None  # (context length, tokens, strategy) verified last

    def settle(self, depths: dict[str, "DepthAcceptance"]) -> None:
        """Scores the last verified draft against the tokens the context now has after it."""
        if self.last_draft is None:
            return
        start, tokens, strategy = self.last_draft
        accepted = common_prefix(tokens, self.context.tokens[start:start + len(tokens)])
        depths.setdefault(strategy, DepthAcceptance()).observe(len(tokens), accepted)
        self.last_draft = None

    def gains(self, strategy: str, length: int, confidence: tuple[float, ...] | None,
              depths: dict[str, "DepthAcceptance"]) -> list[float]:
        """Probabilities that the candidate's first 1, 2, ... tokens are all accepted: the
        drafter's own where it gives them; else the first from this request's acceptance of the
        strategy, the later ones from how deep the strategy's verified drafts held (all requests)."""
        if confidence:
            return list(confidence[:length])
        first = self.controller.alpha((strategy, 0))
        return depths.get(strategy, DepthAcceptance()).gains(first, length)


class DepthAcceptance:
    """How far one strategy's verified drafts held: of the drafts whose first j tokens were
    accepted and that had a (j+1)-th, how many had it accepted (per depth j >= 1)."""

    def __init__(self, prior: float = 0.5, prior_weight: float = 2.0):
        self.prior, self.prior_weight = prior, prior_weight
        self.reached: list[float] = []
        self.passed: list[float] = []

    def observe(self, length: int, accepted: int) -> None:
        for depth in range(1, min(accepted + 1, length)):
            while len(self.reached) <= depth:
                self.reached.append(0.0)
                self.passed.append(0.0)
            self.reached[depth] += 1
            self.passed[depth] += depth < accepted

    def gains(self, first: float, length: int) -> list[float]:
        """P(first j+1 tokens accepted) for j < length, the first token's probability given."""
        gains, probability = [], first
        for depth in range(length):
            if depth:
                seen = depth < len(self.reached)
                passed, reached = (self.passed[depth], self.reached[depth]) if seen else (0.0, 0.0)
                probability *= (passed + self.prior_weight * self.prior) / (reached + self.prior_weight)
            gains.append(probability)
        return gains


def allocate(gains: list[list[float]], cost) -> list[int]:
    """Draft tokens per request for one step (drafters/budget.py `allocate`): gains[r][j] the
    probability that request r's first j + 1 draft tokens are all accepted; `cost` a step cost."""
    lengths = np.array([len(row) for row in gains], dtype=np.int64)
    width = max(1, int(lengths.max(initial=0)))
    table = np.zeros((len(gains), width))
    for r, row in enumerate(gains):
        table[r, :len(row)] = row
    taken = np.zeros(len(gains), dtype=np.int64)
    budget.allocate(table, lengths, cost_table(cost, len(gains), width), taken)
    return taken.tolist()


class NgrammysProposer:
    def __init__(self, vllm_config):
        spec = vllm_config.speculative_config
        self.max_w = spec.num_speculative_tokens
        self.max_model_len = vllm_config.model_config.max_model_len
        self.drafter: Drafter | None = None
        self.w = 0
        self.runner = None
        self.adaptive = False
        self.draft_sampled = True  # False: no request drafts in a step with a sampled (temperature > 0) request
        self.max_q = 1
        self.tracked: dict[str, Tracked] = {}
        self.pool: dict[RowKind, AcceptanceEstimate] = {}  # finished requests' evidence: new requests' prior
        self.depths: dict[str, DepthAcceptance] = {}  # per strategy, how deep verified drafts held
        self.costs = StepCostFit()
        self.last_step: tuple[float, int] | None = None  # (when the last proposal ended, tokens it had fed)
        self.vocab_size = vllm_config.model_config.get_vocab_size()
        self.reported: set[str] = set()  # drafting errors already logged (each kind once)

    def configure(self, runner, drafter: Drafter | None, w: int, max_q: int, adaptive: bool,
                  draft_sampled: bool = True) -> None:
        """Drafts of at most w tokens (w <= vLLM's num_speculative_tokens) from `drafter`. With
        `draft_sampled` False (the engine's rejection sampler is not exact for sampled requests, and
        in a step with one it scales every draft position wrongly, greedy ones too) no request
        drafts in a step that runs a sampled request."""
        assert w <= self.max_w, f"vLLM was started for drafts of up to {self.max_w} tokens, not {w}"
        self.runner, self.drafter, self.w, self.max_q, self.adaptive = runner, drafter, w, max_q, adaptive
        self.draft_sampled = draft_sampled
        # A new drafter starts from nothing: no acceptance evidence, no cost fit of another's steps.
        self.tracked, self.pool, self.depths, self.costs, self.last_step = {}, {}, {}, StepCostFit(), None

    def load_model(self, *args, **kwargs) -> None:
        """vLLM calls this on every proposer; drafting from tables and contexts loads nothing."""

    @torch.no_grad()
    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray, token_ids_cpu: np.ndarray,
                slot_mappings=None) -> list[list[int]]:
        # sampled_token_ids: [B] the tokens each running request emitted this step (empty: still in
        # prefill); num_tokens_no_spec: [>=B] its tokens so far; token_ids_cpu: [>=B, max_model_len]
        started = time.perf_counter()
        if self.drafter is None:
            return [[] for _ in sampled_token_ids]
        if hasattr(self.drafter, "step"):  # a batched drafter: one call for every request
            return self.propose_batch(started, sampled_token_ids, num_tokens_no_spec, token_ids_cpu)
        request_ids = self.runner.input_batch.req_ids
        paused = self.paused()
        fresh = False  # whether the step that just ran did prefill work (then its time is not a decoding step's)
        rows, candidates = [], []
        for row, sampled in enumerate(sampled_token_ids):
            if not sampled:
                fresh = True  # a prefill chunk ran in this step
                continue
            tracked, new = self.track(request_ids[row], token_ids_cpu[row], int(num_tokens_no_spec[row]), len(sampled))
            fresh |= new  # its prefill ran in this step; so does every request of a new LLM.generate call
            if not paused:
                rows.append(row)
                candidates.append((tracked, self.safe_candidate(request_ids[row], tracked)))
        self.observe_step(started, measurable=not fresh)
        lengths = self.choose_lengths(candidates)
        drafts = [[] for _ in sampled_token_ids]
        for row, (tracked, (strategy, tokens, confidence)), length in zip(rows, candidates, lengths):
            if length:
                drafts[row] = list(tokens[:length])
                tracked.proposals.append(Proposal(len(tracked.context) - tracked.prompt_length, tokens[:length], strategy))
                tracked.last_draft = (len(tracked.context), tokens[:length], strategy)
        elapsed = time.perf_counter() - started
        for tracked, _ in candidates:
            tracked.draft_seconds += elapsed / len(candidates)
        self.last_step = (time.perf_counter(), len(sampled_token_ids) + sum(map(len, drafts)))
        return drafts

    def propose_batch(self, started: float, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray,
                      token_ids_cpu: np.ndarray) -> list[list[int]]:
        """Every decoding request's draft from one call of a batched drafter (drafters/batch_suffix.py),
        which reads their tokens from vLLM's own token array. With `w: auto` the drafts are cut to the
        step budget of the step costs measured so far (drafters/budget.py)."""
        batch = self.runner.input_batch
        request_ids = batch.req_ids
        rows = [row for row, sampled in enumerate(sampled_token_ids) if sampled]
        fresh = len(rows) < len(sampled_token_ids)  # a prefill chunk ran in this step
        keys = [request_ids[row] for row in rows]
        tracked = []
        for key, row in zip(keys, rows):
            fresh |= key not in self.tracked
            tracked.append(self.track_light(key, int(batch.num_prompt_tokens[row])))
        self.forget_absent(batch.req_id_to_index)
        self.observe_step(started, measurable=not fresh)
        drafts = [[] for _ in sampled_token_ids]
        if not rows or self.paused():
            return drafts
        rows_array = np.array(rows, dtype=np.int64)
        lengths = np.asarray(num_tokens_no_spec[:len(sampled_token_ids)], dtype=np.int64)[rows_array]
        prompts = np.array([t.prompt_length for t in tracked], dtype=np.int64)
        limits = np.array([t.limit for t in tracked], dtype=np.int64)
        budget = cost_table(self.costs.cost(), len(rows), self.w) if self.adaptive else None
        try:
            out = self.drafter.step(keys, token_ids_cpu, rows_array, lengths, prompts, limits, budget)
        except Exception as error:  # noqa: BLE001 - the engine must survive its drafter
            for t in tracked:
                t.failed_steps += 1
            self.report_failure(keys[0], error)
            return drafts
        strategies = self.drafter.strategies
        for i, (row, t) in enumerate(zip(rows, tracked)):
            length = int(out.lengths[i])
            if length:
                tokens = tuple(out.tokens[i, :length].tolist())
                drafts[row] = list(tokens)
                t.proposals.append(Proposal(int(lengths[i]) - t.prompt_length, tokens, strategies[out.sources[i]]))
        elapsed = time.perf_counter() - started
        for t in tracked:
            t.draft_seconds += elapsed / len(tracked)
        self.last_step = (time.perf_counter(), len(sampled_token_ids) + sum(map(len, drafts)))
        return drafts

    def paused(self) -> bool:
        """Whether no request drafts this step: a sampled request runs, and sampled drafts are not verified exactly."""
        return not self.draft_sampled and bool(self.runner.input_batch.random_reqs)

    def track_light(self, request_id: str, prompt_length: int) -> "Tracked":
        """What the batched path keeps of a request: its steps, limit and proposals (its tokens are
        vLLM's and the drafter's)."""
        tracked = self.tracked.get(request_id)
        if tracked is None:
            params = self.runner.requests[request_id].sampling_params
            limit = min(self.max_model_len, prompt_length + (params.max_tokens or self.max_model_len))
            tracked = self.tracked[request_id] = Tracked(None, prompt_length, limit, None)
        tracked.steps += 1
        return tracked

    def forget_absent(self, present: dict) -> None:
        """Requests that left the engine's batch (finished, aborted or preempted) free their drafter
        slot; a preempted one takes a fresh slot when it comes back."""
        for request_id in self.tracked.keys() - present.keys():
            self.drafter.finish(request_id)

    def report_failure(self, request_id: str, error: Exception) -> None:
        kind = f"{type(error).__name__}: {error}"
        if kind not in self.reported:
            self.reported.add(kind)
            logger.error("drafting failed for request %s (it goes on without drafts; other requests with the "
                         "same failure are not logged again): %s", request_id, kind, exc_info=error)

    def observe_step(self, now: float, measurable: bool) -> None:
        """Feeds the step that ran since the last proposal to the cost model, if it was a pure
        decoding step: no prefill in it, and no time between LLM.generate calls (whose first step
        always prefills its new requests), which would count the caller's own pauses as a step."""
        if self.last_step is not None and measurable:
            ended, fed = self.last_step
            self.costs.observe(fed, now - ended)

    def track(self, request_id: str, tokens: np.ndarray, length: int, emitted: int) -> tuple[Tracked, bool]:
        """The request's state, brought up to its `length` tokens (tokens: [max_model_len])."""
        tracked = self.tracked.get(request_id)
        new = tracked is None or len(tracked.context) > length
        if new:  # first seen (or its tokens were rewound): start from its tokens
            prompt_length = length - emitted
            params = self.runner.requests[request_id].sampling_params
            limit = min(self.max_model_len, prompt_length + (params.max_tokens or self.max_model_len))
            controller = AdaptiveController(None, self.pool)
            tracked = Tracked(DraftContext(tokens[:length].tolist(), self.max_q), prompt_length, limit, controller)
            self.tracked[request_id] = tracked
        else:
            tracked.context.append(tokens[len(tracked.context):length].tolist())
            tracked.pending = judge_proposals(tracked.controller, tracked.pending, tracked.context.tokens)
            tracked.settle(self.depths)
        tracked.steps += 1
        return tracked, new

    def safe_candidate(self, request_id: str, tracked: Tracked) -> tuple[str, tuple[int, ...], tuple[float, ...] | None]:
        """The request's candidate; a drafter that fails for it (raises, or gives something that is
        not a row of token ids) costs it this step's draft and nothing more: the engine and the
        other requests go on. The row counts the step; the log names each kind of failure once."""
        try:
            return self.candidate(tracked)
        except Exception as error:  # noqa: BLE001 - the drafter is any code; the engine must survive it
            tracked.failed_steps += 1
            self.report_failure(request_id, error)
            return PADDING, (), None

    def candidate(self, tracked: Tracked) -> tuple[str, tuple[int, ...], tuple[float, ...] | None]:
        """The drafter's row for the request (strategy, tokens, the drafter's confidence in them
        if it has one); no tokens when it has no guess."""
        w = min(self.w, tracked.limit - len(tracked.context) - 1)  # a step emits up to w + 1 tokens
        if w <= 0:
            return PADDING, (), None
        drafts = self.drafter.propose(tracked.context, 1, w)  # [1, w]
        check_drafts(drafts, w, self.vocab_size)
        if drafts.strategies[0] == PADDING:
            return PADDING, (), None
        length = w if drafts.lengths is None else drafts.lengths[0]  # a drafter may guess fewer than w
        confidence = None if drafts.confidence is None else drafts.confidence[0]
        if self.adaptive and not confidence:  # judged against what the request emits, whatever length is verified
            tracked.pending.append((len(tracked.context), Drafts(drafts.tokens[:1, :length], drafts.strategies[:1])))
        return drafts.strategies[0], tuple(drafts.tokens[0, :length].tolist()), confidence

    def choose_lengths(self, candidates: list[tuple[Tracked, tuple[str, tuple[int, ...], tuple[float, ...] | None]]]) -> list[int]:
        if not self.adaptive:
            return [len(tokens) for _, (_, tokens, _) in candidates]
        gains = [tracked.gains(strategy, len(tokens), confidence, self.depths)
                 for tracked, (strategy, tokens, confidence) in candidates]
        return allocate(gains, self.costs.cost())

    def take(self, outputs: dict[str, list[int]]) -> dict[str, Tracked]:
        """Hands over (and forgets) what it tracked of these finished requests, by the ids
        LLM.generate returned, with their generated tokens. Requests it never saw (no drafter, or
        finished in their prefill) are left out. A drafter that drafts from finished outputs
        (`learn`) is given each one's generated tokens here, all of them (its context lacks the
        last step's)."""
        internal = {external_request_id(key): key for key in self.tracked}
        learn = getattr(self.drafter, "learn", None)  # a drafter that drafts from finished outputs
        taken = {}
        for request_id, token_ids in outputs.items():
            tracked = self.tracked.pop(internal.get(request_id, ""), None)
            if tracked is not None:
                taken[request_id] = tracked
                if learn is not None:
                    learn(token_ids)
        return taken


def check_drafts(drafts, w: int, vocab_size: int) -> None:
    """Raises unless `drafts` is a Drafts whose first row is w token ids of the vocabulary."""
    if not isinstance(drafts, Drafts):
        raise TypeError(f"the drafter returned {type(drafts).__name__}, not Drafts")
    tokens = drafts.tokens
    if not isinstance(tokens, torch.Tensor) or tokens.dtype.is_floating_point or tokens.dim() != 2 or tokens.shape[0] < 1:
        raise TypeError(f"the drafter's tokens must be an integer tensor [k, w], got {getattr(tokens, 'dtype', type(tokens))} "
                        f"{tuple(getattr(tokens, 'shape', ()))}")
    if tokens.shape[1] > w:
        raise ValueError(f"the drafter drafted {tokens.shape[1]} tokens; at most {w} were asked for")
    row = tokens[0]
    if row.numel() and (int(row.min()) < 0 or int(row.max()) >= vocab_size) and drafts.strategies[0] != PADDING:
        raise ValueError(f"the drafter's tokens must be ids below the vocabulary's {vocab_size}, got {row.tolist()}")


def external_request_id(internal: str) -> str:
    """vLLM's engine names a request f"{its id in LLM.generate's outputs}-{8 random characters}"."""
    return internal[:-9]


# Called on the worker by LLM.collective_rpc, with the worker as first argument.

def attach_drafter(worker, drafter: Drafter | None, w: int, max_q: int, adaptive: bool,
                   draft_sampled: bool = True) -> None:
    runner = worker.model_runner
    runner.drafter.configure(runner, drafter, w, max_q, adaptive, draft_sampled)


def take_tracked(worker, outputs: dict[str, list[int]]) -> dict[str, Tracked]:
    return worker.model_runner.drafter.take(outputs)
