"""What the job's tasks compute per input block: its counts, and its unwritten rows carried back to
the driver where they are few (a night's changed rows), so that the run reads its input once."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from pipeline.job import block_counts
from pipeline.job.block_counts import carried_rows, count_block
from pipeline.job.ray_job import Counted
from pipeline.llm.checkpoint import FilteredUpstream, checkpoint_config, written_keys


@pytest.fixture
def counting(monkeypatch):
    """count_block's keywords for a checkpoint that holds ids 0 to 13 of a block of 16."""
    import ray

    monkeypatch.setattr(ray, "get", lambda ref: ref)  # the keys themselves stand for their ref
    config = checkpoint_config("id", "/tmp/unused", "id", manager_cls=FilteredUpstream)
    keys = written_keys(np.array([str(i) for i in range(14)], dtype=object))
    return {"checkpoint": config, "keys": [keys], "names": ["id", "prompt", "seed"]}


def block(rows: int = 16) -> pa.Table:
    return pa.table({"id": list(range(rows)), "prompt": [f"q{i}" for i in range(rows)], "unread": [0] * rows})


def test_a_block_with_few_unwritten_rows_carries_them_with_the_columns_read(counting):
    counted = count_block(block(), **counting)
    assert (counted["rows"], counted["new"], counted["bad"]) == ([16], [2], [0])
    (rows,) = carried_rows(counted["carried"])
    assert rows.to_pylist() == [{"id": 14, "prompt": "q14", "seed": None}, {"id": 15, "prompt": "q15", "seed": None}]


def test_a_block_with_many_or_large_unwritten_rows_carries_none(counting, monkeypatch):
    assert count_block(block(8), **counting)["carried"] == [None]  # every row new: a first run
    monkeypatch.setattr(block_counts, "CARRIED_BYTES", 16)
    assert count_block(block(), **counting)["carried"] == [None]


def test_the_driver_keeps_the_carried_rows_only_while_every_block_carried_its_own(counting, monkeypatch):
    def batch(*blocks):
        counts = [count_block(b, **counting) for b in blocks]
        return pa.table({name: sum((c[name] for c in counts), []) for name in counts[0]})

    counted = Counted()
    counted.add(batch(block(), block(14)))  # the second has nothing new, and carries nothing
    assert (counted.rows, counted.new, len(counted.carried)) == (30, 2, 1)
    counted.add(batch(block(9)))  # all written: nothing new, nothing carried, and the rows still carried
    assert len(counted.carried) == 1
    counted.add(batch(pa.table({"id": [20, 21], "prompt": ["a", "b"], "unread": [0, 0]})))  # all new: read again
    assert counted.carried is None and (counted.rows, counted.new) == (41, 4)
    monkeypatch.setattr("pipeline.job.ray_job.CARRIED_TOTAL", 1)
    over = Counted()
    over.add(batch(block()))
    assert over.carried is None and over.new == 2


def test_carried_blocks_take_one_schema_where_a_column_is_null_in_one():
    blocks = [
        pa.table({"id": [1], "seed": pa.nulls(1)}),
        pa.table({"id": [2], "seed": pa.array([7], pa.int64())}),
    ]
    tables = carried_rows([block_counts.ipc_bytes(t) for t in blocks])
    assert [t.schema for t in tables] == [pa.schema({"id": pa.int64(), "seed": pa.int64()})] * 2
    with pytest.raises((pa.ArrowInvalid, pa.ArrowTypeError)):
        carried_rows([block_counts.ipc_bytes(pa.table({"id": [1]})), block_counts.ipc_bytes(pa.table({"id": ["a"]}))])
