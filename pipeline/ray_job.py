"""The Ray Data job: input shards -> actor pool of GenerationStage -> Parquet parts of a run.

Outputs of a run live in <output>/run=<run_id>/ as part files, each written to a temporary name
and renamed when complete. Re-running a run id reads the ids in its complete parts and skips
them, so a job killed half-way and started again writes every id exactly once.
"""
from __future__ import annotations

import dataclasses
import glob
import json
import os
import time
import uuid
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.compute  # noqa: F401  (pa.compute)
import pyarrow.parquet as pq
import ray

from drafters.datastore import Datastore
from drafters.registry import build_tables, needs_model_tables
from pipeline.config import Config, InputConfig
from pipeline.engines.build import ModelRefused, check_engine_can_run
from pipeline.model_loading import cache_root, load_model, resolve_model_dir
from pipeline.output import summarize
from pipeline.prompts import load_prompts
from pipeline.stage import GenerationStage

BUILTIN_DATASETS = ("humaneval", "gsm8k")
PART_GLOB = "part-*.parquet"


class JobFailed(RuntimeError):
    """The job stopped on purpose (too many errored rows, unusable input); the message says why."""


def input_files(source: InputConfig) -> list[str] | str:
    path = source.path
    if any(ch in path for ch in "*?["):
        files = sorted(glob.glob(path))
        if not files:
            raise JobFailed(f"input.path: the glob {path!r} matches no file")
        return files
    if not os.path.exists(path):
        raise JobFailed(f"input.path: {path!r} does not exist (nor is it one of {', '.join(BUILTIN_DATASETS)})")
    return path


def input_format(source: InputConfig, files) -> str:
    if source.format != "auto":
        return source.format
    first = files[0] if isinstance(files, list) else files
    if os.path.isdir(first):
        if os.path.exists(os.path.join(first, "dataset_info.json")) or os.path.exists(os.path.join(first, "state.json")):
            return "hf_dataset"
        names = os.listdir(first)
        first = next((n for n in sorted(names) if not n.startswith((".", "_"))), "")
    for suffix, kind in ((".jsonl", "jsonl"), (".json", "jsonl"), (".parquet", "parquet"), (".csv", "csv")):
        if first.endswith(suffix):
            return kind
    raise JobFailed(f"input.path: cannot tell the format of {first!r}; set input.format to jsonl, parquet, csv or hf_dataset")


def read_input(source: InputConfig) -> ray.data.Dataset:
    if source.path in BUILTIN_DATASETS:
        prompts = load_prompts(source.path)
        dataset = ray.data.from_items([{source.id_column: p.request_id, source.prompt_column or "prompt": p.prompt}
                                       for p in prompts])
    else:
        files = input_files(source)
        kind = input_format(source, files)
        if kind == "jsonl":
            dataset = ray.data.read_json(files, lines=True, file_extensions=["jsonl", "json"])
        elif kind == "parquet":
            dataset = ray.data.read_parquet(files, file_extensions=["parquet"])
        elif kind == "csv":
            dataset = ray.data.read_csv(files, file_extensions=["csv"])
        else:
            import datasets
            dataset = ray.data.from_huggingface(datasets.load_from_disk(files if isinstance(files, str) else files[0]))
    return dataset


def check_columns(dataset: ray.data.Dataset, source: InputConfig) -> None:
    names = dataset.schema().names
    for setting, column in (("input.id_column", source.id_column),
                            ("input.prompt_column" if source.prompt_column else "input.messages_column",
                             source.prompt_column or source.messages_column)):
        if column not in names:
            raise JobFailed(f"{setting}: the input has no column {column!r}; its columns are {names}")


def completed_ids(run_dir: Path) -> set[str]:
    """Ids in the run's complete parts; leftovers of a killed write are removed."""
    for leftover in run_dir.glob(".part-*.tmp"):
        leftover.unlink()
    done: set[str] = set()
    for part in sorted(run_dir.glob(PART_GLOB)):
        done.update(str(i) for i in pq.read_table(part, columns=["id"]).column("id").to_pylist() if i is not None)
    return done


def write_part(table: pa.Table, run_dir: Path) -> Path:
    name = f"part-{int(time.time() * 1000):013d}-{uuid.uuid4().hex[:8]}.parquet"
    staging = run_dir / f".{name}.tmp"
    pq.write_table(table, staging)
    final = run_dir / name
    os.replace(staging, final)  # atomic: readers and resumes only ever see complete parts
    return final


