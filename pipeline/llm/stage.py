"""The generation stage: the one callable class Ray Data runs in an actor pool (`map_batches`), for
every processor (pipeline/llm/processor.py), the CLI job's included. It holds an engine (the model, tokenizer
and drafter, built once) and turns a batch of rows in ray.data.llm's form (`messages`, `prompt` or
`tokenized_prompt`, `sampling_params`) into the same rows with the generated columns of
pipeline/llm/schema.py. It does not know which engine it holds (pipeline/engines).

One prompt rule (pipeline/llm/prompts.py): `messages` chat-templated, a text `prompt` tokenized as it
is, `tokenized_prompt` taken as given; rows the processor's tokenize stage encoded come as ids.

One seed rule: a row's own `sampling_params.seed`; else, where a seed is configured, one derived
from it and the row's id (`id_column`: the same id and seed sample the same text, whichever path
and however Ray batched the rows), or without an id from its place among this actor's requests;
else a fresh one, as vLLM draws.

A row that cannot be generated raises, or, with `continue_on_error`, comes back with
`__inference_error__` naming the row and the cause, its generated columns empty as ray.data.llm's
are; the other rows of the batch go on. A row with `__bad_input__` (input that could not be read:
a caller's preprocess says why) is such a row, with that message.

The engine is the actor's EngineSlot's (engine_slot.py): built in the speculation mode the actor
chooses, replaced when it fails (its batches run again on the new one), built again for another
mode. More than engine.max_restarts failures within engine.restart_window_s stop the run
(EngineCrashLoop), naming the last failure.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa

from pipeline.loading.drafters import DrafterTables
from pipeline.config import Config
from pipeline.engines.base import Engine, EngineSteps, Failed, Request, Result
from pipeline.engines.errors import RequestError
from pipeline.engines import speculation
from pipeline.llm.engine_slot import EngineSlot
from pipeline.llm.metrics import RunMetrics
from pipeline.llm.progress import BatchReport, JobStopped, RestartWindow, peak_rss_mb
from pipeline.llm.prompts import encode_rows, prompt_of, take_encoded
from pipeline.llm.stage_settings import StageSettings
from pipeline.llm.row_values import prediction_text, python_value, request_key
from drafters.primitives.sampling import request_seed, sample_seed
from pipeline.llm.sampling_params import sampling_of
from pipeline.llm.schema import BAD_INPUT, GENERATED, INFERENCE_ERROR, STATISTICS, TYPED_BY_THE_DATA

logger = logging.getLogger(__name__)


class GenerationStage:
    """The engine's actor: a batch of rows in, one generated row per sample out.

    In: an Arrow batch of ray.data.llm's rows (`prompt`, `messages` or `tokenized_prompt`,
    `sampling_params`, ...). Out: the rows with ray.data.llm's columns (`generated_text`,
    `num_generated_tokens`, ...) and ours (the statistics) appended; with continue_on_error a bad
    row becomes an error row that names it, else it raises. The engine is built once per actor.
    `progress`: a run's RunProgress actor, told of each batch."""

    def __init__(
        self,
        config: Config,
        settings: StageSettings = StageSettings(),
        tables=None,
        engine: Engine | None = None,
        progress=None,
    ):
        if tables is not None and not isinstance(tables, DrafterTables):
            import ray  # an ObjectRef: the tables are put in the object store once

            tables = ray.get(tables)
        self.config = config
        self.settings = settings
        self.progress = progress
        self.tables = tables
        self.restarts = RestartWindow(config.engine.max_restarts, config.engine.restart_window_s)
        # Live metrics only from an actor Ray runs (not from a stage built outside Ray).
        live = settings.live_metrics and ray_running()
        self.metrics = RunMetrics(config.engine.name, settings.run_id) if live else None
        share = None if settings.expected_rows is None else -(-settings.expected_rows // config.ray.max_actors)
        chooser = speculation.chooser(config, share, settings.predictions)
        if engine is not None:  # given: it runs in its own mode
            chooser = speculation.Chooser(modes=(engine.columns()["drafter"],), expected_rows=share)
        self.slot = EngineSlot(config, tables, chooser, self.count_failure, engine)
        chosen = settings.statistics
        self.dropped = [] if chosen is None else [f.name for f in STATISTICS if f.name not in chosen]
        self.request_ids = itertools.count()
        # The same for every engine this stage builds (a failed one is replaced, another mode built).
        self.tokenizer = self.engine.tokenizer
        self.sampling = self.engine.sampling
        # Ray Data may run several batches on this actor at once (the vLLM engine takes them all):
        # the tokenizer is not to be shared between threads, and the step counts are reported in order.
        self.tokenizer_lock = threading.Lock()
        self.report_lock = threading.Lock()
        self.reported_steps = EngineSteps()
        self.reported_generation = 0

    @staticmethod
    def input_columns() -> tuple[dict[str, str], dict[str, str]]:
        """(required, optional) input columns and what each holds, as ray.data.llm logs them."""
        return (
            {
                "messages | prompt | tokenized_prompt": "chat messages (templated), a text prompt (tokenized as "
                "it is) or token ids: one of them"
            },
            {
                "sampling_params": "vLLM's SamplingParams keys (vLLM's defaults where absent)",
                "model": "a LoRA adapter's directory (engine_kwargs enable_lora)",
                "prediction": "text the answer is expected to resemble, or OpenAI's {'type': 'content', 'content': "
                "text or text parts}: drafted from first (vLLM engine)",
            },
        )

    # --- One row ----------------------------------------------------------------------------------

    def identify(self, row: dict, number: int) -> tuple[str, int | None]:
        """(how errors name the row, the seed it samples with when it gives none)."""
        id_column, seed = self.settings.id_column, self.settings.seed
        if id_column is None:
            return f"row (request_id {number})", None if seed is None else request_seed(seed, f"request {number}")
        key = request_key(row.get(id_column))
        if not key:
            raise RequestError(f"row (request_id {number}) has no {id_column!r}")
        return f"row {key!r}", None if seed is None else request_seed(seed, key)

    def requests(self, row: dict, encoded: tuple[str, list[int]] | None = None) -> tuple[list[Request], str, str]:
        """(the row's requests, one per sample of sampling_params.n, its text prompt, the row's name
        for errors); a RequestError names the row. Sample 0 samples with the row's seed, sample i
        with one derived from it and i: a seed is a text, with n = 1 or more. `encoded`: the row's
        text prompt and ids where its batch made them (encode_batch), else they are made here."""
        number = next(self.request_ids)
        name, seed = self.identify(row, number)
        if row.get(BAD_INPUT):  # input that could not be read (its message names the file and line)
            raise RequestError(f"{name}: {row[BAD_INPUT]}")
        wanted = sampling_of(row.get("sampling_params"), name, seed, self.sampling)
        if encoded is None:
            with self.tokenizer_lock:
                encoded = prompt_of(self.tokenizer, row, self.settings, name)
        prompt, ids = encoded
        first = Request(
            request_id=str(number),
            prompt_ids=ids,
            max_new_tokens=wanted.max_tokens,
            stop=wanted.stop,
            sampling=wanted.sampling,
            structured_outputs=wanted.structured_outputs,
            engine_sampling=wanted.engine_sampling,
            adapter=self.adapter(row, name),
            prediction=self.prediction(row, name),
        )
        others = [
            dataclasses.replace(
                first,
                request_id=str(next(self.request_ids)),
                sampling=dataclasses.replace(first.sampling, seed=sample_seed(first.sampling.seed, i)),
            )
            for i in range(1, wanted.n)
        ]
        return [first, *others], prompt, name

    def encode_batch(self, rows: list[dict]) -> list[tuple[str, list[int]] | None]:
        """encode_rows with this actor's tokenizer (not to be shared between threads)."""
        with self.tokenizer_lock:
            return encode_rows(self.tokenizer, rows, self.settings)

    def prediction(self, row: dict, name: str) -> tuple[int, ...]:
        """The row's `prediction` (text its answer is expected to resemble, or OpenAI's form of it) as
        token ids; () without one."""
        text = prediction_text(python_value(row.get("prediction")), name)
        if not text:
            return ()
        with self.tokenizer_lock:
            return tuple(self.tokenizer.encode(text, add_special_tokens=False))

    def adapter(self, row: dict, name: str) -> str | None:
        """The row's LoRA adapter: its `model`, where it names another than model_source (as
        ray.data.llm reads it: a local directory; vLLM needs engine_kwargs enable_lora)."""
        model = row.get("model")
        if model is None or model == self.config.model.name:
            return None
        if not isinstance(model, str) or not model:
            raise RequestError(f"{name}: model must be a LoRA adapter's directory (or model_source), got {model!r}")
        if "://" in model:
            raise RequestError(
                f"{name}: model {model!r}: a LoRA adapter is read from a local directory here "
                "(dynamic_lora_loading_path is not taken); copy it to the nodes first"
            )
        if not (Path(model) / "adapter_config.json").is_file():  # vLLM would fail its engine step, not the row
            raise RequestError(
                f"{name}: model {model!r} is neither model_source nor a LoRA adapter's directory "
                "(one holding adapter_config.json) on this node"
            )
        return model

    # --- A batch ----------------------------------------------------------------------------------

    def __call__(self, batch: pa.Table) -> pa.Table:
        started = time.time()
        batch, encoded = take_encoded(batch)
        out, of_row = self.generate_samples(batch.to_pylist(), encoded)
        self.report(out, [bool(row.get(INFERENCE_ERROR)) for row in out], started, len(batch))
        return with_generated_columns(batch.take(of_row), out, self.dropped)

    def generate(self, rows: list[dict]) -> list[dict]:
        """generate_samples' rows (one per row where each asks for one sample)."""
        return self.generate_samples(rows)[0]

    def generate_samples(self, rows: list[dict], encoded: list | None = None) -> tuple[list[dict], list[int]]:
        """A generated row per sample of each row (sampling_params.n, one by default) in order, and
        the row each came from. The engine runs the good rows' requests together, a row's samples
        side by side (drafting from each other as they go); a bad row gets one error row (or raises),
        the rest go on. The batch then counts towards the actor's choice of speculation mode.
        `encoded`: the rows' prompts as the tokenize stage encoded them (prompts.take_encoded)."""
        batch_uuid = uuid.uuid4().hex
        outputs: list[list[dict]] = [[] for _ in rows]
        made: list[tuple[int, int, Request, str, str]] = []  # (row, sample, request, prompt, name)
        encoded = self.encode_batch(rows) if encoded is None else encoded
        for index, row in enumerate(rows):
            try:
                requests, prompt, name = self.requests(row, encoded[index])
            except RequestError as error:  # the message names the row already
                outputs[index].append(self.failed(str(error), row.get("prompt"), batch_uuid))
                continue
            made += [(index, sample, request, prompt, name) for sample, request in enumerate(requests)]
        if made:
            requests = [request for _, _, request, _, _ in made]
            started = time.perf_counter()
            results, ran = self.slot.run(requests)
            seconds = time.perf_counter() - started
            for (index, sample, request, prompt, name), result in zip(made, results):
                outputs[index].append(
                    self.failed(f"{name}: {result.message}", prompt, batch_uuid, request.adapter, sample)
                    if isinstance(result, Failed)
                    else self.generated(request, prompt, result, batch_uuid, seconds, ran, sample)
                )
            self.slot.observe(requests, results, ran["drafter"])
        return [out for row in outputs for out in row], [index for index, row in enumerate(outputs) for _ in row]

    @property
    def engine(self) -> Engine | None:
        """The engine now (None while one is being replaced)."""
        return self.slot.engine

    @property
    def current(self) -> tuple[Engine | None, int]:
        """The engine now and how many were built before it."""
        return self.slot.current

    @property
    def chooser(self) -> speculation.Chooser:
        return self.slot.chooser

    def count_failure(self, cause: str) -> str | None:
        """Counts an engine failure in the one restart window that decides a crash loop (and tells
        the metrics); returns why the run must stop, if it must. The window is the run's progress
        actor's where there is one (the job's: it outlives this actor's process, which a hung
        engine ends), else this stage's own."""
        if self.metrics is not None:
            self.metrics.engine_failed()
        if self.progress is None:
            return self.restarts.record(cause)
        import ray

        return ray.get(self.progress.engine_failed.remote(ray.get_runtime_context().get_actor_id() or "", cause))

    def generated(
        self, request: Request, prompt: str, result: Result, batch_uuid: str, seconds: float, ran: dict, sample: int = 0
    ) -> dict:
        sampling = request.sampling
        row = {
            "prompt": prompt,
            "prompt_token_ids": request.prompt_ids,
            "generated_tokens": result.token_ids,
            "generated_text": result.text,
            "request_id": int(request.request_id),
            "sample_index": sample,
            "metrics": result.engine_metrics,
            "logprobs": result.logprobs,
            "prompt_logprobs": result.prompt_logprobs,
            "batch_uuid": batch_uuid,
            "params": result.params,
            "temperature": sampling.temperature,
            "top_k": sampling.top_k,
            "top_p": sampling.top_p,
            "seed": sampling.seed,
            INFERENCE_ERROR: "",
            **result.stats.as_row(),
            **ran,
        }
        row["time_taken_llm"] = row["time_taken_llm"] or seconds  # an engine that does not time each request
        if request.adapter is not None:
            row["model"] = request.adapter  # what ran: the adapter on model_source
        return row

    def failed(self, message: str, prompt: Any, batch_uuid: str, adapter: str | None = None, sample: int = 0) -> dict:
        """ray.data.llm's error row (request_id -1, time_taken_llm -1), or the error raised."""
        if not self.settings.continue_on_error:
            raise ValueError(message)
        return {
            "prompt": prompt if isinstance(prompt, str) else "",
            "num_input_tokens": 0,
            "generated_tokens": [],
            "generated_text": "",
            "num_generated_tokens": 0,
            "request_id": -1,
            "sample_index": sample,
            "batch_uuid": batch_uuid,
            "time_taken_llm": -1.0,
            "params": "",
            INFERENCE_ERROR: message,
            **self.slot.ran,
            **({"model": adapter} if adapter is not None else {}),
        }

    def report(self, rows: list[dict], errored: list[bool], started: float, input_rows: int) -> None:
        """Tells Ray's metrics and the run's progress actor about a finished batch (`rows`: its output
        rows, a row's samples each one, `errored`: which failed; `input_rows`: the rows it was
        given); stops the run when the progress actor says so."""
        if self.progress is None and self.metrics is None:
            return
        import ray

        context = ray.get_runtime_context()
        done = [row for row, failed in zip(rows, errored) if not failed]
        with self.report_lock:
            engine, generation = self.current
            if generation != self.reported_generation:  # a new engine counts its steps from 0
                self.reported_steps = EngineSteps()
                self.reported_generation = generation
            steps = engine.steps() if engine is not None else None
            with self.slot.choice_lock:
                chosen = self.chooser.report()
            batch = BatchReport(
                rows=len(rows),
                input_rows=input_rows,
                errored_rows=sum(errored),
                generated_tokens=sum(row.get("num_generated_tokens") or 0 for row in done),
                target_calls=sum(row.get("num_target_calls") or 0 for row in done),
                started=started,
                finished=time.time(),
                node=context.get_node_id(),
                actor=f"{context.get_actor_id() or ''}/{os.getpid()}/{generation}",
                engine_steps=steps,
                peak_rss_mb=peak_rss_mb(),
                speculation=chosen,
            )
            if self.metrics is not None:
                accepted = sum(
                    length * count
                    for row in done
                    for length, count in enumerate(row.get("accepted_length_histogram") or [])
                )
                self.metrics.record(
                    {**vars(batch), "accepted_draft_tokens": accepted},
                    steps,
                    self.reported_steps,
                    chosen["mode"],
                    len(chosen["switches"]),
                )
            self.reported_steps = steps or self.reported_steps
        if self.progress is not None:
            stop = ray.get(self.progress.report.remote(batch))
            if stop:
                raise JobStopped(stop)


def with_generated_columns(batch: pa.Table, rows: list[dict], dropped: list[str]) -> pa.Table:
    """The batch's own columns (any of the generated ones it had replaced), then the generated
    columns in GENERATED's order and types, but `dropped`; those typed by the data as Ray Data
    converts them."""
    from ray.data._internal.tensor_extensions.arrow import convert_to_pyarrow_array

    fixed = pa.schema([f for f in GENERATED if f.name not in TYPED_BY_THE_DATA])
    generated = pa.Table.from_pylist(rows, schema=fixed)
    for name in TYPED_BY_THE_DATA:  # in GENERATED's order, each at its place
        generated = generated.add_column(
            GENERATED.get_field_index(name), name, convert_to_pyarrow_array([row.get(name) for row in rows], name)
        )
    present = set(batch.column_names)  # (a new list at each read)
    kept = batch.drop_columns([name for name in GENERATED.names if name in present])
    for column in generated.drop_columns(dropped).schema:
        kept = kept.append_column(column, generated.column(column.name))
    return kept


def ray_running() -> bool:
    import ray

    return ray.is_initialized()
