"""The Ray Data job: input -> pipeline.llm's processor (the job's rows turned into ray.data.llm's
form by its preprocess, pipeline/job_rows.py; the one stage of actors; the map back into the job's
schema) -> Parquet written by the workers. The job is a user of the processor: reading, checkpoints,
the Parquet and the summary are the job's; the model, the actors and the requests are the processor's.

Nothing funnels through the driver:
- the model is prepared where it runs: a Ray task with the actors' resources converts a GGUF file
  if need be, checks that the engine can run the model, and builds the drafter tables, which stay
  in the object store of its node with the datastore a drafter reads (every actor maps one
  read-only copy per node);
- the workers write the outputs with Ray Data's Parquet writer, one file per block, under
  <output>/run=<run_id>/ (local paths and s3://, gs://, abfs:// URIs through pyarrow.fs);
- resuming is Ray Data's checkpointing: the ids of the rows written are recorded under
  <output>/_checkpoints/run=<run_id>/ as they are written, and a rerun of the run id skips them on
  read, so a job killed half-way and started again writes every id exactly once;
- the run summary is a Ray Data aggregate over the run's files, plus what a small progress actor
  counted this time (rows, errors, tokens, when generation started and ended, which nodes).
"""
from __future__ import annotations

import dataclasses
import json
import resource
import time
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path

import ray
from ray.data.checkpoint import CheckpointConfig
from ray.data.context import ShuffleStrategy
from ray.data.checkpoint.checkpoint_filter import IdColumnCheckpointManager

from drafters.datastore import Datastore
from pipeline import storage
from pipeline.actor_pool import JobFailed, unplaceable
from pipeline.config import Config, InputConfig
from pipeline import job_rows, series, series_store
from pipeline.checkpoint import checkpoint_config as ids_checkpoint
from pipeline.llm import Processor
from pipeline.job_input import BadInput, check_columns, read_input
from pipeline.output_files import parquet_files, set_aside_unreadable, whole_files
from pipeline.progress import RunProgress, empty_totals

# Small and fractional on purpose, for every operator beside the actors (a column selection too):
# Ray Data's default is a whole CPU, which a node whose actors hold part of its CPUs never has
# free; such a task waits for ever, and the job with it (on 2 nodes of 1 CPU, with 2 actors of
# 0.5, a selection placed after the actors hung the run). So does a resumed run's checkpoint filter.
# (Ray's Parquet reader samples its files in tasks of a whole CPU, but when the read is built: before
# the actors start, or after they end.)
IO_CPUS = 0.25


def with_checked_datastore(config: Config) -> Config:
    """Opens the datastore once on the driver (a missing one fails now, not in every actor) and
    gives the job its absolute path; the task that prepares the model puts its arrays in the object
    store beside the tables, and the actors map that copy (none builds or reads its own)."""
    if not config.decoder.datastore:
        return config
    if storage.is_uri(config.decoder.datastore):  # copied to each node that runs actors, not here
        if storage.info(storage.join(config.decoder.datastore, "meta.json"), "decoder.datastore").type.name == "NotFound":
            raise JobFailed(f"decoder.datastore: {config.decoder.datastore!r} holds no datastore (no meta.json)")
        return config
    directory = Path(config.decoder.datastore).expanduser().resolve()
    Datastore.open(directory)
    return dataclasses.replace(config, decoder=dataclasses.replace(config.decoder, datastore=str(directory)))


# --- Resume: Ray Data's checkpointing ---------------------------------------------------------

def checkpoint_config(config: Config, run_id: str) -> CheckpointConfig:
    """Checkpoints of a run live beside the runs, not in the run's directory of outputs. A lone run
    records the ids it wrote (the output's `id` is the input's id column as the job names it:
    request_key); a series the fingerprints of its rows (pipeline/series.py), in one checkpoint
    shared by its runs, so each skips the rows written unchanged."""
    checkpoints = storage.join(storage.uri(config.job.output), "_checkpoints")
    if config.job.series:
        return ids_checkpoint("fingerprint", storage.join(checkpoints, f"series={config.job.series}", "rows"),
                              config.input.id_column, series.fingerprint_filter(config))
    return ids_checkpoint("id", storage.join(checkpoints, f"run={run_id}"), config.input.id_column)


