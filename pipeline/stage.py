"""The generation stage: the one callable class Ray Data runs in an actor pool (`map_batches`), for
pipeline.llm's processor and for the CLI job alike (the job's rows reach it through its preprocess,
pipeline/job_rows.py). It holds an engine (the model, tokenizer and drafter, built once) and turns a
batch of rows in ray.data.llm's form (`messages`, `prompt` or `tokenized_prompt`, `sampling_params`)
into the same rows with ray.data.llm's generated columns and our statistics. It does not know
which engine it holds (pipeline/engines).

A row that cannot be generated (no prompt, an empty or over-long one, a bad setting) raises, or,
with `continue_on_error`, comes back with `__inference_error__` naming the row and the cause, its
generated columns empty as ray.data.llm's are; the other rows of the batch go on.
"""
from __future__ import annotations

import itertools
import math
import resource
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pyarrow as pa
import torch
# How Ray Data turns a column of Python values into Arrow (its own types where it can, else its
# object extension type), as ray.data.llm's rows get it.
from ray.data._internal.tensor_extensions.arrow import convert_to_pyarrow_array

from drafters.registry import DrafterTables
from pipeline.config import Config
from pipeline.engines.base import Engine, EngineSteps, Failed, Request, RequestError, Result
from pipeline.engines.build import build_engine
from pipeline.metrics import RunMetrics
from pipeline.progress import BatchReport, JobStopped
from pipeline.prompts import encode_prompt
from pipeline.rows import GENERATED, INFERENCE_ERROR, STATISTICS, TYPED_BY_THE_DATA, sampling_of, vllm_sampling_keys
from pipeline.sampling import request_seed


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
    """A row's id as the job's output (and a run's checkpoint) names it: its value as text; "" when
    it has none. Ids of any type (int, float, string) resume exactly once under this one name."""
    value = python_value(raw)
    return "" if value is None else str(value)


def rows_table(rows: list[dict]) -> pa.Table:
    """Rows as Ray Data makes a block of them: every column any row has, each converted as Ray Data
    converts it (its object type where the values' types differ)."""
    names = list(dict.fromkeys(name for row in rows for name in row))
    return pa.table({name: convert_to_pyarrow_array([row.get(name) for row in rows], name) for name in names})


