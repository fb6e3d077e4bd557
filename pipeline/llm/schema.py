"""The one output schema, each datum under one name: ray.data.llm's columns (its names where it has
one), then ours (the request's statistics and the settings that ran), for the processor's rows and
so for the job's, which add the row's id and its error.

Each column of ours, once:
- finish_reason: "eos", "length" or "stop" (ray.data.llm's rows have none);
- num_target_calls: the target's forward calls that verified the request (bonus tokens included;
  the prefill is not counted), num_verified_tokens the tokens they fed it;
- forward_call_share: 1/B per call that served B requests (the rows of a run sum to the calls
  made; null on the vLLM engine, which does not report its batches);
- tokens_per_call: num_generated_tokens / num_target_calls (1.0 for plain decoding);
- accepted_length_histogram[a]: steps that accepted a draft tokens; accepted_rank_histogram[r]:
  steps won by the row of rank r (transformers engine, k > 1);
- strategy_rows, strategy_wins, strategy_accepted_tokens: per drafting strategy ("none": steps
  without a draft);
- accepted_prediction_tokens, rejected_prediction_tokens: the row's `prediction` tokens drafted and
  accepted, and drafted and rejected (OpenAI's names for predicted outputs; 0 without a prediction);
- num_checked_draft_tokens, sum_acceptance_probability, acceptance_rate (their mean);
- num_draft_model_calls, draft_cost_ratio (a draft model's call over a target call), draft_seconds,
  median_draft_seconds, verify_seconds; num_drafter_failed_steps (steps it went on without drafts);
- the settings that ran: model, engine, drafter, k, w, auto_k, auto_w, verify, lenience, and the
  row's temperature, top_k, top_p and seed (the seed it sampled with, derived if it gave none).
"""

from __future__ import annotations

import pyarrow as pa

INFERENCE_ERROR = "__inference_error__"
# A processor row that stands for input that could not be read (a bad line: pipeline/job/inputs.py):
# the stage writes its error row with this message and runs nothing for it.
BAD_INPUT = "__bad_input__"

# What ray.data.llm's vLLM stage adds to a row (ray/llm/_internal/batch/stages/vllm_engine_stage.py:
# vLLMOutputData, then request_id, batch_uuid, time_taken_llm, params).
RAY_LLM_COLUMNS = pa.schema(
    [
        ("prompt", pa.string()),  # the prompt as the model saw it (templated)
        ("prompt_token_ids", pa.list_(pa.int64())),
        ("num_input_tokens", pa.int64()),
        ("generated_tokens", pa.list_(pa.int64())),
        ("generated_text", pa.string()),
        ("num_generated_tokens", pa.int64()),
        ("embeddings", pa.null()),
        ("metrics", pa.null()),  # the engine's per-request record (vLLM's RequestStateStats): its type is the data's
        ("logprobs", pa.null()),
        ("prompt_logprobs", pa.null()),
        ("request_id", pa.int64()),
        ("batch_uuid", pa.string()),
        ("time_taken_llm", pa.float64()),  # the request's own time in the engine, scheduled to its last token
        ("params", pa.string()),  # the engine's own print of the request's settings
    ]
)
COUNTS = pa.map_(pa.string(), pa.int64())
STATISTICS = pa.schema(
    [
        ("finish_reason", pa.string()),
        ("num_target_calls", pa.int64()),
        ("num_verified_tokens", pa.int64()),
        ("forward_call_share", pa.float64()),
        ("tokens_per_call", pa.float64()),
        ("accepted_length_histogram", pa.list_(pa.int64())),
        ("accepted_rank_histogram", pa.list_(pa.int64())),
        ("strategy_rows", COUNTS),
        ("strategy_wins", COUNTS),
        ("strategy_accepted_tokens", COUNTS),
        ("accepted_prediction_tokens", pa.int64()),
        ("rejected_prediction_tokens", pa.int64()),
        ("num_checked_draft_tokens", pa.int64()),
        ("sum_acceptance_probability", pa.float64()),
        ("acceptance_rate", pa.float64()),
        ("num_draft_model_calls", pa.int64()),
        ("num_drafter_failed_steps", pa.int64()),
        ("draft_cost_ratio", pa.float64()),
        ("draft_seconds", pa.float64()),
        ("median_draft_seconds", pa.float64()),
        ("verify_seconds", pa.float64()),
        ("model", pa.string()),
        ("engine", pa.string()),
        ("drafter", pa.string()),
        ("k", pa.int64()),
        ("w", pa.int64()),
        ("auto_k", pa.bool_()),
        ("auto_w", pa.bool_()),
        ("verify", pa.string()),
        ("lenience", pa.float64()),
        ("temperature", pa.float64()),
        ("top_k", pa.int64()),
        ("top_p", pa.float64()),
        ("seed", pa.int64()),
    ]
)
# A processor's row: its own columns, then these (the statistics those statistics_columns names).
# Ours, on every row: which of the row's samples it is (sampling_params.n: 0 to n - 1; the choice's
# `index` in OpenAI's output).
SAMPLE_INDEX = pa.field("sample_index", pa.int64())
GENERATED = pa.schema([*RAY_LLM_COLUMNS, SAMPLE_INDEX, *STATISTICS, (INFERENCE_ERROR, pa.string())])
# ray.data.llm's columns whose Arrow type is the data's (vLLM's per-request metrics; log
# probabilities, keyed by token id), converted as Ray Data converts them.
TYPED_BY_THE_DATA = ("metrics", "logprobs", "prompt_logprobs")

LOGPROB = pa.struct([("token_id", pa.int64()), ("token", pa.string()), ("logprob", pa.float64()), ("rank", pa.int64())])
LOGPROBS = pa.list_(pa.list_(LOGPROB))

# The job's Parquet: the row's id, the processor's columns, and the row's error (null when it was
# generated; the processor's __inference_error__ is ""). Left out are the columns the job cannot
# fill (a generation's embeddings; metrics, and prompt log probabilities, which its rows do not ask
# for) and those whose data it holds in another: prompt (prompt_token_ids) and params (the
# settings' own columns).
JOB_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        SAMPLE_INDEX,
        # what produced the row (pipeline/job/series.py); the prediction it was drafted
        # from first: "row" (its own `prediction`), "last_output" (a series' changed
        # row), null (none, or an engine that drafts from none); whether its id had an
        # output in an earlier run of its series (its input or settings changed)
        ("fingerprint", pa.string()),
        ("predicted_from", pa.string()),
        ("changed", pa.bool_()),
        *(
            f
            for f in GENERATED
            if f.name not in {*TYPED_BY_THE_DATA, "embeddings", "prompt", "params", "sample_index", INFERENCE_ERROR}
        ),
        # a row of an OpenAI Batch file: its url (null for the job's other rows), and the
        # log probabilities it asked for, per generated position the token drawn and the
        # most likely ones (pipeline/job/openai_batch.py writes them as OpenAI's)
        ("endpoint", pa.string()),
        ("logprobs", LOGPROBS),
        ("error", pa.string()),
    ]
)
