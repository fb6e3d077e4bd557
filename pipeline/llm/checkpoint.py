"""Resuming through Ray Data's checkpointing, for the job and pipeline.llm's processor alike: the
ids of the rows written are recorded as they are written, and a rerun skips the input rows whose id
is recorded. Ids are compared as the job names them (pipeline.llm.row_values.request_key: any type, as
text), so an id read as an integer from one file and written as text resumes exactly once."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from ray.data.checkpoint import CheckpointConfig
from ray.data.checkpoint.checkpoint_filter import IdColumnCheckpointManager, NumpyArrayBasedCheckpointFilter

from pipeline.llm.row_values import request_key


class InputIdCheckpointFilter(NumpyArrayBasedCheckpointFilter):
    """Skips input rows whose id (in `input_id_column`) a finished write recorded."""

    input_id_column = "id"

    def filter_rows_for_block(self, block):
        from ray.data.block import BlockAccessor

        if self.checkpointed_ids.shape[0] == 0 or len(block) == 0:
            return block
        if not hasattr(self, "written"):
            self.written = written_keys(self.checkpointed_ids)
        table = BlockAccessor.for_block(block).to_arrow()  # Ray's line-JSON reader makes pandas blocks
        return table.filter(pa.array(~found_in(self.written, self.keys(table))))

    def keys(self, table: pa.Table) -> list[str]:
        """The key each input row is recorded by: its id (a series: pipeline/job/series.py's fingerprint)."""
        return [request_key(value) for value in table[self.input_id_column].to_pylist()]


class WrittenKeysManager(IdColumnCheckpointManager):
    """Loads the checkpointed ids as Ray does, then hands out their keys (written_keys), made once in
    a task: each filter actor and counting task reads that array without a copy or a conversion."""

    def load_checkpoint(self, data_file_dir=None, data_file_filesystem=None):
        import ray

        ids, size = super().load_checkpoint(data_file_dir, data_file_filesystem)
        if ids is None:
            return ids, size
        return ray.remote(written_keys).options(num_cpus=KEYS_CPUS).remote(ids), size


class FilteredUpstream(WrittenKeysManager):
    """The checkpoint of a pipeline that filters its input itself, before the processor (the job:
    pipeline/job/ray_job.py loads the keys once, then counts and filters in its read's own tasks).
    Ray's read filter is handed no keys, so it starts no filter actor; the writes still record
    their ids."""

    def load_checkpoint(self, data_file_dir=None, data_file_filesystem=None):
        return None, 0


KEYS_CPUS = 0.25  # the task that makes them (a share, beside the job's actors on a small node)


def written_keys(ids: np.ndarray) -> np.ndarray:
    """The checkpointed ids as keys (request_key, UTF-8), in a sorted array of fixed-width bytes: a
    binary search looks a block up in it in C, and the object store hands it to each task without a
    copy (an array of Python strings is unpickled whole by every task that reads it)."""
    if ids.dtype.kind == "S":  # keys already (written_keys' own output)
        return ids
    texts = ids  # Ray's, of one Arrow column: all text, or none
    if not (ids.dtype == object and len(ids) and isinstance(ids[0], str)):
        texts = [request_key(value) for value in ids]
    return np.sort(utf8_keys(texts))


def utf8_keys(texts) -> np.ndarray:
    """Text keys as numpy's fixed-width UTF-8 bytes (the width of the longest), the form written_keys
    sorts and positions_in searches."""
    if not len(texts):
        return np.zeros(0, "S1")
    return np.char.encode(np.asarray(texts, dtype=str), "utf-8")


def found_in(written: np.ndarray, keys: list[str]) -> np.ndarray:
    """Which of `keys` the sorted keys `written` (written_keys) hold."""
    return positions_in(written, keys) >= 0


def positions_in(written: np.ndarray, keys: list[str]) -> np.ndarray:
    """Where each of `keys` is in the sorted keys `written` (written_keys), -1 where it is not: a
    binary search each (numpy's isin compares every pair where the arrays hold objects, and Arrow's
    hashes the whole of `written` at every call: a block times the whole history)."""
    if not keys or not len(written):
        return np.full(len(keys), -1)
    probes = utf8_keys(keys)
    fits = np.char.str_len(probes) <= written.itemsize  # a longer key is no written one (not cut to fit)
    probes = probes.astype(written.dtype)
    at = np.minimum(np.searchsorted(written, probes), len(written) - 1)
    return np.where(fits & (written[at] == probes), at, -1)


def checkpoint_config(
    output_id_column: str,
    path: str,
    input_id_column: str | None = None,
    filter_cls: type = InputIdCheckpointFilter,
    manager_cls: type = WrittenKeysManager,
) -> CheckpointConfig:
    """Ray Data's checkpointing: the written rows' `output_id_column` recorded under `path` (kept after
    success), the input's `input_id_column` (the same name by default) looked up on read (by
    `filter_cls`'s keys, the written keys loaded by `manager_cls`)."""
    filter_cls = type("InputIdFilter", (filter_cls,), {"input_id_column": input_id_column or output_id_column})
    return CheckpointConfig(
        id_column=output_id_column,
        checkpoint_path=path,
        delete_checkpoint_on_success=False,
        checkpoint_filter_cls=filter_cls,
        checkpoint_manager_cls=manager_cls,
    )
