"""Resuming through Ray Data's checkpointing, for the job and pipeline.llm's processor alike: the
ids of the rows written are recorded as they are written, and a rerun skips the input rows whose id
is recorded. Ids are compared as the job names them (pipeline.llm.row_values.request_key: any type, as
text), so an id read as an integer from one file and written as text resumes exactly once."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from ray.data.checkpoint import CheckpointConfig
from ray.data.checkpoint.checkpoint_filter import NumpyArrayBasedCheckpointFilter

from pipeline.llm.row_values import request_key


class InputIdCheckpointFilter(NumpyArrayBasedCheckpointFilter):
    """Skips input rows whose id (in `input_id_column`) a finished write recorded."""

    input_id_column = "id"

    def filter_rows_for_block(self, block):
        from ray.data.block import BlockAccessor

        if self.checkpointed_ids.shape[0] == 0 or len(block) == 0:
            return block
        if not hasattr(self, "checkpointed_keys"):
            self.checkpointed_keys = np.array([request_key(value) for value in self.checkpointed_ids], dtype=object)
        table = BlockAccessor.for_block(block).to_arrow()  # Ray's line-JSON reader makes pandas blocks
        keys = np.array(self.keys(table), dtype=object)
        return table.filter(pa.array(~np.isin(keys, self.checkpointed_keys)))

    def keys(self, table: pa.Table) -> list[str]:
        """The key each input row is recorded by: its id (a series: pipeline/job/series.py's fingerprint)."""
        return [request_key(value) for value in table[self.input_id_column].to_pylist()]


def checkpoint_config(
    output_id_column: str, path: str, input_id_column: str | None = None, filter_cls: type = InputIdCheckpointFilter
) -> CheckpointConfig:
    """Ray Data's checkpointing: the written rows' `output_id_column` recorded under `path` (kept after
    success), the input's `input_id_column` (the same name by default) looked up on read (by
    `filter_cls`'s keys)."""
    filter_cls = type("InputIdFilter", (filter_cls,), {"input_id_column": input_id_column or output_id_column})
    return CheckpointConfig(
        id_column=output_id_column,
        checkpoint_path=path,
        delete_checkpoint_on_success=False,
        checkpoint_filter_cls=filter_cls,
    )
