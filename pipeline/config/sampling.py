"""The `sampling` section: what a row generates and how it samples, in vLLM's SamplingParams' terms
(a row's own columns override them: pipeline/job/series.py's ROW_SETTINGS). With `model`, this is
what decides a row's text (pipeline/job/series.settings_fingerprint)."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.config.typed import require as _require


@dataclass(frozen=True)
class SamplingConfig:
    max_new_tokens: int = 128
    # Samples of each row (a row's own `n` column overrides it), each its own output row
    # (`sample_index` 0 to n - 1) with its own seed; a row's samples run side by side and draft
    # from each other as they go.
    n: int = 1
    # Generation stops after the first of these strings appears in the generated text.
    stop: tuple[str, ...] = ()
    # Temperature 0 is greedy decoding. Each can be overridden per input row.
    temperature: float = 0.0
    top_k: int = 0  # 0: no top-k cut
    top_p: float = 1.0  # 1: no nucleus cut
    # A row without its own seed samples with a seed derived from this one and the row id, so a
    # rerun reproduces every row and rows with the same prompt still differ.
    seed: int = 0

    def __post_init__(self):
        _require(self.max_new_tokens >= 1, "sampling.max_new_tokens", "an integer >= 1")
        _require(1 <= self.n <= 128, "sampling.n", "an integer from 1 to 128")
        _require(all(self.stop), "sampling.stop", "non-empty strings")
        _require(self.temperature >= 0, "sampling.temperature", "a number >= 0 (0 is greedy)")
        _require(self.top_k >= 0, "sampling.top_k", "an integer >= 0 (0 keeps every token)")
        _require(0 < self.top_p <= 1, "sampling.top_p", "a number in (0, 1]")
        _require(self.seed >= 0, "sampling.seed", "an integer >= 0")
