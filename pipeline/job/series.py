"""A series of runs over a corpus that changes (`job.series`, a scheduled job): each run generates
the rows that are new or changed since the series last generated them, and skips the rest.

Every output row records the fingerprint of what produced it (`fingerprint`): its id, its prompt
and its own settings as read, and the run's settings that decide a text (the model, the engine, the
generation settings: `settings_fingerprint`). The series' checkpoint records the fingerprints
written; a run reads its input through Ray Data's checkpoint filter with the fingerprints of the
input rows, so it generates the ids that are new and the ids whose input (or settings) changed,
and a killed run resumes writing every fingerprint once.

A changed row is drafted from its last output, its prediction (drafters/prediction.py): the latest
output of its id, by the time its file was written. An index of every id's latest output (its file
and row, from the outputs' id and error columns alone) is kept beside the series' runs and brought up
to date in one task from the files written since (pipeline/job/series_index.py), and each block of
rows to generate reads the texts of its own ids from it: a run costs what it generates, not the history.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import ray
from ray import ObjectRef

from pipeline import storage
from pipeline.llm.checkpoint import InputIdCheckpointFilter, positions_in
from pipeline.config import Config
from pipeline.config.settings import DECODER_KEYS
from pipeline.job import series_index
from pipeline.job.output_files import SET_ASIDE
from pipeline.llm.row_values import python_value, request_key

logger = logging.getLogger(__name__)

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


def settings_fingerprint(config: Config) -> str:
    """The settings that decide a row's text: the model, its dtype, the engine, the sampling
    section and the input's columns. Drafting settings are left out when decoding greedily (they
    change the speed, never the text); every drafting setting counts when sampling (under the names
    and in the one section, `drafting`, they had when series were first written, so that a series
    keeps its fingerprints)."""
    sampling = config.sampling
    settings = {
        "model": model_identity(config.model.name),
        "dtype": config.model.dtype,
        "engine": config.engine.name,
        "max_model_len": config.vllm.max_model_len,
        "max_new_tokens": sampling.max_new_tokens,
        "stop": list(sampling.stop),
        "temperature": sampling.temperature,
        "top_k": sampling.top_k,
        "top_p": sampling.top_p,
        "seed": sampling.seed,
        "columns": [config.input.id_column, config.input.prompt_column, config.input.messages_column],
    }
    if sampling.temperature > 0:  # (the transformers engine's section too: its keys were the decoder's)
        settings["decoder"] = {**decoder_as_written(config), **asdict(config.transformers)}
    for name, default in LATER_SETTINGS.items():
        settings.get("decoder", {}).pop(name, None)
        if getattr(sampling, name) != default:
            settings[name] = getattr(sampling, name)
    return digest(json.dumps(settings, sort_keys=True, default=list))


def decoder_as_written(config: Config) -> dict:
    """The drafting and sampling settings as the `decoder` section named them when series were first
    written (pipeline/config/settings.py's DECODER_KEYS: each old key and where it is now)."""
    written = {}
    for old, now in DECODER_KEYS.items():
        section, _, path = now.partition(".")
        if section in ("drafting", "sampling"):
            value = getattr(config, section)
            for name in ("auto_w" if old == "auto_w" else path).split("."):
                value = getattr(value, name)
            written[old] = value
    return written


def model_identity(name: str) -> str:
    """model.name as the fingerprint reads it: a local path as its absolute path (a run from another
    directory, or given the path another way, names the same model), anything else as written."""
    path = Path(name).expanduser()
    return str(path.resolve()) if path.exists() else name


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
    }
    for name in ROW_SETTINGS:  # (most rows set none: an absent value costs no conversion)
        value = row.get(name)
        value = None if value is None else canonical(python_value(value))
        if value is not None or name not in LATER_SETTINGS:
            values[name] = value
    if row.get(REQUEST):  # an OpenAI Batch line's request: its messages and settings
        values[REQUEST] = row[REQUEST]
    return digest(settings + json.dumps(values, sort_keys=True, default=str))


def plain_fingerprints(config: Config, settings: str, table: pa.Table) -> list[str] | None:
    """row_fingerprint of every row of a block that holds plain rows (a text prompt, no setting of
    its own, no OpenAI request: most corpora), from its two columns, with no dict per row (a million
    rows' keys are a rerun's planning, twice); None for a block of other rows."""
    source, names = config.input, set(table.column_names)
    column = source.prompt_column
    if not column or column not in names or names & (set(ROW_SETTINGS) | {REQUEST}):
        return None
    if not pa.types.is_string(table[column].type) and not pa.types.is_large_string(table[column].type):
        return None
    ids = table[source.id_column].to_pylist() if source.id_column in names else [None] * len(table)
    head, middle, tail = PLAIN_ROW
    return [
        digest(settings + head + json.dumps(request_key(key)) + middle + json.dumps(prompt) + tail)
        for key, prompt in zip(ids, table[column].to_pylist())
    ]


def plain_row_template() -> tuple[str, str, str]:
    """row_fingerprint's JSON of a plain row, cut around its id and its prompt."""
    values = {"id": "@id@", "prompt": "@prompt@", **{n: None for n in ROW_SETTINGS if n not in LATER_SETTINGS}}
    text = json.dumps(values, sort_keys=True)
    head, rest = text.split('"@id@"')
    middle, tail = rest.split('"@prompt@"')
    return head, middle, tail


