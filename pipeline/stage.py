"""The generation stage: a callable class that holds an engine (the model, tokenizer and drafter,
built once) and maps a batch of input rows to output rows; Ray Data runs it in an actor pool
with `map_batches`. It does not know which engine it holds (pipeline/engines).

A row that cannot be generated (no prompt, an empty, non-text or over-long one, a bad per-row
setting) gets an `error` naming the row and the cause; the other rows of the batch go on.
"""
from __future__ import annotations

import math
import resource
import threading
import time

import numpy as np
import pyarrow as pa
import torch

from drafters.registry import DrafterTables
from pipeline.config import Config
from pipeline.engines.base import (
    Engine,
    EngineSteps,
    Failed,
    Request,
    RequestError,
    Result,
)
from pipeline.engines.build import build_engine
from pipeline.metrics import RunMetrics
from pipeline.output import SCHEMA
from pipeline.progress import BatchReport, JobStopped
from pipeline.prompts import encode_prompt
from pipeline.sampling import SamplingParams, request_seed
from pipeline.stats import RequestStats

# Optional per-row columns; a null value means "use the config's setting".
ROW_SETTINGS = ("max_new_tokens", "temperature", "top_k", "top_p", "seed")


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


def request_key(raw) -> str:
    """A row's id as the output (and the run's checkpoint) names it: its value as text; "" when it
    has none. Ids of any type (int, float, string) resume exactly once under this one name."""
    value = python_value(raw)
    return "" if value is None else str(value)