def runs_root(config: Config) -> str:
    """Where the run directories are: <output>/, or <output>/series=<name>/."""
    output = storage.uri(config.job.output)
    return storage.join(output, f"series={config.job.series}") if config.job.series else output


def run_dir(config: Config, run_id: str) -> str:
    return storage.join(runs_root(config), f"run={run_id}")


def count_new(table, checkpoint: CheckpointConfig, ids: list) -> dict:
    """One input block's rows, and those whose id is not checkpointed (a one-row batch)."""
    kept = checkpoint.checkpoint_filter_cls(checkpoint, ids[0]).filter_rows_for_block(table)
    return {"rows": [len(table)], "new": [len(kept)]}


def count_input(config: Config, run_id: str, output: str, dataset: ray.data.Dataset) -> tuple[int, int]:
    """(the input's rows, those no finished write of this run, or of its series' fingerprint,
    holds), in one pass: Ray Data tasks count each block against the checkpointed ids in the object
    store, as Ray's own checkpoint filter reads them, so no set of ids is built on the driver."""
    checkpoint = checkpoint_config(config, run_id)
    if storage.info(checkpoint.checkpoint_path, "job.output").type.name != "NotFound":
        manager = IdColumnCheckpointManager(checkpoint, ray.data.DataContext.get_current())
        ids, _ = manager.load_checkpoint(output, storage.resolve(output)[0])
        if ids:
            counts = dataset.map_batches(count_new, fn_kwargs={"checkpoint": checkpoint, "ids": [ids]},  # the ref, not the array
                                         batch_format="pyarrow", batch_size=None, num_cpus=IO_CPUS)
            rows = new = 0
            for batch in counts.iter_batches(batch_size=None, batch_format="pyarrow"):
                rows, new = rows + sum(batch["rows"].to_pylist()), new + sum(batch["new"].to_pylist())
            return rows, new
    rows = dataset.count()
    return rows, rows


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
    except Exception as error:
        bad = bad_input(error)
        if bad is None:
            raise
        raise JobFailed(bad) from None  # the file and line, not the read task's traceback
    finally:
        context.use_datasource_v2, context.shuffle_strategy = in_use, shuffle


