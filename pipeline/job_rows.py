"""The CLI job's rows as a pipeline.llm processor's: its preprocess turns a job row (an id, a text
prompt or chat messages, per-row settings) into ray.data.llm's form, and its postprocess turns the
generated rows into the job's output table (pipeline/output.py). The stage and the request parser
are the processor's (pipeline/stage.py, pipeline/rows.py).

A job row's settings are the config's decoder.* where the row's column is null or absent:
max_new_tokens (vLLM's max_tokens), temperature, top_k, top_p and seed; a row without a seed samples
with one derived from decoder.seed and its id, so a rerun samples the same. Prompts are encoded as the
job always has (pipeline/prompts.encode_prompt): a text prompt is one user message, messages get the
generation prompt, templated where the tokenizer has a chat template.
"""
from __future__ import annotations

from typing import Any, Callable

import pyarrow as pa

from pipeline.config import Config
from pipeline.output import SCHEMA
from pipeline.rows import INFERENCE_ERROR, RAY_LLM_COLUMNS
from pipeline.sampling import request_seed
from pipeline.stage import GenerationStage, python_value, request_key, rows_table

# A job row's optional columns, and the sampling_params key each is.
ROW_SETTINGS = {"max_new_tokens": "max_tokens", "temperature": "temperature", "top_k": "top_k", "top_p": "top_p",
                "seed": "seed"}
# The columns of a processor's row the preprocess sets (None where unused), so that an input column of
# the same name does not take part in the request.
REQUEST_COLUMNS = ("messages", "prompt", "tokenized_prompt", "model")


def stage_settings(progress=None, run_id: str = "") -> dict[str, Any]:
    """GenerationStage's keywords for the job's rows: every row comes back (an error row where it
    fails), errors name the row by its id, prompts are encoded by the job's rule, and each batch is told
    to the run's progress actor and to Ray's metrics."""
    return {"continue_on_error": True, "id_column": "id", "job_prompts": True, "progress": progress,
            "live_metrics": progress is not None, "run_id": run_id}


def input_columns(config: Config, names: list[str]) -> list[str]:
    """The input's columns the job reads (of `names`, the input's): the id, the prompt, the row settings."""
    source = config.input
    return list(dict.fromkeys([source.id_column, source.prompt_column or source.messages_column,
                               *(name for name in ROW_SETTINGS if name in names)]))


def request_row(config: Config) -> Callable[[dict], dict]:
    """The preprocess: a job row -> the processor's columns (id, messages or prompt, sampling_params)."""
    source, decoder = config.input, config.decoder
    column = source.prompt_column or source.messages_column

    def convert(row: dict) -> dict:
        key = request_key(row.get(source.id_column))
        prompt = python_value(row.get(column))
        params = {"max_tokens": decoder.max_new_tokens, "temperature": decoder.temperature, "top_k": decoder.top_k,
                  "top_p": decoder.top_p, "stop": list(decoder.stop), "seed": request_seed(decoder.seed, key)}
        for name, key_there in ROW_SETTINGS.items():
            value = python_value(row.get(name))
            if value is not None:
                params[key_there] = value
        out = dict.fromkeys(REQUEST_COLUMNS)
        out.update(id=key, sampling_params=params, **{"messages" if isinstance(prompt, list) else "prompt": prompt})
        return out
    return convert


def output_row(row: dict) -> dict:
    """A generated (or error) row as the job writes it: every generated column null on an error row."""
    error = row.get(INFERENCE_ERROR) or None
    out = {name: row.get(name) for name in SCHEMA.names}
    out.update(id=row.get("id"), text=row.get("generated_text"), token_ids=row.get("generated_tokens"), error=error)
    if error is not None:
        out.update(dict.fromkeys(["text", "token_ids", *(name for name in RAY_LLM_COLUMNS.names if name in out)]))
    return out


def output_table(batch: pa.Table) -> pa.Table:
    """The postprocess, a batch at a time (the output's schema whatever the batch holds)."""
    return pa.Table.from_pylist([output_row(row) for row in batch.to_pylist()], schema=SCHEMA)


def job_stage(config: Config) -> GenerationStage:
    """The stage as the job's actors build it, in this process (no progress actor, no metrics)."""
    return GenerationStage(config, **stage_settings())


def generate(stage: GenerationStage, batch: dict[str, list]) -> pa.Table:
    """A batch of job rows (columns of values) through the three steps in this process (tests,
    benchmarks): the preprocess, the stage (job_stage's), the postprocess."""
    convert = request_row(stage.config)
    rows = [dict(zip(batch, values)) for values in zip(*batch.values())]
    return output_table(stage(rows_table([{**row, **convert(row)} for row in rows])))
