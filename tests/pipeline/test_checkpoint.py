import numpy as np
import pyarrow as pa

from pipeline.llm.checkpoint import checkpoint_config


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
