"""The output table: one row per input row, columns fixed by an explicit Arrow schema."""
from __future__ import annotations

import pyarrow as pa

COUNTS = pa.map_(pa.string(), pa.int64())
SCHEMA = pa.schema([
    ("id", pa.string()),  # the input's id as text ("" when the row has none)
    ("text", pa.string()),
    ("token_ids", pa.list_(pa.int64())),
    # ray.data.llm's names for the same: generated_text = text, generated_tokens = token_ids,
    # num_input_tokens = num_prompt_tokens (num_generated_tokens is one name for both).
    ("generated_text", pa.string()),
    ("generated_tokens", pa.list_(pa.int64())),
    ("num_input_tokens", pa.int64()),
    ("prompt_token_ids", pa.list_(pa.int64())),  # the prompt as the model saw it (ray.data.llm's name)
    ("finish_reason", pa.string()),
    ("num_prompt_tokens", pa.int64()),
    ("num_generated_tokens", pa.int64()),
    ("num_target_calls", pa.int64()),
    ("num_verified_tokens", pa.int64()),
    ("forward_call_share", pa.float64()),  # 1/B per call that served B requests; rows sum to the calls made
    ("tokens_per_call", pa.float64()),
    ("accepted_length_histogram", pa.list_(pa.int64())),
    ("accepted_rank_histogram", pa.list_(pa.int64())),
    ("strategy_rows", COUNTS),
    ("strategy_wins", COUNTS),
    ("strategy_accepted_tokens", COUNTS),
    ("num_checked_draft_tokens", pa.int64()),
    ("sum_acceptance_probability", pa.float64()),
    ("alpha", pa.float64()),  # mean acceptance probability of a checked draft token
    ("num_draft_model_calls", pa.int64()),
    ("num_drafter_failed_steps", pa.int64()),  # steps whose drafting failed for this row (it went on without drafts)
    ("draft_cost_ratio", pa.float64()),  # c = draft-model call time / target call time
    ("draft_seconds", pa.float64()),
    ("median_draft_seconds", pa.float64()),  # per step: retrieval + selection for REST
    ("verify_seconds", pa.float64()),
    ("total_seconds", pa.float64()),
    ("model", pa.string()),
    ("engine", pa.string()),  # "vllm" or "transformers": the engine that generated the row
    ("drafter", pa.string()),
    ("k", pa.int64()),
    ("w", pa.int64()),
    ("auto_k", pa.bool_()),  # k: auto (then k is the largest k a step may choose)
    ("auto_w", pa.bool_()),  # w: auto (then w is the largest w a step may choose)
    ("verify", pa.string()),  # "batch" or "tree": the mode that ran (throughput mode verifies trees)
    ("lenience", pa.float64()),  # 1 is exact; < 1 is the lossy option
    ("temperature", pa.float64()),
    ("top_k", pa.int64()),
    ("top_p", pa.float64()),
    ("seed", pa.int64()),  # the seed this row sampled with (derived from decoder.seed and the id if not given)
    ("error", pa.string()),  # null when the row succeeded
])
