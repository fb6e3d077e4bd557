"""Our drafters as vLLM's proposer: vLLM loads `NgrammysProposer` by name and asks it, every
engine step, for one draft per running request (`speculative_config={"method": "custom_class",
"model": "pipeline.engines.vllm.proposer.NgrammysProposer", "num_speculative_tokens": w}`).

vLLM builds the class with its VllmConfig only; the engine then hands it the drafter, the model
runner (to read request ids) and the settings through `configure` (`attach_drafter`, called on
the worker with `LLM.collective_rpc`). Until then it proposes nothing. It reaches vLLM through the
`custom_class` contract (its constructor, `load_model`, `propose`) and, for what that contract does
not hand it (the rows' request ids, prompt lengths and sampling settings), compat.py's reads of
the model runner.

The drafter is a BatchDrafter (made by `make_batch_drafter`): each
step, one call drafts for every decoding request, reading their tokens from vLLM's own token
array. A request starts with the drafter when the proposer first sees it, and finishes when it
ends (with its generated tokens) or vLLM lets it go (aborted); a request preempted or not
scheduled for a step stays started. Errors of the drafter's start, step or finish cost the
requests concerned their drafts, never the engine. With `w: auto` the drafter cuts its drafts to the step's budget:
what a
step costs by the tokens it feeds is learned online from the engine's own steps
(StepCostFit; a token fed costs at least `prior_slope` of a step, so a noisy
fit never makes drafts free). The proposer keeps, per request, the drafts it proposed, which the
engine reads back after generation for the per-request statistics.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from drafters.base import BatchDrafter, BatchDrafts
from drafters.budget import StepCostFit, cost_table
from drafters.prediction import Hold, HoldRates, PredictionDrafter, step_drafts
from pipeline.engines.vllm.v2.options import PREDICTION_KEY
from pipeline.engines.vllm.compat import (
    external_request_id,
    live_request_ids,
    model_runner,
    prompt_lengths,
    proposer_of,
    request_ids,
    request_params,
    runs_sampled,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Proposal:
    """A draft this proposer gave vLLM for one request: the first generated position it guesses."""

    position: int  # generated tokens before the draft
    tokens: tuple[int, ...]
    strategy: str


@dataclass
class Tracked:
    """What the proposer knows of one running request, for its statistics."""

    prompt_length: int
    limit: int  # the most tokens (prompt + generated) it may reach: a draft never goes past it
    steps: int = 0  # engine steps that emitted tokens for it (the prefill's included)
    failed_steps: int = 0  # steps whose drafting failed for it (it went on without a draft)
    draft_seconds: float = 0.0
    proposals: list[Proposal] = field(default_factory=list)  # drafts vLLM verified or will
    prediction: PredictionDrafter | None = None  # the request's prediction, drafted from first
    hold: Hold = field(default_factory=Hold)  # how its prediction drafts fared
    judged: int = 0  # its proposals judged for `hold` so far


PREDICTION = "prediction"  # the strategy of a draft taken from the request's prediction
NO_CONFIDENCE = np.zeros(0)  # the confidence of no draft


class NgrammysProposer:
    """vLLM's `custom_class` proposer: one draft per running request at every engine step.

    Built by vLLM from its VllmConfig; drafts nothing until `configure` hands it a BatchDrafter.
    In: each step's emitted tokens and vLLM's token array (`propose`). Out: the drafts, and per
    request what it proposed (`take`, read back for the per-request statistics).
    """

    def __init__(self, vllm_config):
        spec = vllm_config.speculative_config
        self.num_speculative_tokens = spec.num_speculative_tokens
        self.max_model_len = vllm_config.model_config.max_model_len
        self.drafter: BatchDrafter | None = None
        self.w = 0
        self.prediction_w = 0  # the longest draft from a request's prediction
        self.holds = HoldRates()
        self.runner = None
        self.adaptive = False
        self.draft_sampled = True  # False: no request drafts in a step with a sampled (temperature > 0) request
        self.tracked: dict[str, Tracked] = {}
        self.started: set[str] = set()  # requests the drafter has started and not finished
        self.costs = StepCostFit()
        self.last_step: tuple[float, int] | None = None  # (when the last proposal ended, tokens it had fed)
        self.reported: set[str] = set()  # drafting errors already logged (each kind once)

    def configure(
        self,
        runner,
        drafter: BatchDrafter | None,
        w: int,
        adaptive: bool,
        draft_sampled: bool = True,
        prediction_w: int = 0,
    ) -> None:
        """Drafts of at most w tokens (w <= vLLM's num_speculative_tokens) from `drafter`, and of
        at most prediction_w (or w, if more) from a request's prediction, cut to the step's budget if
        `adaptive`. With `draft_sampled` False (the engine's rejection sampler
        is not exact for sampled requests, and in a step with one it scales every draft position
        wrongly, greedy ones too) no request drafts in a step that runs a sampled request."""
        assert max(w, prediction_w) <= self.num_speculative_tokens, (
            f"vLLM was started for drafts of up to {self.num_speculative_tokens} tokens, not {max(w, prediction_w)}"
        )
        self.runner = runner
        self.drafter = drafter
        self.w = w
        self.adaptive = adaptive
        self.prediction_w = max(w, prediction_w)
        self.draft_sampled = draft_sampled
        # A new drafter starts from nothing: no requests, no cost fit of another's steps.
        self.tracked = {}
        self.started = set()
        self.costs = StepCostFit()
        self.last_step = None
        self.holds = HoldRates()

    def load_model(self, *args, **kwargs) -> None:
        """vLLM calls this on every proposer; drafting from tables and contexts loads nothing."""

    @torch.no_grad()
    def propose(
        self,
        sampled_token_ids: list[list[int]],
        num_tokens_no_spec: np.ndarray,
        token_ids_cpu: np.ndarray,
        slot_mappings=None,
    ) -> list[list[int]]:
        """One step's drafts, one per running request, as vLLM's proposer contract asks.

        sampled_token_ids: [B] the tokens each running request emitted this step (empty: still in
        prefill); num_tokens_no_spec: [>=B] its tokens so far; token_ids_cpu: [>=B, max_model_len].
        Returns each request's draft (empty: none)."""
        began = time.perf_counter()
        drafts = [[] for _ in sampled_token_ids]
        confidence = [NO_CONFIDENCE] * len(
            drafts
        )  # each draft's probabilities that its first 1, 2, ... tokens are accepted
        if self.drafter is None:
            return drafts
        rows = [row for row, sampled in enumerate(sampled_token_ids) if sampled]
        keys = request_ids(self.runner, rows)
        # A step that ran a prefill (a request still in prefill, or one new here) is not a decoding step.
        fresh = len(rows) < len(sampled_token_ids) or any(key not in self.tracked for key in keys)
        self.finish_ended()
        tracked = [self.track(key, length) for key, length in zip(keys, prompt_lengths(self.runner, rows))]
        self.observe_step(began, measurable=not fresh)
        if rows and not self.paused():
            self.draft(began, keys, rows, tracked, num_tokens_no_spec, token_ids_cpu, drafts, confidence)
            self.predict(
                rows, tracked, np.asarray(num_tokens_no_spec, dtype=np.int64)[rows], token_ids_cpu, drafts, confidence
            )
        self.last_step = (time.perf_counter(), len(sampled_token_ids) + sum(map(len, drafts)))
        return drafts

    def draft(
        self,
        began: float,
        keys: list[str],
        rows: list[int],
        tracked: list[Tracked],
        num_tokens_no_spec,
        token_ids_cpu: np.ndarray,
        drafts: list[list[int]],
        confidence: list[np.ndarray],
    ) -> None:
        """The drafter's step for the decoding requests it has started, into `drafts` (vLLM's rows)
        and `confidence` (the drafter's confidence in them)."""
        if not self.started.issuperset(keys):  # a start that failed: that request drafts nothing
            runnable = [i for i, key in enumerate(keys) if key in self.started]
            keys, rows, tracked = (
                [keys[i] for i in runnable],
                [rows[i] for i in runnable],
                [tracked[i] for i in runnable],
            )
        if not rows:
            return
        lengths = np.asarray(num_tokens_no_spec, dtype=np.int64)[rows]
        step_cost = cost_table(self.costs.cost(), len(rows), self.w) if self.adaptive else None
        try:
            out = self.drafter.step(keys, token_ids_cpu, np.array(rows, dtype=np.int64), lengths, step_cost)
        except Exception as error:  # noqa: BLE001 - the engine must survive its drafter
            for t in tracked:
                t.failed_steps += 1
            self.report_failure(keys[0], error)
            return
        self.record(out, rows, keys, tracked, lengths, drafts, confidence)
        elapsed = time.perf_counter() - began
        for t in tracked:
            t.draft_seconds += elapsed / len(tracked)

    def record(
        self,
        out: BatchDrafts,
        rows: list[int],
        keys: list[str],
        tracked: list[Tracked],
        lengths: np.ndarray,
        drafts: list[list[int]],
        confidence: list[np.ndarray],
    ) -> None:
        """The step's drafts into vLLM's rows (and their confidence into `confidence`) and each request's
        proposals; its failures counted."""
        strategies = self.drafter.strategies
        for i, (row, t) in enumerate(zip(rows, tracked)):
            if i in out.failures:
                t.failed_steps += 1
                self.report_failure(keys[i], out.failures[i])
            length = int(out.lengths[i])
            if length:
                tokens = tuple(out.tokens[i, :length].tolist())
                drafts[row] = list(tokens)
                confidence[row] = out.confidence[i, :length].copy()
                t.proposals.append(Proposal(int(lengths[i]) - t.prompt_length, tokens, strategies[out.strategy[i]]))

    def predict(
        self,
        rows: list[int],
        tracked: list[Tracked],
        lengths: np.ndarray,
        token_ids_cpu: np.ndarray,
        drafts: list[list[int]],
        confidence: list[np.ndarray],
    ) -> None:
        """A request with a prediction drafts from it (step_drafts): up to
        prediction_w tokens, cut with `w: auto` to what the step's budget keeps by how often the
        request's prediction has held, where it is expected to gain more than the drafter's own draft."""
        chosen = [i for i, t in enumerate(tracked) if t.prediction is not None]
        if not chosen:
            return
        predictions = []
        for i in chosen:
            t, length = tracked[i], int(lengths[i])
            generated = token_ids_cpu[rows[i], t.prompt_length : length].tolist()
            self.judge(t, generated)
            predictions.append((t.prediction, t.hold, generated, min(self.prediction_w, t.limit - length - 1)))
        fed = len(drafts) + sum(map(len, drafts))
        found = step_drafts(
            predictions,
            [confidence[rows[i]] for i in chosen],
            fed,
            self.holds,
            self.costs.cost() if self.adaptive else None,
        )
        for i, guess in zip(chosen, found):
            if guess is None:
                continue
            row, t = rows[i], tracked[i]
            position = int(lengths[i]) - t.prompt_length
            if drafts[row] and t.proposals and t.proposals[-1].position == position:
                t.proposals.pop()
            drafts[row] = guess
            t.proposals.append(Proposal(position, tuple(guess), PREDICTION))

    def judge(self, t: Tracked, generated: list[int]) -> None:
        """The request's proposals verified since the last step, those from its prediction judged
        against what it emitted (how often its prediction holds)."""
        while t.judged < len(t.proposals) and t.proposals[t.judged].position < len(generated):
            proposal = t.proposals[t.judged]
            if proposal.strategy == PREDICTION:
                end = proposal.position + len(proposal.tokens) + 1
                self.holds.judge(t.hold, proposal.tokens, generated[proposal.position : end])
            t.judged += 1

    def paused(self) -> bool:
        """Whether no request drafts this step: a sampled request runs, and sampled drafts are not verified exactly."""
        return not self.draft_sampled and runs_sampled(self.runner)

    def track(self, request_id: str, prompt_length: int) -> Tracked:
        """The request's record, one more step counted; the drafter starts it if it has not."""
        tracked = self.tracked.get(request_id)
        if tracked is None:
            params = request_params(self.runner, request_id)
            limit = min(self.max_model_len, prompt_length + (params.max_tokens or self.max_model_len))
            predicted = (params.extra_args or {}).get(PREDICTION_KEY)
            tracked = self.tracked[request_id] = Tracked(
                prompt_length, limit, prediction=PredictionDrafter(predicted) if predicted else None
            )
        if request_id not in self.started:
            try:
                self.drafter.start(request_id, tracked.prompt_length, tracked.limit)
                self.started.add(request_id)
            except Exception as error:  # noqa: BLE001 - the engine must survive its drafter
                tracked.failed_steps += 1
                self.report_failure(request_id, error)
        tracked.steps += 1
        return tracked

    def finish_ended(self) -> None:
        """Requests vLLM no longer holds (aborted, or finished and not handed over by `take`, as
        when the caller takes them only after LLM.generate returns) finish with the drafter, without
        their tokens. A request merely not scheduled this step, or preempted, stays: vLLM keeps it."""
        for request_id in self.started - live_request_ids(self.runner):
            self.finish(request_id)

    def finish(self, request_id: str, generated: list[int] = ()) -> None:
        self.started.discard(request_id)
        try:
            self.drafter.finish(request_id, generated)
        except Exception as error:  # noqa: BLE001 - the engine must survive its drafter
            self.report_failure(request_id, error)

    def report_failure(self, request_id: str, error: Exception) -> None:
        kind = f"{type(error).__name__}: {error}"
        if kind not in self.reported:
            self.reported.add(kind)
            logger.error(
                "drafting failed for request %s (it goes on without drafts; other requests with the "
                "same failure are not logged again): %s",
                request_id,
                kind,
                exc_info=error,
            )

    def observe_step(self, now: float, measurable: bool) -> None:
        """Feeds the step that ran since the last proposal to the cost model, if it was a pure
        decoding step: no prefill in it, and no time between LLM.generate calls (whose first step
        always prefills its new requests), which would count the caller's own pauses as a step."""
        if self.last_step is not None and measurable:
            ended, fed = self.last_step
            self.costs.observe(fed, now - ended)

    def take(self, outputs: dict[str, list[int]]) -> dict[str, Tracked]:
        """Hands over (and forgets) what it tracked of these finished requests, by the ids
        LLM.generate returned, with their generated tokens, which the drafter is given as they
        finish (all of them: it has not seen the last step's). Requests it never saw (no drafter,
        or finished in their prefill) are left out."""
        internal = {external_request_id(key): key for key in self.tracked}
        taken = {}
        for request_id, token_ids in outputs.items():
            key = internal.get(request_id, "")
            tracked = self.tracked.pop(key, None)
            if tracked is None:
                continue
            taken[request_id] = tracked
            if key in self.started:
                self.finish(key, token_ids)
        return taken


# Called on the worker by LLM.collective_rpc, with the worker as first argument.


def attach_drafter(
    worker, drafter: BatchDrafter | None, w: int, adaptive: bool, draft_sampled: bool = True, prediction_w: int = 0
) -> None:
    runner = model_runner(worker)
    proposer_of(runner).configure(runner, drafter, w, adaptive, draft_sampled, prediction_w)


def measured_step_cost(worker) -> tuple[float, float] | None:
    """(a, b) of the step cost the proposer's budget has measured (StepCostFit), None before a step."""
    proposer = proposer_of(model_runner(worker))
    if proposer.costs.sums[0] < 1:
        return None
    cost = proposer.costs.cost()
    return cost.a, cost.b


def take_tracked(worker, outputs: dict[str, list[int]]) -> dict[str, Tracked]:
    return proposer_of(model_runner(worker)).take(outputs)
