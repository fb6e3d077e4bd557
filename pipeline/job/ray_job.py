"""The Ray Data job: input -> pipeline.llm's processor (the job's rows turned into ray.data.llm's
form by its preprocess, pipeline/job/rows.py; the one stage of actors; the map back into the job's
schema) -> Parquet written by the workers. The job is a user of the processor: reading, checkpoints,
the Parquet and the summary are the job's; the model, the actors and the requests are the processor's.

A run is three values (pipeline/job/run.py): its plan, made once at the start (its paths, the config
its rows come from and the one its actors draft with, the settings' fingerprint, the checkpoint),
what it found before generating (the input's rows, those not yet written, the earlier output files
set aside), and its summary, written once at the end. Every step below reads the plan.

Nothing funnels through the driver:
- the model is prepared where it runs: a Ray task with the actors' resources converts a GGUF file
  if need be, checks that the engine can run the model, and builds the drafter tables, which stay
  in the object store of its node with the datastore a drafter reads (every actor maps one
  read-only copy per node);
- the workers write the outputs with Ray Data's Parquet writer, one file per block, under
  <output>/run=<run_id>/ (local paths and s3://, gs://, abfs:// URIs through pyarrow.fs), each
  file whole (pipeline/job/output_files.py);
- resuming is Ray Data's checkpointing: the ids of the rows written are recorded under
  <output>/_checkpoints/run=<run_id>/ as they are written, and a rerun of the run id skips them on
  read, so a job killed half-way and started again writes every id exactly once;
- the run summary is a Ray Data aggregate over the run's files, plus what a small progress actor
  counted this time (rows, errors, tokens, when generation started and ended, which nodes).
"""

from __future__ import annotations

import dataclasses
import time
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
import ray
from ray import ObjectRef
from ray.data.checkpoint import CheckpointConfig
from ray.data.context import ShuffleStrategy

from drafters.datastore import Datastore
from pipeline import storage
from pipeline.engines.build import checked_config, engine_kind, run_batch_size
from pipeline.llm.actor_pool import start_preparing, unplaceable
from pipeline.llm.errors import JobFailed
from pipeline.config import Config
from pipeline.job import rows as job_rows, series, series_store
from pipeline.llm.checkpoint import FilteredUpstream, WrittenKeysManager, checkpoint_config as ids_checkpoint
from pipeline.llm import Processor
from pipeline.job.inputs import check_columns, input_names, read_input
from pipeline.job import openai_batch
from pipeline.job.output_files import parquet_files, readable_columns, set_aside_unreadable, whole_files
from pipeline.llm.progress import RunProgress, empty_totals
from pipeline.job.run import Reading, Resolved, RunPaths, RunPlan, RunSummary
from pipeline.job.block_counts import SUMS, block_totals, carried_rows, count_block, unwritten_columns

# Small and fractional on purpose, for every operator beside the actors (a column selection too):
# Ray Data's default is a whole CPU, which a node whose actors hold part of its CPUs never has
# free; such a task waits for ever, and the job with it (on 2 nodes of 1 CPU, with 2 actors of
# 0.5, a selection placed after the actors hung the run). So does a resumed run's checkpoint filter.
# (Ray's Parquet reader samples its files in tasks of a whole CPU, but when the read is built: before
# the actors start, or after they end.)
IO_CPUS = 0.25


def checked_datastore(datastore: str) -> str:
    """Checks the datastore's files once on the driver (a missing one fails now, not in every
    actor; its arrays are not read here) and gives the job its absolute path; the task that
    prepares the model puts its arrays in the object store beside the tables, and the actors map
    that copy (none builds or reads its own)."""
    if not datastore:
        return datastore
    if storage.is_uri(datastore):  # copied to each node that runs actors, not here
        if storage.info(storage.join(datastore, "meta.json"), "drafting.datastore").type.name == "NotFound":
            raise JobFailed(f"drafting.datastore: {datastore!r} holds no datastore (no meta.json)")
        return datastore
    directory = Path(datastore).expanduser().resolve()
    Datastore.check(directory)  # its files, not its arrays: the driver holds none of them
    return str(directory)


# --- The plan: what the run does, decided once at its start ----------------------------------


def make_plan(config: Config, run_id: str) -> RunPlan:
    """The run's paths, its config (its datastore checked), the settings' fingerprint, the
    checkpoint, and the datastore the actors draft from (a series drafts from its store of earlier
    outputs, checked like a datastore the config names)."""
    config = dataclasses.replace(
        config, drafting=dataclasses.replace(config.drafting, datastore=checked_datastore(config.drafting.datastore))
    )
    paths = RunPaths.of(config, run_id)
    datastore = series_store.series_datastore(config, paths.store)
    if datastore != config.drafting.datastore:
        datastore = checked_datastore(datastore)
    fingerprint = series.settings_fingerprint(config)
    keys = series.fingerprint_filter(config, fingerprint) if config.job.series else None
    checkpoint = run_checkpoint(paths, config.input.id_column, keys)
    return RunPlan(config, paths, fingerprint, checkpoint, Resolved(datastore=datastore))


