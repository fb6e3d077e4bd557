"""What the job's Ray Data tasks compute per block, in a module that imports no engine (torch,
transformers): each task's worker imports only what its function needs, and a read or count task
that imported the engines would pay seconds per new worker process."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.job.inputs import with_columns
from pipeline.llm.schema import BAD_INPUT

if TYPE_CHECKING:
    from ray.data.checkpoint import CheckpointConfig


def unwritten(block, checkpoint: CheckpointConfig | None, keys: list):
    """The rows of an input block (pandas or Arrow) whose key is not among the written keys
    (keys[0]: their ObjectRef), by the checkpoint's filter; the block as it is without a checkpoint."""
    if checkpoint is None:
        return block
    return checkpoint.checkpoint_filter_cls(checkpoint, keys[0]).filter_rows_for_block(block)


def unwritten_columns(block, names: list[str], checkpoint: CheckpointConfig | None, keys: list):
    """The block's unwritten rows, with exactly the columns `names` (inputs.with_columns)."""
    return with_columns(unwritten(block, checkpoint, keys), names)


# A block's unwritten rows ride back to the driver with its count where they are few (a night's
# changed rows, not a first run's every row): the run then generates from them and reads its input
# once; the rows of a night that changed more are read again as the actors take them.
CARRIED_SHARE = 1 / 8  # at most this share of the block's rows
CARRIED_BYTES = 8 << 20  # and at most this many bytes of them


def count_block(table, checkpoint: CheckpointConfig | None, keys: list, names: list[str]) -> dict:
    """One input block's rows, those not written (unwritten), its bad lines with the first one's
    message, and its unwritten rows with exactly the columns `names` as Arrow IPC where they are
    few (CARRIED_SHARE, CARRIED_BYTES; None otherwise, or where there are none): a one-row batch."""
    kept = unwritten(table, checkpoint, keys)
    bad = [message for message in table[BAD_INPUT].to_pylist() if message] if BAD_INPUT in table.column_names else []
    carried = None
    if 0 < len(kept) <= len(table) * CARRIED_SHARE:
        rows = with_columns(kept, names)
        carried = ipc_bytes(rows) if rows.nbytes <= CARRIED_BYTES else None
    return {
        "rows": [len(table)],
        "new": [len(kept)],
        "bad": [len(bad)],
        "first_bad": [bad[0] if bad else None],
        "carried": [carried],
    }


def ipc_bytes(table) -> bytes:
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def carried_rows(blobs: list[bytes]) -> list:
    """The tables count_block carried (ipc_bytes), cast to one schema (a column null in one block
    and text in another is text in all)."""
    import pyarrow as pa

    tables = [pa.ipc.open_stream(blob).read_all() for blob in blobs]
    schema = pa.unify_schemas([table.schema for table in tables], promote_options="permissive")
    return [table.cast(schema) for table in tables]


SUMS = {
    "generated_tokens": "num_generated_tokens",
    "target_calls": "num_target_calls",
    "forward_calls": "forward_call_share",
    "checked_draft_tokens": "num_checked_draft_tokens",
    "acceptance_probability_sum": "sum_acceptance_probability",
    "accepted_prediction_tokens": "accepted_prediction_tokens",
    "rejected_prediction_tokens": "rejected_prediction_tokens",
}


def block_totals(table) -> dict:
    """One block's rows, errored rows and sums (a one-row batch)."""
    import pyarrow.compute as pc

    row = {
        "rows": [table.num_rows],
        "errored_rows": [table.num_rows - table.column("error").null_count],
        "changed_rows": [pc.sum(table.column("changed").cast("int64")).as_py() or 0],
    }
    row.update({name: [pc.sum(table.column(column)).as_py() or 0] for name, column in SUMS.items()})
    return row
