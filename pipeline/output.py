"""The output table (one row per input row, columns fixed by an explicit Arrow schema) and the run summary."""
from __future__ import annotations

import pyarrow as pa

COUNTS = pa.map_(pa.string(), pa.int64())
SCHEMA = pa.schema([
    ("id", pa.string()),
    ("text", pa.string()),
    ("token_ids", pa.list_(pa.int64())),
    ("finish_reason", pa.string()),
    ("num_prompt_tokens", pa.int64()),
    ("num_generated_tokens", pa.int64()),
    ("num_target_calls", pa.int64()),
    ("num_verified_tokens", pa.int64()),
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
    ("verify", pa.string()),  # "batch" or "tree"
    ("lenience", pa.float64()),  # 1 is exact; < 1 is the lossy option
    ("temperature", pa.float64()),
    ("top_k", pa.int64()),
    ("top_p", pa.float64()),
    ("seed", pa.int64()),  # the seed this row sampled with (derived from decoder.seed and the id if not given)
    ("error", pa.string()),  # null when the row succeeded
])


def summarize(rows: list[dict], wall_seconds: float, settings: dict) -> dict:
    succeeded = [row for row in rows if row["error"] is None]
    generated = sum(row["num_generated_tokens"] or 0 for row in succeeded)
    calls = sum(row["num_target_calls"] or 0 for row in succeeded)
    return {
        "rows": len(rows),
        "errored_rows": len(rows) - len(succeeded),
        "generated_tokens": generated,
        "wall_seconds": round(wall_seconds, 3),
        "tokens_per_second": round(generated / wall_seconds, 3) if wall_seconds > 0 else None,
        "mean_tokens_per_call": round(generated / calls, 4) if calls else None,
        "settings": settings,
    }

