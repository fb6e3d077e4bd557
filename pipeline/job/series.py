"""A series of runs over a corpus that changes (`job.series`, a scheduled job): each run generates
the rows that are new or changed since the series last generated them, and skips the rest.

Every output row records the fingerprint of what produced it (`fingerprint`): its id, its prompt
and its own settings as read, and the run's settings that decide a text (the model, the engine, the
generation settings: `settings_fingerprint`). The series' checkpoint records the fingerprints
written; a run reads its input through Ray Data's checkpoint filter with the fingerprints of the
input rows, so it generates the ids that are new and the ids whose input (or settings) changed,
and a killed run resumes writing every fingerprint once.

A changed row is drafted from its last output, its prediction (drafters/prediction.py): the rows to
generate and the series' earlier outputs are shuffled together by id (a Ray Data groupby, so no
table of the corpus is held on the driver), and each row takes the text of the latest output of its
id, by the time its file was written.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import ray

from pipeline import storage
from pipeline.llm.checkpoint import InputIdCheckpointFilter
from pipeline.config import Config
from pipeline.job.output_files import SET_ASIDE, readable_columns
from pipeline.llm.row_values import python_value, request_key, rows_table

# A job row's optional setting columns, and the sampling_params key each is.
ROW_SETTINGS = {
    "max_new_tokens": "max_tokens",
    "temperature": "temperature",
    "top_k": "top_k",
    "top_p": "top_p",
    "seed": "seed",
    "n": "n",
}
# Settings that came after series were first written, and their defaults: fingerprinted only where
# they differ from them (a row's only where it sets one), so that a series keeps its fingerprints.
LATER_SETTINGS = {"n": 1}
LAST_OUTPUT = "last_output"  # the column that carries a changed row's last output to the preprocess
REQUEST = "openai_request"  # an OpenAI Batch line's request, as JSON text (pipeline/job/openai_batch.py)
TAGGED = pa.schema([("__key", pa.string()), ("__row", pa.string()), ("__last", pa.string()), ("__written", pa.int64())])


def settings_fingerprint(config: Config) -> str:
    """The settings that decide a row's text: the model, its dtype, the engine, the generation
    settings and the input's columns. Drafting settings are left out when decoding greedily (they
    change the speed, never the text); every decoder setting counts when sampling."""
    decoder = config.decoder
    settings = {
        "model": config.model.name,
        "dtype": config.model.dtype,
        "engine": config.engine.name,
        "max_model_len": config.engine.max_model_len,
        "max_new_tokens": decoder.max_new_tokens,
        "stop": list(decoder.stop),
        "temperature": decoder.temperature,
        "top_k": decoder.top_k,
        "top_p": decoder.top_p,
        "seed": decoder.seed,
        "columns": [config.input.id_column, config.input.prompt_column, config.input.messages_column],
    }
    if decoder.temperature > 0:  # (the transformers engine's section too: its keys were the decoder's)
        settings["decoder"] = {**asdict(decoder), **asdict(config.transformers)}
    for name, default in LATER_SETTINGS.items():
        settings.get("decoder", {}).pop(name, None)
        if getattr(decoder, name) != default:
            settings[name] = getattr(decoder, name)
    return digest(json.dumps(settings, sort_keys=True, default=list))


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def row_fingerprint(config: Config, settings: str, row: dict) -> str:
    """The fingerprint of an input row under `settings` (settings_fingerprint): its id, prompt and
    own settings as read (a `prediction` changes the speed, not the text, and is left out), in a
    canonical form, so that a value read as 5 in one block and 5.0 in another (pandas reads a JSON
    column with a missing value as floats) fingerprints alike."""
    source = config.input
    values = {
        "id": request_key(row.get(source.id_column)),
        "prompt": canonical(python_value(row.get(source.prompt_column or source.messages_column))),
        **{
            name: canonical(python_value(row.get(name)))
            for name in ROW_SETTINGS
            if name not in LATER_SETTINGS or python_value(row.get(name)) is not None
        },
    }
    if row.get(REQUEST):  # an OpenAI Batch line's request: its messages and settings
        values[REQUEST] = row[REQUEST]
    return digest(settings + json.dumps(values, sort_keys=True, default=str))


def canonical(value):
    """Integral floats as ints, NaN as None, and a mapping's None entries dropped, all the way down."""
    if isinstance(value, float):
        return None if value != value else int(value) if value.is_integer() else value
    if isinstance(value, dict):
        return {key: canonical(item) for key, item in value.items() if item is not None}
    if isinstance(value, (list, tuple)):
        return [canonical(item) for item in value]
    return value