def bad_input(error: BaseException) -> str | None:
    """The message of a BadInput that `error` (a Ray task's error, however wrapped) comes from."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, BadInput):
            return str(error.args[0]) if error.args else str(error)
        seen.add(id(error))
        error = getattr(error, "cause", None) or error.__cause__ or error.__context__
    return None


def prepare_output(config: Config, output: str, checkpoint: CheckpointConfig) -> list[dict]:
    """Makes the run's directory, and sets aside the earlier outputs that cannot be read before
    anything reads them (pipeline/output_files.py): the checkpoint then no longer holds their ids,
    and this run generates them again. Returns what it set aside."""
    try:
        storage.make_directory(output, "job.output")
    except storage.StorageError as error:
        raise JobFailed(str(error)) from error
    return set_aside_unreadable(storage.uri(config.job.output), runs_root(config) if config.job.series else output,
                                checkpoint.checkpoint_path, checkpoint.id_column)


def generate_and_write(config: Config, run_id: str) -> dict:
    started, started_at = time.perf_counter(), time.time()
    config = with_checked_datastore(config)
    # A series drafts from the store of its earlier outputs; its rows' fingerprints come from `config`.
    drafting = series_store.with_series_store(config)
    if drafting is not config:  # the series' store: checked like a datastore the config names
        drafting = with_checked_datastore(drafting)
    output, checkpoint = run_dir(config, run_id), checkpoint_config(config, run_id)
    set_aside = prepare_output(config, output, checkpoint)
    dataset = read_input(config.input, IO_CPUS)
    check_columns(dataset, config.input)
    read_columns = job_rows.input_columns(config, dataset.schema().names)  # the rest stay unread
    # Counted so that a run that read part of its input never looks complete.
    input_rows, new_rows = count_input(config, run_id, output, dataset)
    rows_read = min(input_rows, config.input.limit) if config.input.limit else input_rows
    counts = {"fingerprint": series.settings_fingerprint(config), "input_rows": input_rows, "rows_read": rows_read,
              "seconds_to_first_batch": None, "series_store": None, "set_aside": set_aside}
    if new_rows == 0:  # nothing new (a finished run, or a series run over a corpus that did not grow)
        return write_run_summary(drafting, run_id, output, time.perf_counter() - started, empty_totals(), counts)
    engine = config.engine
    progress = RunProgress.remote(config.job.max_errored_rows, output, engine.max_restarts, engine.restart_window_s)
    # The job is a pipeline.llm processor: it prepares the model where the actors run, its
    # preprocess and postprocess turn the job's rows into the processor's and back, and the
    # checkpoint makes the read skip the rows this run (or its series) already wrote.
    processor = Processor(drafting, job_rows.stage_settings(config, run_id, live_metrics=True),
                          checkpoint, preprocess=job_rows.request_row(config),
                          postprocess=job_rows.output_table, preprocess_map_kwargs={"num_cpus": IO_CPUS},
                          postprocess_map_kwargs={"num_cpus": IO_CPUS}, progress=progress)
    try:
        # The columns read (a null one where a block has none): the native block, as read.
        dataset = dataset.map_batches(job_rows.with_columns, fn_kwargs={"names": read_columns}, batch_format=None,
                                      batch_size=None, zero_copy_batch=True, num_cpus=IO_CPUS)
        if config.input.limit:
            dataset = dataset.limit(config.input.limit)
        written = series.output_files(runs_root(config)) if config.job.series else {}
        if written:  # a changed row is drafted from its last output
            dataset = series.with_last_outputs(dataset, config, runs_root(config), written, IO_CPUS)
        outputs = processor(dataset)
        outputs.write_parquet(output, filesystem=whole_files(output), ray_remote_args={"num_cpus": IO_CPUS})
    except Exception as error:
        stopped = ray.get(progress.stop_reason.remote())
        if stopped:
            raise JobFailed(stopped) from error
        if "Timed out while starting actors" in str(error):
            raise unplaceable(config) from error
        raise
    this_time = ray.get(progress.totals.remote())
    # From the job's start to the first batch's: reading, placing actors (an autoscaler bringing a
    # node up) and loading the model.
    counts["seconds_to_first_batch"] = round(this_time["first_start"] - started_at, 2) if this_time["batches"] else None
    if config.job.series:  # the next run drafts from this one's outputs too
        counts["series_store"] = ray.get(series_store.extend_store.options(num_cpus=IO_CPUS).remote(
            config, runs_root(config)))
    return write_run_summary(drafting, run_id, output, time.perf_counter() - started, this_time, counts)


SUMS = {"generated_tokens": "num_generated_tokens", "target_calls": "num_target_calls",
        "forward_calls": "forward_call_share", "checked_draft_tokens": "num_checked_draft_tokens",
        "acceptance_probability_sum": "sum_acceptance_probability"}


def block_totals(table) -> dict:
    """One block's rows, errored rows and sums (a one-row batch)."""
    import pyarrow.compute as pc

    row = {"rows": [table.num_rows], "errored_rows": [table.num_rows - table.column("error").null_count],
           "changed_rows": [pc.sum(table.column("changed").cast("int64")).as_py() or 0]}
    row.update({name: [pc.sum(table.column(column)).as_py() or 0] for name, column in SUMS.items()})
    return row