def run_checkpoint(paths: RunPaths, id_column: str, fingerprints: type | None) -> CheckpointConfig:
    """Checkpoints of a run live beside the runs, not in the run's directory of outputs. A lone run
    records the ids it wrote (the output's `id` is the input's id column as the job names it:
    request_key); a series the fingerprints of its rows (`fingerprints`, its filter:
    pipeline/job/series.py), in one checkpoint shared by its runs, so each skips the rows written
    unchanged. The job filters its input itself (read_plan), so Ray's read filter is given no keys
    (FilteredUpstream)."""
    if fingerprints is not None:
        return ids_checkpoint("fingerprint", paths.checkpoints, id_column, fingerprints, FilteredUpstream)
    return ids_checkpoint("id", paths.checkpoints, id_column, manager_cls=FilteredUpstream)


def written_keys(plan: RunPlan) -> ObjectRef | None:
    """The keys this run (or its series) has written, loaded once, after the pending records of a
    write that was killed are cleaned up: in the object store, for the tasks that count and filter
    the input (None: nothing written yet)."""
    checkpoint, output = plan.checkpoint, plan.paths.run_dir
    if storage.info(checkpoint.checkpoint_path, "job.output").type.name == "NotFound":
        return None
    manager = WrittenKeysManager(checkpoint, ray.data.DataContext.get_current())
    return manager.load_checkpoint(output, storage.resolve(output)[0])[0]


@dataclasses.dataclass
class Counted:
    """The input counted (count_input): its rows, those not written, its bad lines with the first
    one's message, and the unwritten rows themselves where every block carried them back
    (block_counts.count_block) within CARRIED_TOTAL bytes in all (None otherwise)."""

    rows: int = 0
    new: int = 0
    bad: int = 0
    first_bad: str | None = None
    carried: list | None = dataclasses.field(default_factory=list)
    carried_bytes: int = 0

    def add(self, batch) -> None:
        for rows, new, bad, first_bad, blob in zip(*(batch[name].to_pylist() for name in COUNT_COLUMNS)):
            self.rows += rows
            self.new += new
            self.bad += bad
            self.first_bad = self.first_bad or first_bad
            if self.carried is None or not new:
                continue
            if blob is None or self.carried_bytes + len(blob) > CARRIED_TOTAL:
                self.carried = None  # read again as the actors take them
                continue
            self.carried.append(blob)
            self.carried_bytes += len(blob)


COUNT_COLUMNS = ("rows", "new", "bad", "first_bad", "carried")
CARRIED_TOTAL = 256 << 20  # the unwritten rows the driver holds at most, to generate from


def count_input(plan: RunPlan, dataset: ray.data.Dataset, unwritten: dict) -> Counted:
    """The input counted in one pass (Counted): Ray Data tasks count each block against the written
    keys in the object store (`unwritten`: block_counts' keywords), so no set of ids is built on the
    driver, and bring back its unwritten rows where they are few. With input.on_bad_line fail, a
    bad line stops the run here, before any actor starts."""
    counts = dataset.map_batches(
        count_block, fn_kwargs=unwritten, batch_format="pyarrow", batch_size=None, num_cpus=IO_CPUS
    )
    counted = Counted()
    for batch in counts.iter_batches(batch_size=None, batch_format="pyarrow"):
        counted.add(batch)
    if counted.bad and plan.config.input.on_bad_line == "fail":
        raise JobFailed(
            f"{counted.first_bad} ({counted.bad} bad line{'s' * (counted.bad > 1)} in all; input.on_bad_line: "
            "fail, and 'error_row' writes an error row for each instead)"
        )
    return counted


# --- The run ----------------------------------------------------------------------------------


