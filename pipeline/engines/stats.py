"""Per-request acceptance statistics; each field is one output column, under the one name
pipeline/llm/schema.py gives it (and so are the properties tokens_per_call, acceptance_rate, draft_cost_ratio
and median_draft_seconds)."""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass, field

FINISH_REASONS = ("eos", "length", "stop")


@dataclass
class RequestStats:
    num_input_tokens: int = 0  # the prompt's tokens (ray.data.llm's name)
    num_generated_tokens: int = 0
    # Verification calls of the target (the prefill is not counted: it generates nothing).
    num_target_calls: int = 0
    # Tokens those calls fed the target: k*(w+1) per call in batch mode, fewer in tree mode.
    num_verified_tokens: int = 0
    # This request's share of the target's forward calls: a call that served B requests counts
    # 1/B for each, so the rows of a run sum to the calls made (num_target_calls counts a shared
    # call once per request). None where the engine does not say (vLLM).
    forward_call_share: float | None = None
    # Index a: steps that accepted a draft tokens, a = 0..w.
    accepted_length_histogram: list[int] = field(default_factory=list)
    # Index r: steps won by the row at rank r among the k. A step is won when it accepts at least
    # one draft token; a step that accepts none has no winner and is counted in neither.
    accepted_rank_histogram: list[int] = field(default_factory=list)
    # Draft rows verified, and steps won, per strategy ("none": plain steps without drafts).
    strategy_rows: dict[str, int] = field(default_factory=dict)
    strategy_wins: dict[str, int] = field(default_factory=dict)
    # Draft tokens accepted per strategy (the winning row's strategy gets the step's accepted tokens).
    strategy_accepted_tokens: dict[str, int] = field(default_factory=dict)
    # A row's prediction (OpenAI's predicted outputs, by its names): its tokens drafted and accepted,
    # and drafted and not accepted (OpenAI counts the prediction's tokens that are not in the answer;
    # here a prediction's token never drafted, where the answer left it, is in neither).
    accepted_prediction_tokens: int = 0
    rejected_prediction_tokens: int = 0
    # Draft tokens checked (accepted, then the first rejected one) and the sum of their acceptance
    # probabilities: their mean is the acceptance rate of speculative sampling's analysis.
    num_checked_draft_tokens: int = 0
    sum_acceptance_probability: float = 0.0
    # Forward calls of a draft model (0 for table and context drafters).
    num_draft_model_calls: int = 0
    # Steps whose drafting failed for this request (the drafter raised, or gave no token list):
    # the request went on without drafts in them.
    num_drafter_failed_steps: int = 0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    # Draft time of every step (retrieval and selection for REST); only its median is a column.
    draft_step_seconds: list[float] = field(default_factory=list)
    # The request's own time in the engine, scheduled to its last token (ray.data.llm's name).
    time_taken_llm: float = 0.0
    finish_reason: str = ""

    @property
    def tokens_per_call(self) -> float:
        """Generated tokens / the verification steps this request took, bonus tokens included
        (plain greedy gives 1.0). Per request: in throughput mode a forward call serves several
        requests, and a run's tokens per forward call is sum(tokens) / sum(forward_call_share)."""
        return self.num_generated_tokens / max(self.num_target_calls, 1)

    @property
    def acceptance_rate(self) -> float | None:
        """Mean acceptance probability of a checked draft token; None when nothing was drafted."""
        if not self.num_checked_draft_tokens:
            return None
        return self.sum_acceptance_probability / self.num_checked_draft_tokens

    @property
    def draft_cost_ratio(self) -> float | None:
        """c: time of one draft-model call / time of one target call; None without a draft model."""
        if not self.num_draft_model_calls or not self.num_target_calls or not self.verify_seconds:
            return None
        return (self.draft_seconds / self.num_draft_model_calls) / (self.verify_seconds / self.num_target_calls)

    @property
    def median_draft_seconds(self) -> float | None:
        return statistics.median(self.draft_step_seconds) if self.draft_step_seconds else None

    def observe(
        self, drafts, verdict, num_fed_tokens: int, draft_seconds: float, verify_seconds: float, share: float = 1.0
    ) -> None:
        """Records one verification step: the rows of `drafts` were verified
        in a forward call that fed the target `num_fed_tokens` tokens, of which this request had
        `share` (1 / the requests the call served); `verdict` (the transformers engine's Verdict):
        how many draft tokens of which row were accepted, and each checked draft token's acceptance
        probability."""
        strategies, num_accepted, winning_row = drafts.strategies, verdict.num_accepted, verdict.row
        acceptance_probabilities, num_draft_model_calls = verdict.acceptance_probabilities, drafts.num_model_calls
        self.num_target_calls += 1
        self.forward_call_share = (self.forward_call_share or 0.0) + share
        self.num_verified_tokens += num_fed_tokens
        _bump_list(self.accepted_length_histogram, num_accepted)
        for strategy in strategies:
            self.strategy_rows[strategy] = self.strategy_rows.get(strategy, 0) + 1
        if num_accepted:
            _bump_list(self.accepted_rank_histogram, winning_row)
            winner = strategies[winning_row]
            self.strategy_wins[winner] = self.strategy_wins.get(winner, 0) + 1
            self.strategy_accepted_tokens[winner] = self.strategy_accepted_tokens.get(winner, 0) + num_accepted
        self.num_checked_draft_tokens += len(acceptance_probabilities)
        self.sum_acceptance_probability += sum(acceptance_probabilities)
        self.num_draft_model_calls += num_draft_model_calls
        self.draft_seconds += draft_seconds
        self.draft_step_seconds.append(draft_seconds)
        self.verify_seconds += verify_seconds

    def as_row(self) -> dict:
        """The statistics as a row's columns (their histograms and counts copied, one level: the
        values are numbers; dataclasses.asdict's deep copy cost 0.3 ms a row)."""
        row = {name: copy(getattr(self, name)) for name in _ROW_FIELDS}
        row.update(
            tokens_per_call=self.tokens_per_call,
            acceptance_rate=self.acceptance_rate,
            draft_cost_ratio=self.draft_cost_ratio,
            median_draft_seconds=self.median_draft_seconds,
        )
        return row


_ROW_FIELDS = tuple(f.name for f in dataclasses.fields(RequestStats) if f.name != "draft_step_seconds")


def copy(value):
    return list(value) if isinstance(value, list) else dict(value) if isinstance(value, dict) else value


def _bump_list(histogram: list[int], index: int) -> None:
    while len(histogram) <= index:
        histogram.append(0)
    histogram[index] += 1