def run_totals(output: str) -> dict:
    """Rows, errored rows, generated tokens, target calls (per request) and forward calls (shared
    calls counted once) in the run's files, summed per block by Ray Data tasks where the files
    are: one small row per block reaches the driver, never a row of the outputs. (Ray Data's
    `aggregate` gives the same through a hash shuffle that takes seconds even for a few rows:
    docs/benchmarks.md, "Figures behind the defaults".)"""
    filesystem = storage.resolve(output)[0]
    files = parquet_files(output)
    totals = {"rows": 0, "errored_rows": 0, "changed_rows": 0, **{name: 0 for name in SUMS}}
    if not files:
        return totals
    blocks = (ray.data.read_parquet(files, filesystem=filesystem, num_cpus=IO_CPUS)
              .select_columns(["error", "changed", *SUMS.values()], num_cpus=IO_CPUS)
              .map_batches(block_totals, batch_format="pyarrow", batch_size=None, num_cpus=IO_CPUS))
    for block in blocks.iter_batches(batch_size=None, batch_format="pyarrow"):
        for name in totals:
            totals[name] += sum(block.column(name).to_pylist())
    return totals


def write_run_summary(config: Config, run_id: str, output: str, wall: float, this_time: dict,
                      counts: dict) -> dict:
    """Whole-run counts come from the run's files; this invocation's from the progress actor."""
    after = run_totals(output)
    generated = this_time["generated_tokens"]
    generating = this_time["last_finish"] - this_time["first_start"] if this_time["batches"] else 0
    summary = {
        "run_id": run_id, "run_dir": output, "series": config.job.series or None,
        "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "rows": after["rows"], "errored_rows": after["errored_rows"], "generated_tokens": after["generated_tokens"],
        # Per request step (num_target_calls), and per forward call of the target (a call shared
        # by B requests counted once; null where the engine does not report it).
        "mean_tokens_per_call": round(after["generated_tokens"] / after["target_calls"], 4) if after["target_calls"] else None,
        "tokens_per_forward_call": round(after["generated_tokens"] / after["forward_calls"], 4) if after["forward_calls"] else None,
        # alpha over every checked draft token of the run (null when nothing was drafted).
        "acceptance_rate": (round(after["acceptance_probability_sum"] / after["checked_draft_tokens"], 4)
                            if after["checked_draft_tokens"] else None),
        # What produced the rows (series.settings_fingerprint of the config as given), the input,
        # and a series' store of earlier outputs after this run (pipeline/series_store.py).
        **counts,
        "rows_this_invocation": this_time["rows"], "rows_errored_this_invocation": this_time["errored_rows"],
        "rows_skipped_already_done": counts["rows_read"] - this_time["rows"],
        # A series: the run's rows regenerated because their input changed (drafted from their last
        # output), and those new to the series.
        "changed_rows": after["changed_rows"], "new_rows": after["rows"] - after["changed_rows"],
        "generated_tokens_this_invocation": generated,
        "wall_seconds": round(wall, 3),
        "tokens_per_second": round(generated / wall, 3) if wall > 0 else None,
        # From the first batch's start to the last one's end: start-up (reading, actors loading
        # the model) left out.
        "tokens_per_second_after_startup": round(generated / generating, 3) if generating > 0 else None,
        "rows_per_second_after_startup": round(this_time["rows"] / generating, 3) if generating > 0 else None,
        "actor_nodes": this_time["nodes"],
        # The engines' slots kept busy (summed over actors; null where the engine keeps no count):
        # mean running requests per step over max_num_seqs while input remained, all steps, the
        # seconds an engine waited with nothing to run while input remained, and the final drain.
        **{name: this_time[name] for name in ("engine_occupancy", "engine_steps", "engine_idle_seconds",
                                              "engine_drain_seconds", "engine_series")},
        "actor_peak_rss_mb": this_time["actor_peak_rss_mb"],  # the largest actor process's peak resident memory
        # Engines that failed inside a live actor and were built again (or their actor restarted).
        "engine_restarts": this_time["engine_restarts"],
        "driver_peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "settings": {section: asdict(getattr(config, section)) for section in ("model", "engine", "decoder", "input", "ray")},
    }
    storage.write_text(storage.join(output, "summary.json"), json.dumps(summary, indent=2, default=list) + "\n")
    return summary
