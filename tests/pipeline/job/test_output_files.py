"""Output files written whole, and those that cannot be read set aside with their checkpoint entries."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.job.output_files import set_aside_unreadable, whole_files


def test_a_write_killed_half_way_leaves_no_parquet_file(tmp_path):
    filesystem = whole_files(str(tmp_path))
    with filesystem.open_output_stream(str(tmp_path / "whole.parquet")) as stream:
        pq.write_table(pa.table({"id": ["a"]}), stream)
    with pytest.raises(RuntimeError):
        with filesystem.open_output_stream(str(tmp_path / "cut.parquet")) as stream:
            stream.write(b"PAR1 and then the writer died")
            raise RuntimeError("the worker died")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["whole.parquet"]
    assert pq.read_table(tmp_path / "whole.parquet")["id"].to_pylist() == ["a"]


def test_unreadable_files_are_set_aside_with_their_checkpoint_entries(tmp_path):
    """As Ray Data names them: a write's checkpoint file `W.parquet`, its data files `W-0.parquet`, ..."""
    run, checkpoints = tmp_path / "run=r", tmp_path / "_checkpoints" / "run=r"
    run.mkdir()
    checkpoints.mkdir(parents=True)
    for write, files in (
        ("w1_000000", {"-0": ["a", "b"]}),
        ("w2_000001", {"-0": ["c"], "-1": ["d", "e"]}),
        ("w3_000002", {"-0": ["f"]}),
    ):
        pq.write_table(pa.table({"id": [i for ids in files.values() for i in ids]}), checkpoints / f"{write}.parquet")
        for suffix, ids in files.items():
            pq.write_table(pa.table({"id": ids, "text": ["x"] * len(ids)}), run / f"{write}{suffix}.parquet")
    for torn in ("w1_000000-0", "w2_000001-1"):
        data = (run / f"{torn}.parquet").read_bytes()
        (run / f"{torn}.parquet").write_bytes(data[: len(data) // 2])

    moved = set_aside_unreadable(str(tmp_path), str(run), str(checkpoints), "id")

    assert [entry["file"] for entry in moved] == [str(run / "w1_000000-0.parquet"), str(run / "w2_000001-1.parquet")]
    assert all("not a readable Parquet file" in entry["error"] for entry in moved)
    aside = tmp_path / "_set_aside"
    assert sorted(p.name for p in (aside / "run=r").iterdir()) == ["w1_000000-0.parquet", "w2_000001-1.parquet"]
    assert sorted(p.name for p in run.iterdir()) == ["w2_000001-0.parquet", "w3_000002-0.parquet"]
    # The checkpoint holds exactly the ids of the files that read: the lost ones are generated again.
    held = pa.concat_tables([pq.read_table(p) for p in sorted(checkpoints.iterdir())])["id"].to_pylist()
    assert sorted(held) == ["c", "f"]
    assert sorted(p.name for p in (aside / "_checkpoints" / "run=r").iterdir()) == [
        "w1_000000.parquet",
        "w2_000001.parquet",
    ]
    assert set_aside_unreadable(str(tmp_path), str(run), str(checkpoints), "id") == []
