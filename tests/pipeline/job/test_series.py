"""A series' row fingerprints (pipeline/job/series.py): a block of plain rows keyed from its columns
as each row alone is."""

import pyarrow as pa

from pipeline.config import load_config
from pipeline.job.series import fingerprint_filter, plain_fingerprints, row_fingerprint, settings_fingerprint


def test_a_block_of_plain_rows_fingerprints_as_each_row_does_and_other_blocks_row_by_row():
    config = load_config(overrides=["job.series=nightly"])
    settings = settings_fingerprint(config)
    prompts = ['Doc "one"\n', "été", None, "", "x" * 300]
    for ids in ([1, 2, 3, 4, 5], [1.0, 2.5, None, 4.0, 5.0], ["a", "b", "c", "d", "e"]):
        block = pa.table({"id": ids, "prompt": prompts, "prediction": ["p"] * 5})
        expected = [row_fingerprint(config, settings, row) for row in block.to_pylist()]
        assert plain_fingerprints(config, settings, block) == expected
        assert fingerprint_filter(config, settings).keys(None, block) == expected
        assert len(set(expected)) == 5
    own = pa.table({"id": [1, 2], "prompt": ["a", "b"], "temperature": [0.5, None]})
    assert plain_fingerprints(config, settings, own) is None  # a row's own setting: row by row
    assert fingerprint_filter(config, settings).keys(None, own) == [
        row_fingerprint(config, settings, row) for row in own.to_pylist()
    ]
    messages = load_config(overrides=["job.series=nightly", "input.prompt_column=''", "input.messages_column=m"])
    chat = pa.table({"id": [1], "m": [[{"role": "user", "content": "hi"}]]})
    assert plain_fingerprints(messages, settings, chat) is None