PLAIN_ROW = plain_row_template()


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
        plain = plain_fingerprints(config, settings, table)
        return plain if plain is not None else [row_fingerprint(config, settings, row) for row in table.to_pylist()]

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


@dataclass(frozen=True)
class LastOutputs:
    """A series' earlier outputs as a run drafts from them: where they are, and the index of each
    id's latest one (`kept_latest`), brought up to date by a task the run starts before it reads its input."""

    runs_root: str
    index: ObjectRef


def last_outputs(runs_root: str, index_path: str, cpus: float) -> LastOutputs | None:
    """The series' earlier outputs under `runs_root`, their kept index (at `index_path`) brought up
    to date now in a task of `cpus` (the blocks that generate wait for it): None where the series
    has none."""
    written = output_files(runs_root)
    if not written:
        return None
    task = ray.remote(kept_latest).options(num_cpus=cpus)
    return LastOutputs(runs_root, task.remote(runs_root, index_path, written))


def with_last_outputs(dataset: ray.data.Dataset, config: Config, last: LastOutputs, cpus: float) -> ray.data.Dataset:
    """`dataset`'s rows (those the run generates), each with LAST_OUTPUT: the generated text of its
    id's latest output among the series' earlier outputs (`last`), None where it has none.

    One task brings the series' kept index of each id's latest output (its file and row) up to date
    from the files written since it was kept (their narrow columns, id and error: `kept_latest`);
    each block of rows to generate then looks its ids up in it and reads only their texts, from the
    row groups that hold them (`attach_last`). Nothing costs Python per unchanged row, and no text
    of an unchanged row is read."""
    return dataset.map_batches(
        attach_last,
        fn_kwargs={"id_column": config.input.id_column, "index": [last.index], "runs_root": last.runs_root},
        batch_format="pyarrow",
        num_cpus=cpus,
    )


def kept_latest(runs_root: str, index_path: str, written: dict[str, int]) -> pa.Table:
    """Each id's latest output that is no error row among `written` ({file: when written}): (key, file,
    row), from the series' kept index brought up to them (pipeline/job/series_index.py)."""
    return series_index.latest(series_index.updated(runs_root, index_path, written), runs_root)


def attach_last(table: pa.Table, id_column: str, index: list, runs_root: str) -> pa.Table:
    """A block of rows to generate with LAST_OUTPUT (`index`: [the ObjectRef of kept_latest])."""
    keys = [request_key(value) for value in table[id_column].to_pylist()]
    return table.append_column(LAST_OUTPUT, pa.array(last_texts(keys, ray.get(index[0]), runs_root), pa.string()))


def last_texts(keys: list[str], latest: pa.Table, runs_root: str) -> list:
    """Each key's latest output text by `latest` (kept_latest), read from the row groups of its
    file that hold it; None where it has none."""
    found = positions_in(series_index.sorted_keys(latest), keys)
    texts = [None] * len(keys)
    matched = np.flatnonzero(found >= 0)
    if len(matched):
        at = latest.take(pa.array(found[matched]))
        files, rows = np.array(at["file"].to_pylist(), dtype=object), at["row"].to_numpy()
        filesystem, _ = storage.resolve(runs_root)
        for path in set(files):
            wanted = np.flatnonzero(files == path)
            for i, text in zip(matched[wanted], texts_at(filesystem, runs_root, path, rows[wanted])):
                texts[i] = text
    return texts


def texts_at(filesystem: pafs.FileSystem, runs_root: str, path: str, rows: np.ndarray) -> list:
    """The generated_text of the rows `rows` of the output file `path`, reading only the row groups
    that hold them; Nones where the file cannot be read (with a warning)."""
    try:
        metadata, starts = footer(runs_root, path)
        with filesystem.open_input_file(path) as source:
            group_of = np.searchsorted(starts, rows, side="right") - 1
            groups = np.unique(group_of)
            parquet = pq.ParquetFile(source, metadata=metadata)
            column = parquet.read_row_groups(groups.tolist(), columns=["generated_text"])["generated_text"]
    except (OSError, ValueError) as error:  # damaged since the index was read
        logger.warning("%s cannot be read (%s): its rows draft from no last output", path, error)
        return [None] * len(rows)
    sizes = np.diff(starts)
    first_read = np.concatenate([[0], np.cumsum(sizes[groups])])  # where each group read begins in `column`
    positions = first_read[np.searchsorted(groups, group_of)] + rows - starts[group_of]
    return column.take(pa.array(positions, pa.int64())).to_pylist()


FOOTERS_KEPT = 64  # output files whose footers a worker keeps parsed


@functools.lru_cache(maxsize=FOOTERS_KEPT)
def footer(runs_root: str, path: str) -> tuple[pq.FileMetaData, np.ndarray]:
    """The parsed footer of the output file `path` under `runs_root`, and where each of its row groups
    starts (its rows' count before it, then the file's): parsed once in a worker, not for each block
    that reads from the file (an output file is written once, and a night's first file holds many
    groups: 977 at 62,500 rows). Not kept where it cannot be read."""
    filesystem, _ = storage.resolve(runs_root)
    with filesystem.open_input_file(path) as source:
        metadata = pq.ParquetFile(source).metadata
    sizes = [metadata.row_group(group).num_rows for group in range(metadata.num_row_groups)]
    return metadata, np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
