"""The job's input: which files, in which format, read so that what cannot be read costs only its
own rows and is named.

A JSONL line that is not a JSON object, a CSV row that does not parse and a Parquet file that
cannot be opened are each named by file and line (or file): with `input.on_bad_line: error_row`
(the default) each becomes one row whose id is "<file>:<line>" (a Parquet file: "<file>") and
whose `BAD_INPUT` column holds the message; the job writes it as an error row and generates every
other row. With `fail`, the job stops after its first pass over the input (the count, before any
actor starts), naming the first bad line and how many there are: one line, not a traceback.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from collections.abc import Iterator

import pyarrow as pa
import ray
from ray.data.datasource import FileBasedDatasource

from pipeline.job import openai_batch
from pipeline import storage
from pipeline.llm.errors import JobFailed
from pipeline.config import InputConfig
from pipeline.config.package_data import BUILTIN_DATASETS, builtin_prompts
from pipeline.llm.row_values import rows_table
from pipeline.llm.schema import BAD_INPUT

ROWS_PER_BLOCK = 4096


def files_of(source: InputConfig) -> list[str] | str:
    """The input's files: a glob's matches, or the path (a file or a directory of shards)."""
    path = source.path
    if any(ch in path for ch in "*?["):
        files = storage.glob(path, "input.path")
        if not files:
            raise JobFailed(f"input.path: the glob {path!r} matches no file")
        return files
    if storage.info(path, "input.path").type.name == "NotFound":
        raise JobFailed(f"input.path: {path!r} does not exist (nor is it one of {', '.join(BUILTIN_DATASETS)})")
    return storage.uri(path)


def format_of(source: InputConfig, files) -> str:
    if source.format != "auto":
        return source.format
    first = files[0] if isinstance(files, list) else files
    if storage.info(first, "input.path").type.name == "Directory":
        filesystem, inner = storage.resolve(first)
        for marker in ("dataset_info.json", "state.json"):
            if filesystem.get_file_info(f"{inner}/{marker}").is_file:
                return "hf_dataset"
        names = [
            n for n in sorted(Path(path).name for path in storage.list_files(first)) if not n.startswith((".", "_"))
        ]
        if not names:
            raise JobFailed(f"input.path: the directory {source.path!r} holds no file to read")
        first = storage.join(first, names[0])
    for suffix, kind in ((".jsonl", "jsonl"), (".json", "jsonl"), (".parquet", "parquet"), (".csv", "csv")):
        if first.endswith(suffix):
            return "openai_batch" if kind == "jsonl" and holds_batch_requests(first) else kind
    raise JobFailed(
        f"input.path: cannot tell the format of {first!r}; set input.format to jsonl, parquet, csv, "
        "hf_dataset or openai_batch"
    )


def holds_batch_requests(path: str) -> bool:
    """Whether a JSONL file's first line is an OpenAI Batch request (custom_id, method, url, body)."""
    filesystem, inner = storage.resolve(path)
    if filesystem.get_file_info(inner).type.name != "File":
        return False
    with filesystem.open_input_stream(inner) as stream:
        for raw in iter(io.BufferedReader(stream).readline, b""):
            if raw.strip():
                return openai_batch.is_request_line(json_row(raw))
    return False


def read_input(source: InputConfig, cpus: float) -> ray.data.Dataset:
    """The input as a Dataset, bad lines and unreadable files as rows with BAD_INPUT."""
    if source.path in BUILTIN_DATASETS:
        return ray.data.from_items(
            [
                {source.id_column: request_id, source.prompt_column or "prompt": prompt}
                for request_id, prompt in builtin_prompts(source.path)
            ]
        )
    files = files_of(source)
    kind = format_of(source, files)
    if kind in LINE_READERS:
        return ray.data.read_datasource(line_reader(source, files, kind), num_cpus=cpus)
    if kind == "parquet":
        return read_parquet(files, source, storage.resolve(files[0] if isinstance(files, list) else files)[0], cpus)
    import datasets

    return ray.data.from_huggingface(datasets.load_from_disk(files if isinstance(files, str) else files[0]))


def read_parquet(files, source: InputConfig, filesystem, cpus: float) -> ray.data.Dataset:
    """The Parquet files that open, and a bad-input row for each that does not (its footer is
    checked first: Ray's reader fails the whole read on one torn file)."""
    paths = files if isinstance(files, list) else [files]
    listed = [
        path
        for entry in paths
        for path in (
            storage.list_files(entry, recursive=True)
            if storage.info(entry, "input.path").type.name == "Directory"
            else [entry]
        )
        if path.endswith(".parquet") and not Path(path).name.startswith((".", "_"))
    ]
    unreadable = storage.unreadable_parquet(listed)
    bad = [bad_row(source, path, None, error) for path, error in unreadable.items()]
    good = [path for path in listed if path not in unreadable]
    dataset = ray.data.read_parquet(good, filesystem=filesystem, num_cpus=cpus) if good else None
    if not bad:
        return dataset
    bad_rows = ray.data.from_items(bad)
    return dataset.union(bad_rows) if dataset is not None else bad_rows


def bad_row(source: InputConfig, path: str, line: int | None, cause: str) -> dict:
    """The row that stands for a line (or a whole file) that cannot be read."""
    where = f"{path} line {line}" if line is not None else path
    return {
        source.id_column: f"{path}:{line}" if line is not None else path,
        source.prompt_column or source.messages_column: None,
        BAD_INPUT: f"input.path: {where}: {cause}",
    }


