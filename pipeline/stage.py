"""The generation stage: a callable class that holds the model, tokenizer and drafter once and
maps a batch of input rows to output rows; Ray Data runs it in an actor pool with `map_batches`.

A row that cannot be generated (no prompt, an empty, non-text or over-long one, a bad per-row
setting) gets an `error` naming the row and the cause; the other rows of the batch go on.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pyarrow as pa
import torch

from drafters.registry import DrafterTables, build_tables, make_drafter
from pipeline.config import Config
from pipeline.decoder import PromptError, SpeculativeDecoder
from pipeline.model_loading import LoadedModel, cache_root, load_model
from pipeline.output import SCHEMA
from pipeline.prompts import encode_prompt
from pipeline.stats import RequestStats

# Optional per-row columns; a null value means "use the config's setting".
ROW_SETTINGS = ("max_new_tokens", "temperature", "seed")


def python_value(value):
    """Arrow/numpy batch values (arrays of dicts, numpy scalars, NaN) as plain Python."""
    if isinstance(value, np.ndarray):
        return [python_value(v) for v in value.tolist()]
    if isinstance(value, list):
        return [python_value(v) for v in value]
    if isinstance(value, dict):
        return {k: python_value(v) for k, v in value.items()}
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


class GenerationStage:
    def __init__(self, config: Config, tables: DrafterTables | None = None, loaded: LoadedModel | None = None):
        if tables is not None and not isinstance(tables, DrafterTables):
            import ray  # an ObjectRef: the job puts the tables in the object store once
            tables = ray.get(tables)
        self.config = config
        loaded = loaded or load_model(config.model)
        decoder_config = config.decoder
        if tables is None:
            tables = build_tables(loaded.model, loaded.tokenizer, loaded.fingerprint, decoder_config,
                                  cache_root(config.model))
        self.tables = tables
        pad = loaded.tokenizer.pad_token_id if loaded.tokenizer.pad_token_id is not None else 0
        self.tokenizer = loaded.tokenizer
        self.decoder = SpeculativeDecoder(loaded.model, loaded.tokenizer, make_drafter(decoder_config, tables, pad),
                                          decoder_config.k, decoder_config.w, decoder_config.ngram_max_q)
        self.settings = {"model": config.model.name, "drafter": decoder_config.drafter,
                         "k": self.decoder.k, "w": self.decoder.w}
        source = config.input
        self.prompt_column = source.prompt_column or source.messages_column
        self.input_columns = (source.id_column, self.prompt_column)

    def max_new_tokens(self, row: dict, request_id: str) -> int:
        value = row.get("max_new_tokens")
        if value is None:
            return self.config.decoder.max_new_tokens
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise PromptError(f"request {request_id!r}: max_new_tokens must be an integer >= 1, got {value!r}")
        return value

    def check_sampling(self, row: dict, request_id: str) -> None:
        temperature = row.get("temperature")
        if temperature is not None and not isinstance(temperature, (int, float)):
            raise PromptError(f"request {request_id!r}: temperature must be a number, got {temperature!r}")
        if temperature not in (None, 0, 0.0):
            # Refuse rather than silently decode greedily: the user asked for samples.
            raise PromptError(f"request {request_id!r}: temperature {temperature:g} asks for sampling; this "
                              "decoder is greedy only (temperature 0 or null)")

    def generate_row(self, row: dict) -> dict:
        raw_id = row.get(self.input_columns[0])
        request_id = None if raw_id is None else str(raw_id)
        try:
            if request_id is None:
                raise PromptError(f"a row has no {self.input_columns[0]!r}")
            prompt = row.get(self.prompt_column)
            if prompt is None:
                raise PromptError(f"request {request_id!r}: no prompt in column {self.prompt_column!r}")
            self.check_sampling(row, request_id)
            max_new_tokens = self.max_new_tokens(row, request_id)
            prompt_ids = encode_prompt(self.tokenizer, prompt, request_id)
            result = self.decoder.generate(prompt_ids, max_new_tokens, self.config.decoder.stop, request_id)
        except PromptError as error:
            return self.error_row(request_id, str(error))
        output = {"id": request_id, "text": result.text, "token_ids": result.token_ids, "error": None}
        output.update(result.stats.as_row())
        output.update(self.settings)
        return output

    def error_row(self, request_id: str | None, message: str) -> dict:
        row = {name: None for name in SCHEMA.names}
        row.update(id=request_id, error=message, **self.settings)
        return row

    def __call__(self, batch: dict) -> pa.Table:
        missing = [name for name in self.input_columns if name not in batch]
        if missing:
            raise KeyError(f"input is missing column(s) {missing}; the stage needs {list(self.input_columns)} "
                           f"(see input.id_column / input.prompt_column / input.messages_column)")
        present = [name for name in (*self.input_columns, *ROW_SETTINGS) if name in batch]
        size = len(batch[self.input_columns[0]])
        rows = [{name: python_value(batch[name][i]) for name in present} for i in range(size)]
        with torch.no_grad():
            return pa.Table.from_pylist([self.generate_row(row) for row in rows], schema=SCHEMA)


assert {f.name for f in dataclasses.fields(RequestStats)} | {"tokens_per_call"} <= set(SCHEMA.names), \
    "every statistics field must be an output column"
