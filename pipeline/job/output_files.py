"""A run's Parquet files: written whole, read defensively, and those that cannot be read set aside.

- **Written whole.** On a file system (a local disk, a network file system mounted on every node)
  a Parquet file is written under a temporary name beside its own and renamed to it once its
  footer is written (`whole_files`), so a write killed half-way leaves no file under a `.parquet`
  name. Object stores publish a file only when its upload completes. Ray Data's checkpoint records
  a file's ids only after the file is written (its two-phase commit), and removes the file of a
  write that never committed.
- **Set aside.** Before a run reads its earlier outputs (a resumed run, or any run of a series),
  every Parquet file's footer is read. A file that cannot be read (cut short by a node that died
  while writing it, or damaged since) is moved, never deleted, to
  `<output>/_set_aside/<its path under output>`, named in a warning and in the run's summary; its
  checkpoint entry moves there too (rewritten with the ids of the readable files that the same
  write produced, where there are any), so the run generates the ids it held again.
"""

from __future__ import annotations

import io
import logging
import os
import uuid

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from pipeline import storage

logger = logging.getLogger(__name__)

SET_ASIDE = "_set_aside"
PARQUET_END = b"PAR1"  # a whole Parquet file ends with its footer and these four bytes


def parquet_files(directory: str) -> list[str]:
    """The Parquet files under `directory` (named as `directory` is), the set-aside ones left out."""
    return [
        path
        for path in storage.list_files(directory, recursive=True)
        if path.endswith(".parquet") and f"/{SET_ASIDE}/" not in path
    ]


def set_aside_unreadable(output: str, outputs: str, checkpoints: str, id_column: str) -> list[dict]:
    """Moves each Parquet file under `outputs` whose footer cannot be read to `output`/_set_aside/
    (its path under `output` kept) and takes its ids out of the checkpoint under `checkpoints`
    (whose files record `id_column`); returns what it moved, and why."""
    files = parquet_files(outputs)
    unreadable = storage.unreadable_parquet(files)
    moved = []
    for path, why in unreadable.items():
        kept = aside(output, path)
        storage.move(path, kept)
        released = release_checkpoint(output, checkpoints, path, [f for f in files if f not in unreadable], id_column)
        logger.warning(
            "%s is not a readable Parquet file (%s): moved to %s; the ids it held are generated again", path, why, kept
        )
        moved.append({"file": path, "moved_to": kept, "error": why, "checkpoint": released})
    return moved


def aside(output: str, path: str) -> str:
    """Where `path` (a file under `output`) is set aside."""
    relative = storage.resolve(path)[1][len(storage.resolve(output)[1]) :].lstrip("/")
    return storage.join(output, SET_ASIDE, relative)


def release_checkpoint(output: str, checkpoints: str, path: str, readable: list[str], id_column: str) -> list[str]:
    """Takes the ids of the unreadable file `path` out of the checkpoint: Ray Data names a write's
    checkpoint file after the write, and its data files start with that name. The checkpoint file
    is set aside; where the same write left other files that read, a checkpoint of their ids
    takes its place. Returns the checkpoint files set aside."""
    name = path.rsplit("/", 1)[-1]
    released = []
    for entry in storage.list_files(checkpoints):
        base = entry.rsplit("/", 1)[-1].removesuffix(".parquet")
        if not entry.endswith(".parquet") or base.endswith(".pending") or not name.startswith(base):
            continue
        siblings = [f for f in readable if f.rsplit("/", 1)[-1].startswith(base)]
        storage.move(entry, aside(output, entry))
        if siblings:
            ids = pa.concat_arrays([read_columns(f, [id_column])[id_column].combine_chunks() for f in siblings])
            write_whole(entry, pa.table({id_column: ids}))
        released.append(entry)
    return released


def read_columns(path: str, columns: list[str] | None = None) -> pa.Table:
    filesystem, inner = storage.resolve(path)
    return pq.read_table(inner, columns=columns, filesystem=filesystem)


def readable_columns(filesystem: pafs.FileSystem, path: str, columns: list[str] | None = None) -> pa.Table | None:
    """The `columns` of the file at `path` in `filesystem`, or None (with a warning naming it)
    where it cannot be read."""
    try:
        return pq.read_table(path, columns=columns, filesystem=filesystem)
    except (OSError, ValueError) as error:  # a damaged file: ArrowInvalid (a ValueError) or an IO error
        logger.warning("%s cannot be read (%s): left out", path, error)
        return None


def write_whole(path: str, table: pa.Table) -> None:
    """Writes a Parquet file under a temporary name, then moves it to `path`."""
    filesystem, inner = storage.resolve(path)
    staging = f"{inner}.{uuid.uuid4().hex}.part"
    pq.write_table(table, staging, filesystem=filesystem)
    filesystem.move(staging, inner)


def whole_files(output: str) -> pafs.FileSystem:
    """The file system Ray Data writes `output`'s Parquet files through: on a local path one whose
    output streams are renamed to their names once whole; an object store as it is."""
    filesystem = storage.resolve(output)[0]
    return pafs.PyFileSystem(WholeFiles()) if isinstance(filesystem, pafs.LocalFileSystem) else filesystem


class RenamedWhenWhole(io.FileIO):
    """A file written at `<path>.<random>.part`, moved to `path` when closed if it ends as a whole
    Parquet file does, removed otherwise (a write that failed half-way). (pyarrow's stream over
    it closes it: the hook is on this Python file, not on the stream.)"""

    def __init__(self, path: str):
        self.final = path
        super().__init__(f"{path}.{uuid.uuid4().hex}.part", "wb")

    def close(self) -> None:
        if self.closed:
            return
        size = self.tell()
        super().close()
        with open(self.name, "rb") as written:
            written.seek(max(size - len(PARQUET_END), 0))
            whole = written.read() == PARQUET_END
        if whole:
            os.replace(self.name, self.final)
        else:
            os.remove(self.name)


class WholeFiles(pafs.FileSystemHandler):
    """The local file system, its output streams RenamedWhenWhole."""

    def __init__(self):
        self.local = pafs.LocalFileSystem()

    def __eq__(self, other) -> bool:
        return isinstance(other, WholeFiles)

    def __ne__(self, other) -> bool:
        return not self == other

    def __reduce__(self):
        return WholeFiles, ()

    def get_type_name(self) -> str:
        return "local-whole-files"

    def normalize_path(self, path):
        return self.local.normalize_path(path)

    def get_file_info(self, paths):
        return self.local.get_file_info(paths)

    def get_file_info_selector(self, selector):
        return self.local.get_file_info(selector)

    def create_dir(self, path, recursive):
        self.local.create_dir(path, recursive=recursive)

    def delete_dir(self, path):
        self.local.delete_dir(path)

    def delete_dir_contents(self, path, missing_dir_ok=False):
        self.local.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self):
        raise OSError("refusing to delete the root directory's contents")

    def delete_file(self, path):
        self.local.delete_file(path)

    def move(self, src, dest):
        self.local.move(src, dest)

    def copy_file(self, src, dest):
        self.local.copy_file(src, dest)

    def open_input_stream(self, path):
        return self.local.open_input_stream(path)

    def open_input_file(self, path):
        return self.local.open_input_file(path)

    def open_output_stream(self, path, metadata):
        if path.endswith(".parquet"):
            return pa.PythonFile(RenamedWhenWhole(path), mode="w")
        return self.local.open_output_stream(path)

    def open_append_stream(self, path, metadata):
        return self.local.open_append_stream(path)

    def equals(self, other) -> bool:
        return self == other