def line_reader(source: InputConfig, files, kind: str) -> FileBasedDatasource:
    """The datasource that reads `files` of a line format (LINE_READERS) a line at a time."""
    filesystem = storage.resolve(files[0] if isinstance(files, list) else files)[0]
    extensions = ["csv"] if kind == "csv" else ["jsonl", "json"]
    return LINE_READERS[kind](files, source, filesystem=filesystem, file_extensions=extensions)


class JsonLines(FileBasedDatasource):
    """JSON Lines, one object a line, read into blocks as Ray's line-JSON reader makes them (pandas);
    a line that is not a JSON object is a bad-input row naming its line (a block of its own)."""

    def __init__(self, paths, source: InputConfig, **kwargs):
        super().__init__(paths, **kwargs)
        self.source = source

    def _read_stream(self, f, path: str) -> Iterator:
        import pandas as pd

        rows, bad = [], []
        for number, raw in enumerate(iter(io.BufferedReader(f).readline, b""), start=1):
            if raw.strip():
                row = self.row_of(json_row(raw), path, number)
                if isinstance(row, str):
                    bad.append(bad_row(self.source, path, number, row))
                else:
                    rows.append(row)
            if len(rows) >= ROWS_PER_BLOCK:
                yield pd.DataFrame.from_records(rows)
                rows = []
        if rows:
            yield pd.DataFrame.from_records(rows)
        if bad:  # (a read task's blocks are all of one kind)
            yield pd.DataFrame.from_records(bad)

    def row_of(self, parsed: dict | str, path: str, number: int) -> dict | str:
        """The job's row of a line's JSON object (or what is wrong with the line)."""
        return parsed


class OpenAIBatchLines(JsonLines):
    """An OpenAI Batch request file: each line's request checked and kept as JSON text, its
    custom_id the row's id (pipeline/job/openai_batch.py); a line that is not a request is its own
    error row, named by its custom_id where it has one."""

    def row_of(self, parsed: dict | str, path: str, number: int) -> dict | str:
        if isinstance(parsed, str):
            return parsed
        return openai_batch.batch_row(parsed, self.source, f"{path} line {number}")


def json_row(raw: bytes) -> dict | str:
    """A line's JSON object, or what is wrong with the line."""
    try:
        row = json.loads(raw.rstrip(b"\r\n").decode("utf-8"))
    except UnicodeDecodeError as error:
        return f"not UTF-8 text ({error})"
    except json.JSONDecodeError as error:
        return f"not valid JSON: {error.msg}: column {error.colno}"
    return row if isinstance(row, dict) else f"a JSON {type(row).__name__}, not an object of columns"


class CsvRows(FileBasedDatasource):
    """CSV with a header row, read as Ray's CSV reader reads it (pyarrow's, its types inferred); a
    row that does not parse (another number of fields than the header) is a bad-input row naming
    its line (a block of its own)."""

    def __init__(self, paths, source: InputConfig, **kwargs):
        super().__init__(paths, **kwargs)
        self.source = source

    def _read_stream(self, f, path: str) -> Iterator[pa.Table]:
        import pyarrow.csv as pacsv

        invalid = []  # pyarrow's InvalidRow

        def skip(row) -> str:
            invalid.append(row)
            return "skip"

        # One thread: pyarrow numbers an invalid row's line only then (Ray reads files in parallel).
        yield pacsv.read_csv(
            f,
            read_options=pacsv.ReadOptions(use_threads=False),
            parse_options=pacsv.ParseOptions(invalid_row_handler=skip),
        )
        if invalid:
            yield rows_table(
                [
                    bad_row(
                        self.source,
                        path,
                        row.number,
                        f"{row.actual_columns} fields where the header has {row.expected_columns}: {row.text[:80]!r}",
                    )
                    for row in invalid
                ]
            )


LINE_READERS = {"jsonl": JsonLines, "csv": CsvRows, "openai_batch": OpenAIBatchLines}


def input_names(dataset: ray.data.Dataset, source: InputConfig) -> list[str]:
    """The input's columns, as its first block has them (none: it has no rows). A JSON Lines input's first block is read
    here, from its first file: Ray's schema() runs the first read task, which reads its whole file
    first (16 s for 200,000 lines)."""
    if source.path not in BUILTIN_DATASETS:
        files = files_of(source)
        kind = format_of(source, files)
        if kind in ("jsonl", "openai_batch"):
            reader = line_reader(source, files, kind)
            for path in reader._paths()[:1]:
                with reader._open_input_source(reader._filesystem, path) as stream:
                    block = next(iter(reader._read_stream(stream, path)), None)
                if block is not None:
                    return [str(name) for name in block.columns]
    schema = dataset.schema()
    return schema.names if schema is not None else []  # an input with no rows (an empty file) has no columns


def check_columns(names: list[str], source: InputConfig) -> None:
    for setting, column in (
        ("input.id_column", source.id_column),
        (
            "input.prompt_column" if source.prompt_column else "input.messages_column",
            source.prompt_column or source.messages_column,
        ),
    ):
        if column not in names:
            raise JobFailed(f"{setting}: the input has no column {column!r}; its columns are {names}")


def with_columns(block, names: list[str]):
    """`block` (as read: pandas or Arrow) with exactly the columns `names`, null where it has none
    (a block of bad lines has none of the settings; a good one no BAD_INPUT)."""
    if isinstance(block, pa.Table):
        for name in names:
            if name not in block.column_names:
                block = block.append_column(name, pa.nulls(len(block)))
        return block.select(names)
    for name in names:
        if name not in block.columns:
            block[name] = None
    return block[names]