class GenerationStage:
    def __init__(self, config: Config, tables: DrafterTables | None = None, engine: Engine | None = None,
                 progress=None, run_id: str = "", live_metrics: bool | None = None):
        if tables is not None and not isinstance(tables, DrafterTables):
            import ray  # an ObjectRef: the job puts the tables in the object store once
            tables = ray.get(tables)
        self.config = config
        self.tables = tables
        self.progress = progress  # the run's RunProgress actor, when Ray Data runs this stage
        self.engine = engine or build_engine(config, tables)
        # Live Ray metrics (pipeline/metrics.py): by default when the job's Ray Data runs this stage.
        live = progress is not None if live_metrics is None else live_metrics
        self.metrics = RunMetrics(self.engine.name, config.decoder.drafter, run_id) if live else None
        # What ran, the same on every row this stage writes.
        self.settings = {"model": config.model.name, **self.engine.columns()}
        source = config.input
        self.prompt_column = source.prompt_column or source.messages_column
        self.input_columns = (source.id_column, self.prompt_column)
        # Ray Data may run several batches on this actor at once (the vLLM engine takes them all):
        # the tokenizer is not to be shared between threads, and the step counts are reported in order.
        self.tokenizer_lock = threading.Lock()
        self.report_lock = threading.Lock()
        self.reported_steps = EngineSteps()

    @staticmethod
    def input_columns_of(config: Config) -> tuple[dict[str, str], dict[str, str]]:
        """(required, optional) input columns and what each holds, for Processor.log_input_column_names."""
        source = config.input
        prompt = source.prompt_column or source.messages_column
        required = {source.id_column: "the row's id", prompt: "a text prompt or chat messages"}
        optional = {name: f"this row's decoder.{name}" for name in ("max_new_tokens", "temperature", "top_k", "top_p", "seed")}
        return required, optional

    def row_value(self, row: dict, name: str, request_id: str, kind: type, ok, allowed: str):
        """Row's `name` if set (checked against `ok`), else the config's decoder.<name>."""
        value = row.get(name)
        if value is None:
            return getattr(self.config.decoder, name)
        if kind is int and isinstance(value, float) and value.is_integer():
            value = int(value)
        if kind is float and isinstance(value, int):
            value = float(value)
        if not isinstance(value, kind) or isinstance(value, bool) or not ok(value):
            raise RequestError(f"request {request_id!r}: {name} must be {allowed}, got {value!r}")
        return value

    def max_new_tokens(self, row: dict, request_id: str) -> int:
        return self.row_value(row, "max_new_tokens", request_id, int, lambda v: v >= 1, "an integer >= 1")

    def sampling(self, row: dict, request_id: str) -> SamplingParams:
        if row.get("seed") is None:
            seed = request_seed(self.config.decoder.seed, request_id)
        else:
            seed = self.row_value(row, "seed", request_id, int, lambda v: v >= 0, "an integer >= 0")
        return SamplingParams(
            temperature=self.row_value(row, "temperature", request_id, float, lambda v: v >= 0, "a number >= 0"),
            top_k=max(self.row_value(row, "top_k", request_id, int, lambda v: v >= -1, "an integer >= -1 (0 or -1: no cut)"),
                      0),  # as pipeline.llm reads it (vLLM's -1)
            top_p=self.row_value(row, "top_p", request_id, float, lambda v: 0 < v <= 1, "a number in (0, 1]"),
            seed=seed)

    def request(self, row: dict) -> Request:
        """The row as a request; a RequestError names what is wrong with it."""
        request_id = request_key(row.get(self.input_columns[0]))
        if not request_id:
            raise RequestError(f"a row has no {self.input_columns[0]!r}")
        prompt = row.get(self.prompt_column)
        if prompt is None:
            raise RequestError(f"request {request_id!r}: no prompt in column {self.prompt_column!r}")
        sampling = self.sampling(row, request_id)
        max_new_tokens = self.max_new_tokens(row, request_id)
        with self.tokenizer_lock:
            prompt_ids = encode_prompt(self.engine.tokenizer, prompt, request_id)
        return Request(request_id, prompt_ids, max_new_tokens, self.config.decoder.stop, sampling)

    def output_row(self, request: Request, result: Result) -> dict:
        sampling = request.sampling
        output = {"id": request.request_id, "text": result.text, "token_ids": result.token_ids, "error": None,
                  # The same, named as ray.data.llm names them, so its users' readers keep working.
                  "generated_text": result.text, "generated_tokens": result.token_ids,
                  "num_input_tokens": len(request.prompt_ids), "prompt_token_ids": request.prompt_ids,
                  "temperature": sampling.temperature, "top_k": sampling.top_k, "top_p": sampling.top_p,
                  "seed": sampling.seed}
        output.update(result.stats.as_row())
        output.update(self.settings)
        return output

    def run_requests(self, rows: list, request_of, output_of, error_of) -> list:
        """The one loop both row formats (the job's, pipeline.llm's) run: one output per row, in
        order. `request_of(row)` gives (Request, anything the format keeps beside it) or raises
        RequestError; the engine runs the requests together; `output_of(made, result, seconds)`
        and `error_of(row, made or None, message)` make the rows. A bad row gets an error row, the
        rest go on."""
        outputs: list = [None] * len(rows)
        made: dict[int, tuple] = {}
        for index, row in enumerate(rows):
            try:
                made[index] = request_of(row)
            except RequestError as error:
                outputs[index] = error_of(row, None, str(error))
        started = time.perf_counter()
        with torch.no_grad():
            results = self.engine.generate([request for request, _ in made.values()]) if made else []
        seconds = time.perf_counter() - started
        for (index, one), result in zip(made.items(), results):
            if isinstance(result, Failed):
                outputs[index] = error_of(rows[index], one, result.message)
            else:
                outputs[index] = output_of(one, result, seconds)
        return outputs

    def generate_rows(self, rows: list[dict]) -> list[dict]:
        """The job's rows: one output row per input row, in order."""
        def error_of(row: dict, made: tuple | None, message: str) -> dict:
            request_id = made[0].request_id if made else request_key(row.get(self.input_columns[0]))
            return self.error_row(request_id, message)
        return self.run_requests(rows, lambda row: (self.request(row), None),
                                 lambda made, result, _: self.output_row(made[0], result), error_of)

    def error_row(self, request_id: str, message: str) -> dict:
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
        started = time.time()
        out = self.generate_rows(rows)
        self.report(out, [row["error"] is not None for row in out], started)
        return pa.Table.from_pylist(out, schema=SCHEMA)

    def report(self, rows: list[dict], errored: list[bool], started: float) -> None:
        """Tells Ray's metrics and the run's progress actor about a finished batch (`rows`: its output
        rows, `errored`: which failed); stops the run when the progress actor says so."""
        if self.progress is None and self.metrics is None:
            return
        import ray

        context = ray.get_runtime_context()
        done = [row for row, failed in zip(rows, errored) if not failed]
        with self.report_lock:
            steps = self.engine.steps()
            batch = BatchReport(rows=len(rows), errored_rows=sum(errored),
                                generated_tokens=sum(row.get("num_generated_tokens") or 0 for row in done),
                                target_calls=sum(row.get("num_target_calls") or 0 for row in done),
                                started=started, finished=time.time(), node=context.get_node_id(),
                                actor=context.get_actor_id() or "", engine_steps=steps,
                                peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
            if self.metrics is not None:
                accepted = sum(length * count for row in done
                               for length, count in enumerate(row.get("accepted_length_histogram") or []))
                self.metrics.record({**vars(batch), "accepted_draft_tokens": accepted}, steps, self.reported_steps)
            self.reported_steps = steps or self.reported_steps
        if self.progress is not None:
            stop = ray.get(self.progress.report.remote(batch))
            if stop:
                raise JobStopped(stop)


assert set(RequestStats().as_row()) <= set(SCHEMA.names), \
    "every statistics field must be an output column"
