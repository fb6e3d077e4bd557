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


def count_block(table, checkpoint: CheckpointConfig | None, keys: list) -> dict:
    """One input block's rows, those not written (unwritten), and its bad lines with the first
    one's message (a one-row batch)."""
    kept = len(unwritten(table, checkpoint, keys))
    bad = [message for message in table[BAD_INPUT].to_pylist() if message] if BAD_INPUT in table.column_names else []
    return {"rows": [len(table)], "new": [kept], "bad": [len(bad)], "first_bad": [bad[0] if bad else None]}


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