def fingerprint_filter(config: Config, settings: str) -> type:
    """Ray Data's checkpoint filter for a series: skips the input rows whose fingerprint (under the
    settings' fingerprint `settings`) is written."""

    def keys(self, table: pa.Table) -> list[str]:
        return [row_fingerprint(config, settings, row) for row in table.to_pylist()]

    return type("FingerprintFilter", (InputIdCheckpointFilter,), {"keys": keys})


def output_files(runs_root: str) -> dict[str, int]:
    """{each Parquet file of the series' runs, as its store names it: when it was written (ns)}."""
    filesystem, inner = storage.resolve(runs_root)
    found = filesystem.get_file_info(pafs.FileSelector(inner, recursive=True, allow_not_found=True))
    return {
        entry.path: entry.mtime_ns or 0
        for entry in found
        if entry.is_file
        and entry.path.endswith(".parquet")
        and "/run=" in entry.path
        and f"/{SET_ASIDE}/" not in entry.path
    }


def with_last_outputs(
    dataset: ray.data.Dataset, config: Config, runs_root: str, written: dict[str, int], cpus: float
) -> ray.data.Dataset:
    """`dataset`'s rows, each with LAST_OUTPUT: the generated text of its id's latest output among
    the files `written` (output_files of `runs_root`), None where it has none."""
    rows = dataset.map_batches(
        tag_rows, fn_kwargs={"id_column": config.input.id_column}, batch_format="pyarrow", num_cpus=cpus
    )
    # The files are read by tasks of ours, not by a Read of Ray Data's: Ray gives every Read of a
    # checkpointed pipeline a checkpoint filter of its own (an actor pool taking a CPU).
    files = ray.data.from_items([{"path": path, "written": when} for path, when in sorted(written.items())])
    outputs = files.map_batches(
        read_outputs, fn_kwargs={"runs_root": runs_root}, batch_size=1, batch_format="pyarrow", num_cpus=cpus
    )
    grouped = rows.union(outputs).groupby("__key").map_groups(attach_last, batch_format="pyarrow", num_cpus=cpus)
    return grouped.map_batches(untag, batch_format="pyarrow", num_cpus=cpus)


def tag_rows(table: pa.Table, id_column: str) -> pa.Table:
    rows = table.to_pylist()
    return pa.table(
        [
            [request_key(row.get(id_column)) for row in rows],
            [json.dumps({name: python_value(value) for name, value in row.items()}, default=str) for row in rows],
            pa.nulls(len(rows), pa.string()),
            pa.array(np.full(len(rows), -1)),
        ],
        schema=TAGGED,
    )


def read_outputs(files: pa.Table, runs_root: str) -> pa.Table:
    """Earlier outputs of the files in `files` (path, written): their id, text (None for an error
    row) and when their file was written. A file that cannot be read (damaged after the run's
    check: pipeline/job/output_files.py) is left out, with a warning: its ids draft from no last output."""
    filesystem, _ = storage.resolve(runs_root)
    tables = []
    for path, when in zip(files["path"].to_pylist(), files["written"].to_pylist()):
        table = readable_columns(filesystem, path, ["id", "generated_text", "error"])
        if table is None:
            continue
        text = pc.if_else(pc.is_null(table["error"]), table["generated_text"], pa.scalar(None, pa.string()))
        tables.append(
            pa.table(
                [
                    table["id"].cast(pa.string()),
                    pa.nulls(len(table), pa.string()),
                    text.cast(pa.string()),
                    pa.array([when] * len(table), pa.int64()),
                ],
                schema=TAGGED,
            )
        )
    return pa.concat_tables(tables) if tables else TAGGED.empty_table()


def attach_last(group: pa.Table) -> pa.Table:
    """One id's rows to generate, each with the text of the id's latest earlier output."""
    rows, written, texts = group["__row"].to_pylist(), group["__written"].to_pylist(), group["__last"].to_pylist()
    outputs = [
        (when, index)
        for index, (row, when, text) in enumerate(zip(rows, written, texts))
        if row is None and text is not None
    ]
    last = texts[max(outputs)[1]] if outputs else None
    kept = [row for row in rows if row is not None]
    return pa.table({"__row": pa.array(kept, pa.string()), "__last": pa.array([last] * len(kept), pa.string())})


def untag(table: pa.Table) -> pa.Table:
    rows = [json.loads(row) for row in table["__row"].to_pylist()]
    for row, last in zip(rows, table["__last"].to_pylist()):
        row[LAST_OUTPUT] = last
    return rows_table(rows)  # every column any row has, as Ray Data converts mixed types
