"""The CLI job as a pipeline.llm processor program: its preprocess turns a job row (an id, a text
prompt or chat messages, per-row settings) into the processor's row, its postprocess turns every
generated row into the job's (JOB_SCHEMA: the processor's columns, the id, the
error), and the stage is the processor's (pipeline/llm/stage.py), with the job's settings.

A job row's settings are the config's sampling.* where the row's column is null or absent:
max_new_tokens (vLLM's max_tokens), temperature, top_k, top_p, seed and n (samples of the row, each
an output row). A text prompt is one user
message of a chat (templated with the generation prompt) where the tokenizer has a chat template;
a row without a seed samples with one derived from sampling.seed and its id (the stage's rule), so a
rerun samples the same, and so does a processor given the same ids and seed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from collections.abc import Callable

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.config import Config, InputConfig
from pipeline.config.drafter_kinds import DRAFTER_KINDS
from pipeline.engines.errors import RequestError
from pipeline.job import openai_batch
from pipeline.job.series import LAST_OUTPUT, ROW_SETTINGS, row_fingerprint, settings_fingerprint
from pipeline.llm.row_values import prediction_text, python_value, request_key
from pipeline.llm.schema import BAD_INPUT, INFERENCE_ERROR, JOB_SCHEMA, LOGPROBS

if TYPE_CHECKING:
    from pipeline.llm.stage import StageSettings

# Every Ray task that converts the job's rows (the preprocess, the write) imports this module: what
# it needs of the engines and the stage is imported where the driver calls for it, so those tasks
# start without torch (8-9 s for each new worker).

# The columns of a processor's row the preprocess sets (None where unused), so that an input column of
# the same name does not take part in the request.
REQUEST_COLUMNS = ("messages", "prompt", "tokenized_prompt", "model")


def stage_settings(
    config: Config,
    run_id: str = "",
    live_metrics: bool = False,
    expected_rows: int | None = None,
    predictions: bool = False,
) -> StageSettings:
    """The job's stage: every row comes back (an error row where it fails), rows are named and
    seeded by their id, a text prompt is a user's message; `expected_rows`: those the run will
    generate; `predictions`: whether its rows carry predictions, as far as it knows."""
    from pipeline.llm.stage import StageSettings

    return StageSettings(
        text_as_user_message=True,
        continue_on_error=True,
        seed=config.sampling.seed,
        id_column="id",
        live_metrics=live_metrics,
        run_id=run_id,
        expected_rows=expected_rows,
        predictions=predictions,
    )


def input_columns(source: InputConfig, names: list[str]) -> list[str]:
    """The input's columns the job reads (of `names`, the input's): the id, the prompt, the row
    settings, and the message of a row that stands for a bad line."""
    return list(
        dict.fromkeys(
            [
                source.id_column,
                source.prompt_column or source.messages_column,
                *(name for name in (*ROW_SETTINGS, "prediction", openai_batch.REQUEST) if name in names),
                BAD_INPUT,
            ]
        )
    )


def request_row(config: Config, settings: str | None = None) -> Callable[[dict], dict]:
    """The preprocess: a job row -> the processor's columns (id, messages or prompt, sampling_params);
    `settings`: the settings' fingerprint, where the caller has it (the run's plan)."""
    source, sampling = config.input, config.sampling
    column = source.prompt_column or source.messages_column
    settings = settings or settings_fingerprint(config)
    # `predicted_from` says what ran: null where no prediction is drafted from (the stage still checks one).
    from pipeline.engines.build import drafts_from_predictions

    predicted = drafts_from_predictions(config)

    def convert(row: dict) -> dict:
        fields = (
            openai_batch.request_fields(row[openai_batch.REQUEST], config)
            if row.get(openai_batch.REQUEST)
            else row_fields(row, column, sampling)
        )
        prompt = fields["prompt"]
        out = dict.fromkeys(REQUEST_COLUMNS)
        own, last = as_text(fields["prediction"]), row.get(LAST_OUTPUT)
        drafted_from = ("row" if own is not None else LAST_OUTPUT if last is not None else None) if predicted else None
        out.update(
            id=request_key(row.get(source.id_column)),
            sampling_params=fields["sampling_params"],
            **{BAD_INPUT: row.get(BAD_INPUT)},
            fingerprint=row_fingerprint(config, settings, row),
            prediction=own if own is not None else last,
            predicted_from=drafted_from,
            changed=last is not None,
            endpoint=fields["endpoint"],
            **{"messages" if isinstance(prompt, list) else "prompt": prompt},
        )
        return out

    return convert


def row_fields(row: dict, column: str, sampling) -> dict:
    """A job row's prompt, sampling_params (sampling.* where the row's setting column is null) and prediction."""
    params = {
        "max_tokens": sampling.max_new_tokens,
        "temperature": sampling.temperature,
        "top_k": sampling.top_k,
        "top_p": sampling.top_p,
        "stop": list(sampling.stop),
        "n": sampling.n,
    }
    for name, key in ROW_SETTINGS.items():
        value = python_value(row.get(name))
        if value is not None:
            params[key] = value
    return {
        "prompt": python_value(row.get(column)),
        "sampling_params": params,
        "prediction": python_value(row.get("prediction")),
        "endpoint": None,
    }


def as_text(prediction):
    """A row's prediction in OpenAI's form as its text (a column holds one type); one the stage
    cannot read stays as it is, for the stage to name in the row's error."""
    try:
        return prediction_text(prediction, "") or None
    except RequestError:
        return prediction


# The drafters that draft from a row's prediction: ours (not plain, not vLLM's own methods).
PREDICTION_DRAFTERS = pa.array(
    [name for name, kind in DRAFTER_KINDS.items() if name != "none" and not kind.vllm_method]
)


def output_table(batch: pa.Table) -> pa.Table:
    """The postprocess, a block at a time: the job's columns of every row, in JOB_SCHEMA's types,
    the processor's __inference_error__ as `error` (null when the row was generated), and
    `predicted_from` null where the mode that ran the row drafts from no prediction (plain, with
    drafting.speculation auto)."""
    error, present = batch.column(INFERENCE_ERROR), set(batch.column_names)  # (a new list at each read)
    columns = {
        name: batch.column(name) if name in present else pa.nulls(len(batch))
        for name in JOB_SCHEMA.names
        if name != "error"
    }
    columns["error"] = pc.if_else(pc.equal(error, ""), pa.scalar(None, pa.string()), error)
    if "drafter" in present and "predicted_from" in present:
        drafted = pc.fill_null(pc.is_in(batch.column("drafter"), value_set=PREDICTION_DRAFTERS), False)
        columns["predicted_from"] = pc.if_else(drafted, batch.column("predicted_from"), pa.scalar(None, pa.string()))
    asked = "logprobs" in present and batch.column("logprobs").null_count < len(batch)
    columns["logprobs"] = (
        pa.array([logprob_entries(p) for p in batch.column("logprobs").to_pylist()], LOGPROBS)
        if asked
        else pa.nulls(len(batch), LOGPROBS)
    )
    return pa.table(columns).cast(JOB_SCHEMA)


def logprob_entries(positions: list | None) -> list | None:
    """The stage's log probabilities (per position {token id: {logprob, rank, decoded_token}}) as the
    job's Parquet holds them: per position a list of {token_id, token, logprob, rank}."""
    if positions is None:
        return None
    return [
        [
            {
                "token_id": int(token),
                "token": entry.get("decoded_token"),
                "logprob": entry["logprob"],
                "rank": entry.get("rank"),
            }
            for token, entry in (position or {}).items()
        ]
        for position in positions
    ]
