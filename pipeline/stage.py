"""The generation stage: a callable class that holds the model, tokenizer and drafter once and
maps a batch of prompt rows to output rows (the shape of a Ray Data `map_batches` stage).

A row that cannot be generated (no prompt, an empty or over-long one) gets an `error` naming the
cause; the other rows of the batch go on.
"""
from __future__ import annotations

import dataclasses

from drafters.registry import DrafterTables, build_tables, make_drafter
from pipeline.config import Config
from pipeline.decoder import PromptError, SpeculativeDecoder
from pipeline.model_loading import LoadedModel, cache_root, load_model
from pipeline.output import SCHEMA
from pipeline.prompts import encode_prompt
from pipeline.stats import RequestStats


class GenerationStage:
    input_columns = ("id", "prompt")

    def __init__(self, config: Config, tables: DrafterTables | None = None, loaded: LoadedModel | None = None):
        self.config = config
        loaded = loaded or load_model(config.model)
        decoder_config = config.decoder
        if tables is None:
            tables = build_tables(loaded.model, loaded.tokenizer, loaded.fingerprint, decoder_config,
                                  cache_root(config.model))
        pad = loaded.tokenizer.pad_token_id if loaded.tokenizer.pad_token_id is not None else 0
        drafter = make_drafter(decoder_config, tables, pad)
        self.tokenizer = loaded.tokenizer
        self.decoder = SpeculativeDecoder(loaded.model, loaded.tokenizer, drafter, decoder_config.k,
                                          decoder_config.w, decoder_config.ngram_max_q)
        self.settings = {"model": config.model.name, "drafter": decoder_config.drafter,
                         "k": self.decoder.k, "w": self.decoder.w}

    def generate_row(self, request_id: str, prompt) -> dict:
        try:
            prompt_ids = encode_prompt(self.tokenizer, prompt, request_id)
            result = self.decoder.generate(prompt_ids, self.config.decoder.max_new_tokens,
                                           self.config.decoder.stop, request_id)
        except PromptError as error:
            return self.error_row(request_id, str(error))
        row = {"id": request_id, "text": result.text, "token_ids": result.token_ids, "error": None}
        row.update(result.stats.as_row())
        row.update(self.settings)
        return row

    def error_row(self, request_id: str, message: str) -> dict:
        row = {name: None for name in SCHEMA.names}
        row.update(id=request_id, error=message, **self.settings)
        return row

    def __call__(self, batch: dict) -> dict:
        missing = [name for name in self.input_columns if name not in batch]
        if missing:
            raise KeyError(f"input is missing column(s) {missing}; the stage needs {list(self.input_columns)}")
        rows = [self.generate_row(str(request_id), prompt) for request_id, prompt in zip(batch["id"], batch["prompt"])]
        return {name: [row[name] for row in rows] for name in SCHEMA.names}


assert {f.name for f in dataclasses.fields(RequestStats)} | {"tokens_per_call"} <= set(SCHEMA.names), \
    "every statistics field must be an output column"
