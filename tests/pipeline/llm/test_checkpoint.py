import numpy as np
import pyarrow as pa

from pipeline.job.block_counts import unwritten_columns
from pipeline.llm.checkpoint import FilteredUpstream, checkpoint_config, found_in, written_keys


def test_ids_are_compared_as_text_on_both_sides():
    """A processor's output keeps its ids' type (integers here) and the next read may give them as
    text, or the other way round: each id resumes once either way."""
    config = checkpoint_config("id", "/tmp/unused", "key")
    assert (config.id_column, config.delete_checkpoint_on_success) == ("id", False)
    checkpoint_filter = object.__new__(config.checkpoint_filter_cls)  # its ids, as Ray loads them
    checkpoint_filter.checkpointed_ids = np.array([1, 2])
    kept = checkpoint_filter.filter_rows_for_block(pa.table({"key": ["1", "3", "2"], "prompt": ["a", "b", "c"]}))
    assert kept.column("key").to_pylist() == ["3"]
    checkpoint_filter = object.__new__(config.checkpoint_filter_cls)
    checkpoint_filter.checkpointed_ids = np.array(["1"], dtype=object)
    assert checkpoint_filter.filter_rows_for_block(pa.table({"key": [1, 4]})).column("key").to_pylist() == [4]


def test_a_block_is_looked_up_in_a_long_history_by_binary_search():
    """Text ids (a series' fingerprints) as Ray loads them, sorted: each key of a block found or not
    found exactly, at the ends of the history too, a key longer than every written one included."""
    written = written_keys(np.array(sorted(f"k{i:06d}" for i in range(0, 200_000, 2)), dtype=object))
    assert written_keys(written) is written
    keys = ["k000000", "k000001", "k199998", "k199999", "a", "z", "k100000", "k1000000", "k10000"]
    assert found_in(written, keys).tolist() == [True, False, True, False, False, False, True, False, False]
    assert found_in(written, []).tolist() == []
    assert found_in(written_keys(np.array(["é", "b"], dtype=object)), ["é", "e", "b"]).tolist() == [True, False, True]
    assert found_in(written_keys(np.array([10, 9, 100])), ["9", "10", "1", "100"]).tolist() == [True, True, False, True]


def test_the_job_filters_its_read_and_ray_starts_no_filter_of_its_own(monkeypatch):
    """The job's checkpoint hands Ray's read filter no keys (FilteredUpstream), and the job's own
    read task keeps the unwritten rows of a block (pandas, as the JSON reader makes them) with
    exactly the columns it reads; without a checkpoint it keeps every row."""
    import pandas as pd
    import ray

    monkeypatch.setattr(ray, "get", lambda ref: ref)  # the keys themselves stand for their ref
    config = checkpoint_config("id", "/tmp/unused", "key", manager_cls=FilteredUpstream)
    assert config.checkpoint_manager_cls(config, None).load_checkpoint("/tmp/unused") == (None, 0)
    block = pd.DataFrame({"key": [1, 2, 3], "prompt": ["a", "b", "c"], "unread": [0, 0, 0]})
    keys = written_keys(np.array(["2"], dtype=object))
    kept = unwritten_columns(block, ["key", "prompt", "seed"], config, [keys])
    assert kept.to_pylist() == [{"key": 1, "prompt": "a", "seed": None}, {"key": 3, "prompt": "c", "seed": None}]
    assert len(unwritten_columns(block, ["key"], None, [None])) == 3