def new_run_id() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def run_job(config: Config, run_id: str) -> dict:
    """Runs the job, or the rest of it (a run id seen before resumes); returns its summary."""
    context = ray.data.DataContext.get_current()
    # Ray 2.60's Parquet reader (datasource v2, its default) starts FooterReader actors for every
    # read: a process each, asking a whole CPU, SPREAD over nodes; beside an actor pool on a small
    # node they wait for a CPU. The run reads Parquet several times (input, checkpoints, totals);
    # the task-based reader (v1) reads the same rows with no actors.
    in_use, context.use_datasource_v2 = context.use_datasource_v2, False
    # A series groups the rows to generate with its earlier outputs by id (series.py): Ray 2.60's
    # default shuffle keeps aggregator actors holding CPUs until the shuffle ends, which the
    # actor pool downstream of it waits for; the sort-based shuffle runs as tasks.
    shuffle, context.shuffle_strategy = context.shuffle_strategy, ShuffleStrategy.SORT_SHUFFLE_PULL_BASED
    try:
        return generate_and_write(config, run_id)
    finally:
        context.use_datasource_v2, context.shuffle_strategy = in_use, shuffle


def prepare_output(plan: RunPlan) -> list[dict]:
    """Makes the run's directory, and sets aside the earlier outputs that cannot be read before
    anything reads them (pipeline/job/output_files.py): the checkpoint then no longer holds their ids,
    and this run generates them again. Returns what it set aside."""
    paths = plan.paths
    try:
        storage.make_directory(paths.run_dir, "job.output")
    except storage.StorageError as error:
        raise JobFailed(str(error)) from error
    return set_aside_unreadable(paths.output, paths.earlier_outputs, paths.checkpoints, plan.checkpoint.id_column)


def generated_from(counted: Counted) -> ray.data.Dataset | None:
    """The unwritten rows the count carried back, as the dataset the run generates (a block each
    as read); None where it did not carry them all, or their blocks' columns do not agree."""
    if not counted.carried:
        return None
    try:
        tables = carried_rows(counted.carried)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        return None
    return ray.data.from_arrow(tables)


def read_plan(plan: RunPlan, set_aside: list[dict]) -> tuple[ray.data.Dataset, Reading]:
    """The input, only the columns the job reads, and what the run found before generating
    (`set_aside`: prepare_output's)."""
    config = plan.config
    dataset = read_input(config.input, IO_CPUS)
    names = input_names(dataset, config.input)
    if names:  # an input with no rows has no columns to check: the run reads nothing and ends
        check_columns(names, config.input)
    columns = job_rows.input_columns(config.input, names)  # the rest stay unread
    keys = written_keys(plan)
    unwritten = {"checkpoint": plan.checkpoint if keys else None, "keys": [keys]}  # the ref, not the array
    # Counted so that a run that read part of its input never looks complete.
    counted = count_input(plan, dataset, {**unwritten, "names": columns})
    input_rows, new_rows = counted.rows, counted.new
    rows_read = min(input_rows, config.input.limit) if config.input.limit else input_rows
    reading = Reading(
        input_rows, rows_read, new_rows, set_aside, "prediction" in columns, openai_batch.REQUEST in columns
    )
    carried = None if config.input.limit else generated_from(counted)
    if carried is not None:  # the few unwritten rows the count brought back: the input is read once
        return carried, reading
    # The rows not written yet, only the columns read (a null one where a block has none), in the
    # read's own tasks (no filter actor beside the engines').
    dataset = dataset.map_batches(
        unwritten_columns,
        fn_kwargs={"names": columns, **unwritten},
        batch_format=None,
        batch_size=None,
        num_cpus=IO_CPUS,
    )
    if config.input.limit:
        # The input's first rows: Ray splits a small read into blocks whose tasks may finish in
        # any order, and a limit takes the rows that reach it first (this dataset's context only).
        dataset.context.execution_options.preserve_order = True
        dataset = dataset.limit(config.input.limit)
    return dataset, reading