def shared_tables(config: Config):
    """Builds (or loads from the disk cache) the drafter tables once, and puts them in the object store."""
    if not needs_model_tables(config.decoder):
        return None
    loaded = load_model(config.model)
    tables = build_tables(loaded.model, loaded.tokenizer, loaded.fingerprint, config.decoder, cache_root(config.model))
    return ray.put(tables.as_plain_arrays())


def with_checked_datastore(config: Config) -> Config:
    """Opens the datastore once on the driver (a missing one fails now, not in every actor) and
    gives the actors its absolute path: they map the same files, none builds or copies its own."""
    if not config.decoder.datastore:
        return config
    directory = Path(config.decoder.datastore).expanduser().resolve()
    Datastore.open(directory)
    return dataclasses.replace(config, decoder=dataclasses.replace(config.decoder, datastore=str(directory)))


def new_run_id() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def run_job(config: Config, run_id: str) -> dict:
    started = time.perf_counter()
    config = with_checked_datastore(config)
    try:
        check_engine_can_run(config, resolve_model_dir(config.model)[0])
    except ModelRefused as error:
        raise JobFailed(str(error)) from error
    run_dir = Path(config.job.output).resolve() / f"run={run_id}"
    run_dir.mkdir(parents=True, exist_ok=True)
    done = completed_ids(run_dir)
    dataset = read_input(config.input)
    check_columns(dataset, config.input)
    # Counted so that a run that read part of its input never looks complete.
    input_rows = dataset.count()
    rows_read = min(input_rows, config.input.limit) if config.input.limit else input_rows
    if config.input.limit:
        dataset = dataset.limit(config.input.limit)
    if done:
        id_column = config.input.id_column
        dataset = dataset.filter(lambda row: row[id_column] is None or str(row[id_column]) not in done)
    outputs = dataset.map_batches(
        GenerationStage,
        fn_constructor_kwargs={"config": config, "tables": shared_tables(config)},
        compute=ray.data.ActorPoolStrategy(min_size=config.ray.min_actors, max_size=config.ray.max_actors),
        num_cpus=config.ray.num_cpus_per_actor,
        num_gpus=config.ray.num_gpus_per_actor,
        batch_size=config.ray.batch_size,
        batch_format="numpy",
    )
    written = errored = generated = 0
    first_batch_at = first_batch_seconds = None
    for batch in outputs.iter_batches(batch_size=None, batch_format="pyarrow"):
        write_part(batch, run_dir)
        written += batch.num_rows
        generated += pa.compute.sum(batch.column("num_generated_tokens")).as_py() or 0
        if first_batch_at is None:
            # Start-up (reading, actors loading the model) ends where the first batch's generation
            # began: its arrival time less the decoding time its rows report.
            first_batch_at = time.perf_counter()
            first_batch_seconds = pa.compute.sum(batch.column("total_seconds")).as_py() or 0.0
        errored += batch.num_rows - batch.column("error").null_count
        if 0 <= config.job.max_errored_rows < errored:
            raise JobFailed(f"{errored} rows failed, more than job.max_errored_rows ({config.job.max_errored_rows}); "
                            f"see the 'error' column in {run_dir}")
    finished = time.perf_counter()
    after_startup = None
    if first_batch_at is not None and generated:
        after_startup = round(generated / (finished - first_batch_at + first_batch_seconds), 3)
    counts = {"input_rows": input_rows, "rows_read": rows_read, "rows_this_invocation": written,
              "rows_errored_this_invocation": errored, "rows_skipped_already_done": rows_read - written}
    return write_run_summary(config, run_id, run_dir, finished - started, generated, counts, after_startup)


def write_run_summary(config: Config, run_id: str, run_dir: Path, wall: float, generated: int, counts: dict,
                      tokens_per_second_after_startup: float | None) -> dict:
    """Counts of rows cover the whole run (every part) and this invocation's reading; speed
    covers this invocation only."""
    parts = sorted(run_dir.glob(PART_GLOB))
    rows = pa.concat_tables([pq.read_table(part) for part in parts]).to_pylist() if parts else []
    settings = {section: asdict(getattr(config, section)) for section in ("model", "engine", "decoder", "input", "ray")}
    summary = summarize(rows, wall, settings)
    summary.update(run_id=run_id, **counts, tokens_per_second=round(generated / wall, 3) if wall > 0 else None,
                   tokens_per_second_after_startup=tokens_per_second_after_startup)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=list) + "\n")
    return summary
