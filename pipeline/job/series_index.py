"""A series' index of last outputs, kept beside its runs rather than recomputed from them.

    <output>/_checkpoints/series=<name>/outputs/index.parquet

One row per id and kind: where the id's latest output that is no error row is (file, row, when
written), and, where the id's newest row is an error row, where that is too (`error` true). Its
metadata lists the files it covers (each with the time it was written). A run reads the index and
the files written since (a file it does not cover: the runs after the one that wrote it, a killed
run's), merges them in (an id's rows in them supersede its older ones) and writes the index whole
again: what a run reads to plan is the index and what changed, not the series' history.

A file the index covers that is gone from the runs (retired: pipeline/job/series_retire.py) is
dropped from it; if the index still pointed into one (a file set aside as unreadable, or removed by
hand), an id may have an older output elsewhere that the index no longer knows: the index is built
again from every file.
"""

from __future__ import annotations

import json
import logging

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

from pipeline import storage
from pipeline.job.output_files import readable_columns, write_whole
from pipeline.llm.checkpoint import utf8_keys

logger = logging.getLogger(__name__)

FILE = pa.dictionary(pa.int32(), pa.string())  # a run's few files named once, not once per row
SCHEMA = pa.schema(
    [("key", pa.string()), ("file", FILE), ("row", pa.int64()), ("written", pa.int64()), ("error", pa.bool_())]
)
COVERED = b"covered"  # the schema metadata key: {file under the runs root: when written}


def relative(path: str, inner_root: str) -> str:
    """A run's file under the series' runs root (so that a series moved elsewhere keeps its index)."""
    prefix = inner_root.rstrip("/") + "/"
    return path[len(prefix) :] if path.startswith(prefix) else path


def load(index_path: str) -> tuple[pa.Table, dict[str, int]]:
    """The kept index and the files it covers; an empty one where there is none or it cannot be read."""
    filesystem, inner = storage.resolve(index_path)
    exists = filesystem.get_file_info(inner).type == pafs.FileType.File
    table = readable_columns(filesystem, inner) if exists else None
    if table is None:
        return SCHEMA.empty_table(), {}
    covered = json.loads((table.schema.metadata or {}).get(COVERED, b"{}"))
    return table.cast(SCHEMA.remove_metadata()), covered


def scan(runs_root: str, files: dict[str, int]) -> tuple[pa.Table, set[str]]:
    """The index rows of `files` ({file under the runs root: when written}): every row's id, where it
    is and whether it is an error row; and the files read (one that cannot be read, now, is left
    out with a warning, and read again by the next update)."""
    filesystem, inner = storage.resolve(runs_root)
    tables, read = [SCHEMA.empty_table()], set()
    for name, when in files.items():
        table = readable_columns(filesystem, f"{inner}/{name}", ["id", "error"])
        if table is None:
            continue
        read.add(name)
        rows = len(table)
        tables.append(
            pa.table(
                [
                    table["id"].cast(pa.string()),
                    pa.DictionaryArray.from_arrays(pa.array(np.zeros(rows, np.int32)), pa.array([name])),
                    pa.array(np.arange(rows, dtype=np.int64)),
                    pa.array(np.full(rows, when, np.int64)),
                    pc.is_valid(table["error"]),
                ],
                schema=SCHEMA,
            )
        )
    return concat(tables), read


def concat(tables: list[pa.Table]) -> pa.Table:
    return pa.concat_tables(tables, promote_options="permissive").unify_dictionaries().combine_chunks()


def reduced(table: pa.Table) -> pa.Table:
    """Per id: its newest row that is no error, and its newest row where that is an error row."""
    if table.num_rows == 0:
        return table
    ordered = table.sort_by([("key", "ascending"), ("written", "descending"), ("row", "descending")])
    keys = ordered["key"].to_numpy(zero_copy_only=False)
    first = np.ones(len(keys), bool)
    first[1:] = keys[1:] != keys[:-1]
    error = ordered["error"].to_numpy(zero_copy_only=False)
    newest_error = first & error  # the id's newest row is an error row
    good = np.flatnonzero(~error)
    good_first = good[np.r_[True, keys[good][1:] != keys[good][:-1]]] if len(good) else good
    keep = np.zeros(len(keys), bool)
    keep[good_first] = True
    keep |= newest_error
    return ordered.filter(pa.array(keep))


def merged(index: pa.Table, delta: pa.Table) -> pa.Table:
    """`index` with `delta`'s rows merged in: only the ids `delta` has are reduced again."""
    if delta.num_rows == 0:
        return index
    touched = pc.is_in(index["key"], value_set=pc.unique(delta["key"]))
    return concat([index.filter(pc.invert(touched)), reduced(concat([index.filter(touched), delta]))])


def updated(runs_root: str, index_path: str, written: dict[str, int]) -> pa.Table:
    """The series' index of last outputs brought up to `written` (every output file of its runs, as
    the store names it: when written), and kept at `index_path`."""
    inner = storage.resolve(runs_root)[1]
    files = {relative(path, inner): when for path, when in written.items()}
    index, covered = load(index_path)
    gone = set(covered) - set(files)
    if gone and pc.any(pc.is_in(index["file"].cast(pa.string()), value_set=pa.array(sorted(gone)))).as_py():
        logger.warning("%d output files the series' index points into are gone: the index is built anew", len(gone))
        index, covered = SCHEMA.empty_table(), {}
    new = {name: when for name, when in files.items() if covered.get(name) != when}
    if new or gone:
        delta, read = scan(runs_root, new)
        index = merged(index, delta)
        covered = {name: when for name, when in files.items() if name in read or (name in covered and name not in new)}
        filesystem, inner = storage.resolve(index_path)
        filesystem.create_dir(inner.rsplit("/", 1)[0], recursive=True)
        write_whole(index_path, index.replace_schema_metadata({COVERED: json.dumps(covered).encode()}))
    return index


def latest(index: pa.Table, runs_root: str) -> pa.Table:
    """Each id's latest output that is no error row: (key, file as the store names it, row), for
    pipeline/job/series.last_texts; sorted by key, each key fixed-width UTF-8 (`sorted_keys`), so
    that a block of rows finds its ids by a binary search, not by hashing the whole index again."""
    inner = storage.resolve(runs_root)[1].rstrip("/")
    good = index.filter(pc.invert(index["error"]))
    keys = utf8_keys(good["key"].to_numpy(zero_copy_only=False))
    order = np.argsort(keys, kind="stable")
    keys, good = np.ascontiguousarray(keys[order]), good.take(pa.array(order))
    files = pc.binary_join_element_wise(inner, good["file"].cast(pa.string()), "/")
    key = pa.FixedSizeBinaryArray.from_buffers(pa.binary(keys.itemsize), len(keys), [None, pa.py_buffer(keys)])
    return pa.table({"key": key, "file": files, "row": good["row"]})


def sorted_keys(latest: pa.Table) -> np.ndarray:
    """`latest`'s keys as numpy's sorted fixed-width bytes, without a copy."""
    column = latest["key"].combine_chunks()
    width = column.type.byte_width
    return np.frombuffer(column.buffers()[1], f"S{width}", count=len(column), offset=column.offset * width)