class GenerationStage:
    """The actor's callable: the engine (built once), rows in, rows out with ray.data.llm's columns
    and ours appended to their own.

    Settings (the processor's, from vLLMEngineProcessorConfig; the job's, from pipeline/job_rows.py):
    chat_template (template `messages`), template and template_kwargs (a Jinja template instead of
    the tokenizer's; apply_chat_template's keywords), continue_on_error, seed (rows without one
    sample with one derived from it), statistics (which of our columns a row gets; None: all),
    id_column (errors name a row by its id, and a row without one is an error), job_prompts (the
    job's prompt rule, pipeline/prompts.encode_prompt: a text prompt is one user message, messages get
    the generation prompt, both tokenized as the chat template writes them where the tokenizer has
    one), progress (the job's RunProgress actor, told of each batch) and live_metrics with run_id
    (Ray metrics from the actor, pipeline/metrics.py)."""

    def __init__(self, config: Config, tables=None, engine: Engine | None = None, chat_template: bool = True,
                 continue_on_error: bool = False, seed: int | None = None, statistics: Sequence[str] | None = None,
                 template: str | None = None, template_kwargs: Mapping[str, Any] | None = None,
                 id_column: str | None = None, job_prompts: bool = False, progress=None,
                 live_metrics: bool = False, run_id: str = ""):
        if tables is not None and not isinstance(tables, DrafterTables):
            import ray  # an ObjectRef: the tables are put in the object store once
            tables = ray.get(tables)
        self.config, self.tables = config, tables
        self.engine = engine or build_engine(config, tables)
        self.dropped = [] if statistics is None else [f.name for f in STATISTICS if f.name not in statistics]
        self.seed = seed
        self.vllm_keys = vllm_sampling_keys() if config.engine.name == "vllm" else None
        self.chat_template, self.job_prompts = chat_template, job_prompts
        self.template, self.template_kwargs = template, dict(template_kwargs or {})
        self.continue_on_error, self.id_column = continue_on_error, id_column
        self.request_ids = itertools.count()
        self.progress = progress
        # Live metrics only from an actor Ray runs (not from a stage built outside Ray).
        self.metrics = RunMetrics(self.engine.name, config.decoder.drafter, run_id) if live_metrics and ray_running() else None
        # What ran, the same on every row this stage writes.
        self.settings = {"model": config.model.name, **self.engine.columns()}
        # Ray Data may run several batches on this actor at once (the vLLM engine takes them all):
        # the tokenizer is not to be shared between threads, and the step counts are reported in order.
        self.tokenizer_lock = threading.Lock()
        self.report_lock = threading.Lock()
        self.reported_steps = EngineSteps()

    @staticmethod
    def input_columns_of(config: Config) -> tuple[dict[str, str], dict[str, str]]:
        """(required, optional) input columns and what each holds, as ray.data.llm logs them."""
        return ({"messages | prompt | tokenized_prompt": "chat messages (templated), a text prompt (tokenized as "
                 "it is) or token ids: one of them"},
                {"sampling_params": "vLLM's SamplingParams keys (vLLM's defaults where absent)",
                 "model": "a LoRA adapter's directory (engine_kwargs enable_lora)"})

    # --- One row ----------------------------------------------------------------------------------

    def row_name(self, row: dict, number: int) -> str:
        """How errors name the row: by its id (id_column), else by its request number."""
        if self.id_column is None:
            return f"row (request_id {number})"
        key = request_key(row.get(self.id_column))
        if not key:
            raise RequestError(f"row (request_id {number}) has no {self.id_column!r}")
        return f"row {key!r}"

    def messages_of(self, row: dict, name: str) -> list | None:
        """The row's chat messages, to be templated (None: none, or not templated)."""
        messages = row.get("messages")
        if messages is None or not self.chat_template:
            return None
        if not (isinstance(messages, list) and messages
                and all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages)):
            raise RequestError(f"{name}: messages must be a non-empty list of chat messages, each with a 'role'")
        return messages

    def prompt(self, row: dict, name: str) -> tuple[str, list[int]]:
        """The text prompt and its ids, as ray.data.llm's chat-template and tokenize stages make them."""
        tokenizer = self.engine.tokenizer
        if row.get("tokenized_prompt") is not None:
            ids = [int(t) for t in row["tokenized_prompt"]]
            return row.get("prompt") or "", ids
        if self.job_prompts:
            given = row["messages"] if row.get("messages") is not None else row.get("prompt")
            if given is None:
                raise RequestError(f"{name}: no prompt")
            return (given if isinstance(given, str) else ""), encode_prompt(tokenizer, given, "", name)
        messages = self.messages_of(row, name)
        if messages is not None:
            last_is_user = messages[-1].get("role") == "user"
            try:
                prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=last_is_user,
                                                       continue_final_message=not last_is_user,
                                                       chat_template=self.template, **self.template_kwargs)
            except Exception as error:  # a template's own errors are of any type
                raise RequestError(f"{name}: messages cannot be chat-templated: {error}") from error
        elif isinstance(row.get("prompt"), str):
            prompt = row["prompt"]
        elif row.get("prompt") is not None:
            raise RequestError(f"{name}: prompt must be text, got {type(row['prompt']).__name__}")
        else:
            need = "messages, prompt or tokenized_prompt" if self.chat_template else "prompt or tokenized_prompt"
            raise RequestError(f"{name}: the row has no {need}")
        ids = list(tokenizer(prompt)["input_ids"])
        if not ids:
            raise RequestError(f"{name}: the prompt is empty")
        return prompt, ids

    def request(self, row: dict, number: int) -> tuple[Request, str, str]:
        """(the row's request, its text prompt, the row's name for errors); a RequestError names the row."""
        name = self.row_name(row, number)
        seed = request_seed(self.seed, name) if self.seed is not None else None
        settings = sampling_of(row.get("sampling_params"), name, seed, self.vllm_keys)
        with self.tokenizer_lock:
            prompt, ids = self.prompt(row, name)
        return Request(str(number), ids, settings.max_tokens, settings.stop, settings.sampling,
                       settings.structured_outputs, settings.vllm_sampling, self.adapter(row, name)), prompt, name

    def adapter(self, row: dict, name: str) -> str | None:
        """The row's LoRA adapter: its `model`, where it names another than model_source (as
        ray.data.llm reads it: a local directory; vLLM needs engine_kwargs enable_lora)."""
        model = row.get("model")
        if model is None or model == self.config.model.name:
            return None
        if not isinstance(model, str) or not model:
            raise RequestError(f"{name}: model must be a LoRA adapter's directory (or model_source), got {model!r}")
        if "://" in model:
            raise RequestError(f"{name}: model {model!r}: a LoRA adapter is read from a local directory here "
                               "(dynamic_lora_loading_path is not taken); copy it to the nodes first")
        if not (Path(model) / "adapter_config.json").is_file():  # vLLM would fail its engine step, not the row
            raise RequestError(f"{name}: model {model!r} is neither model_source nor a LoRA adapter's directory "
                               "(one holding adapter_config.json) on this node")
        return model

    # --- A batch ----------------------------------------------------------------------------------

    def __call__(self, batch: pa.Table) -> pa.Table:
        started = time.time()
        out = self.generate(batch.to_pylist())
        self.report(out, [bool(row.get(INFERENCE_ERROR)) for row in out], started)
        generated = pa.Table.from_pylist(out, schema=pa.schema([f for f in GENERATED if f.name not in TYPED_BY_THE_DATA]))
        for name in TYPED_BY_THE_DATA:  # in GENERATED's order, each at its place
            generated = generated.add_column(GENERATED.get_field_index(name), name,
                                             convert_to_pyarrow_array([row.get(name) for row in out], name))
        kept = batch.drop_columns([name for name in GENERATED.names if name in batch.column_names])
        for column in generated.drop_columns(self.dropped).schema:
            kept = kept.append_column(column, generated.column(column.name))
        return kept

    def generate(self, rows: list[dict]) -> list[dict]:
        """One generated row per row, in order: the engine runs the good rows' requests together; a
        bad row gets an error row (or raises), the rest go on."""
        batch_uuid = uuid.uuid4().hex
        outputs: list = [None] * len(rows)
        made: dict[int, tuple] = {}
        for index, row in enumerate(rows):
            try:
                made[index] = self.request(row, next(self.request_ids))
            except RequestError as error:  # the message names the row already
                outputs[index] = self.failed(str(error), row.get("prompt"), batch_uuid)
        started = time.perf_counter()
        with torch.no_grad():
            results = self.engine.generate([request for request, _, _ in made.values()]) if made else []
        seconds = time.perf_counter() - started
        for (index, (request, prompt, name)), result in zip(made.items(), results):
            if isinstance(result, Failed):
                outputs[index] = self.failed(f"{name}: {result.message}", prompt, batch_uuid, request.adapter)
            else:
                outputs[index] = self.generated(request, prompt, result, batch_uuid, seconds)
        return outputs

    def generated(self, request: Request, prompt: str, result: Result, batch_uuid: str, seconds: float) -> dict:
        sampling = request.sampling
        row = {"prompt": prompt, "prompt_token_ids": request.prompt_ids, "num_input_tokens": len(request.prompt_ids),
               "generated_tokens": result.token_ids, "generated_text": result.text,
               "num_generated_tokens": len(result.token_ids), "request_id": int(request.request_id),
               "metrics": result.engine_metrics, "logprobs": result.logprobs, "prompt_logprobs": result.prompt_logprobs,
               # The request's own time in the engine (scheduled to its last token), as ray.data.llm's.
               "batch_uuid": batch_uuid, "time_taken_llm": result.stats.total_seconds or seconds,
               "params": result.params or (f"SamplingParams(max_tokens={request.max_new_tokens}, temperature="
                                           f"{sampling.temperature}, top_p={sampling.top_p}, top_k={sampling.top_k}, "
                                           f"seed={sampling.seed}, stop={list(request.stop)})"),
               "temperature": sampling.temperature, "top_k": sampling.top_k, "top_p": sampling.top_p,
               "seed": sampling.seed, INFERENCE_ERROR: ""}
        row.update(result.stats.as_row())
        row.update(self.settings)
        if request.adapter is not None:
            row["model"] = request.adapter  # what ran: the adapter on model_source
        return row

    def failed(self, message: str, prompt: Any, batch_uuid: str, adapter: str | None = None) -> dict:
        """ray.data.llm's error row (request_id -1, time_taken_llm -1), or the error raised."""
        if not self.continue_on_error:
            raise ValueError(message)
        return {"prompt": prompt if isinstance(prompt, str) else "", "num_input_tokens": 0, "generated_tokens": [],
                "generated_text": "", "num_generated_tokens": 0, "request_id": -1, "batch_uuid": batch_uuid,
                "time_taken_llm": -1.0, "params": "", INFERENCE_ERROR: message, **self.settings,
                **({"model": adapter} if adapter is not None else {})}

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


def ray_running() -> bool:
    import ray

    return ray.is_initialized()