def generate_and_write(config: Config, run_id: str) -> dict:
    started, started_at = time.perf_counter(), time.time()
    plan = make_plan(config, run_id)
    # The model is prepared where the actors run while the input is read and counted.
    preparing = start_preparing(checked_config(plan.actor_config))
    set_aside = prepare_output(plan)
    # So is a series' index of its last outputs (after the unreadable ones are set aside).
    last = series.last_outputs(plan.paths.runs_root, plan.paths.outputs_index, IO_CPUS) if config.job.series else None
    dataset, reading = read_plan(plan, set_aside)
    if reading.new_rows == 0:  # nothing new (a finished run, or a series run over a corpus that did not grow)
        ray.cancel(preparing.report)
        if last:
            ray.cancel(last.index)
        return summary_of(plan, reading, empty_totals(), time.perf_counter() - started, None, None)
    config, paths = plan.config, plan.paths
    engine = config.engine
    progress = RunProgress.remote(
        config.job.max_errored_rows, paths.run_dir, engine.max_restarts, engine.restart_window_s
    )
    # The job is a pipeline.llm processor: it prepares the model where the actors run, its
    # preprocess and postprocess turn the job's rows into the processor's and back, and the
    # checkpoint makes the read skip the rows this run (or its series) already wrote.
    # The stage's speculation mode reads how many rows it will generate, and whether they carry
    # predictions (their own, or a series' last outputs).
    rows = min(reading.new_rows, config.input.limit or reading.new_rows)
    expected = rows * config.sampling.n  # requests
    plan = with_run_batches(plan, rows)
    settings = job_rows.stage_settings(config, run_id, True, expected, reading.predicted or last is not None)
    processor = Processor(
        config=plan.actor_config,
        settings=settings,
        checkpoint=plan.checkpoint,
        preprocess=job_rows.request_row(config, plan.fingerprint),
        postprocess=job_rows.output_table,
        preprocess_map_kwargs={"num_cpus": IO_CPUS},
        postprocess_map_kwargs={"num_cpus": IO_CPUS},
        progress=progress,
        preparing=preparing,
        tokenize=True,
    )
    try:
        if last:  # a changed row is drafted from its last output
            dataset = series.with_last_outputs(dataset, config, last, IO_CPUS)
        processor(dataset).write_parquet(
            paths.run_dir, filesystem=whole_files(paths.run_dir), ray_remote_args={"num_cpus": IO_CPUS}
        )
    except Exception as error:
        stopped = ray.get(progress.stop_reason.remote())
        if stopped:
            raise JobFailed(stopped) from error
        if "Timed out while starting actors" in str(error):
            raise unplaceable(config.ray) from error
        raise
    this_time = ray.get(progress.totals.remote())
    first_batch = round(this_time["first_start"] - started_at, 2) if this_time["batches"] else None
    store = None
    if config.job.series:  # the next run drafts from this one's outputs too
        store = ray.get(series_store.extend_store.options(num_cpus=IO_CPUS).remote(config, paths))
    return summary_of(plan, reading, this_time, time.perf_counter() - started, first_batch, store)


def with_run_batches(plan: RunPlan, rows: int) -> RunPlan:
    """The plan whose actors take batches of ray.batch_size rows: as set, or for auto the engine's
    batch grown for a run of `rows` (run_batch_size). The summary records the size that ran."""
    config = plan.actor_config
    batch = config.ray.batch_size or run_batch_size(
        engine_kind(config.engine.name).batch_size(config), rows, config.ray.max_actors
    )
    return dataclasses.replace(plan, resolved=dataclasses.replace(plan.resolved, batch_size=batch))


def write_openai_outputs(paths: RunPaths) -> dict:
    """OpenAI's batch output and error files of the whole run (every invocation's rows, each
    custom_id once), from its Parquet files, a file at a time (a request's samples are in one file)."""

    def blocks():
        for path in parquet_files(paths.run_dir):
            filesystem, inner = storage.resolve(path)
            table = readable_columns(filesystem, inner, list(openai_batch.OUTPUT_COLUMNS))
            if table is not None:
                yield table.to_pylist()

    return openai_batch.write_outputs(paths.run_dir, paths.run_id, blocks())


def run_totals(output: str) -> dict:
    """Rows, errored rows, generated tokens, target calls (per request) and forward calls (shared
    calls counted once) in the run's files, summed per block by Ray Data tasks where the files
    are: one small row per block reaches the driver, never a row of the outputs. (Ray Data's
    `aggregate` gives the same through a hash shuffle that takes seconds even for a few rows:
    docs/measurements/defaults.md, "Figures behind the defaults".)"""
    filesystem = storage.resolve(output)[0]
    files = parquet_files(output)
    totals = {"rows": 0, "errored_rows": 0, "changed_rows": 0, **{name: 0 for name in SUMS}}
    if not files:
        return totals
    blocks = (
        ray.data.read_parquet(files, filesystem=filesystem, num_cpus=IO_CPUS)
        .select_columns(["error", "changed", *SUMS.values()], num_cpus=IO_CPUS)
        .map_batches(block_totals, batch_format="pyarrow", batch_size=None, num_cpus=IO_CPUS)
    )
    for block in blocks.iter_batches(batch_size=None, batch_format="pyarrow"):
        for name in totals:
            totals[name] += sum(block.column(name).to_pylist())
    return totals


def summary_of(
    plan: RunPlan, reading: Reading, this_time: dict, wall: float, first_batch: float | None, store: dict | None
) -> dict:
    """The run's summary (whole-run counts from its files, this invocation's from the progress
    actor), written to summary.json, with OpenAI's batch files where the input was one; returned as written."""
    after = run_totals(plan.paths.run_dir)
    batch = write_openai_outputs(plan.paths) if reading.openai_batch else None
    return RunSummary.of(plan, reading, after, this_time, wall, first_batch, store, batch).write()
