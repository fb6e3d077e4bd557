"""Per-request acceptance statistics; each field is one output column."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

FINISH_REASONS = ("eos", "length", "stop")


@dataclass
class RequestStats:
    num_prompt_tokens: int = 0
    num_generated_tokens: int = 0
    # Verification calls of the target (the prefill is not counted: it generates nothing).
    num_target_calls: int = 0
    # Index a: steps that accepted a draft tokens, a = 0..w.
    accepted_length_histogram: list[int] = field(default_factory=list)
    # Index r: steps won by the row at rank r among the k.
    accepted_rank_histogram: list[int] = field(default_factory=list)
    # Draft rows verified, and steps won, per strategy.
    strategy_rows: dict[str, int] = field(default_factory=dict)
    strategy_wins: dict[str, int] = field(default_factory=dict)
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    total_seconds: float = 0.0
    finish_reason: str = ""

    @property
    def tokens_per_call(self) -> float:
        """Generated tokens / target calls, bonus tokens included (plain greedy gives 1.0)."""
        return self.num_generated_tokens / max(self.num_target_calls, 1)

    def observe(self, num_accepted: int, rank: int, row_strategies: tuple[str, ...],
                draft_seconds: float, verify_seconds: float) -> None:
        """Records one verification step; row_strategies are the verified rows' strategies."""
        self.num_target_calls += 1
        _bump_list(self.accepted_length_histogram, num_accepted)
        _bump_list(self.accepted_rank_histogram, rank)
        for strategy in row_strategies:
            self.strategy_rows[strategy] = self.strategy_rows.get(strategy, 0) + 1
        if row_strategies:
            winner = row_strategies[rank]
            self.strategy_wins[winner] = self.strategy_wins.get(winner, 0) + 1
        self.draft_seconds += draft_seconds
        self.verify_seconds += verify_seconds

    def as_row(self) -> dict:
        row = dataclasses.asdict(self)
        row["tokens_per_call"] = self.tokens_per_call
        return row


def _bump_list(histogram: list[int], index: int) -> None:
    while len(histogram) <= index:
        histogram.append(0)
    histogram[index] += 1
