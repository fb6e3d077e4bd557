"""A series run's last outputs: the kept index of each id's latest output (from the narrow columns of
the files written since it was kept), and the texts read for the ids a run generates, from the row
groups that hold them."""

from __future__ import annotations

import functools

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.job import series_index
from pipeline.job.series import kept_latest, last_texts
from pipeline.job.series_index import sorted_keys


def latest_outputs(root, written):
    return kept_latest(str(root), str(root / "_index" / "index.parquet"), written)


def write_run(root, name: str, rows: list[tuple[str, str | None, str | None]], row_group_size: int = 2) -> str:
    path = root / f"run={name}" / "part.parquet"
    path.parent.mkdir(parents=True)
    ids, texts, errors = zip(*rows)
    table = pa.table(
        {
            "id": pa.array(ids, pa.string()),
            "generated_text": pa.array(texts, pa.string()),
            "error": pa.array(errors, pa.string()),
            "prompt": pa.array(["long prompt " * 50] * len(rows)),  # never read
        }
    )
    pq.write_table(table, path, row_group_size=row_group_size)
    return str(path)


def test_each_id_takes_its_latest_text_that_is_no_error_and_ids_without_one_take_none(tmp_path):
    first = write_run(tmp_path, "r1", [(str(i), f"first {i}", None) for i in range(7)])
    second = write_run(tmp_path, "r2", [("3", "second 3", None), ("5", None, "engine failed"), ("9", "second 9", None)])
    damaged = tmp_path / "run=r3" / "part.parquet"
    damaged.parent.mkdir()
    damaged.write_bytes(b"PAR1 torn")
    written = {first: 100, second: 200, str(damaged): 300}
    latest = latest_outputs(tmp_path, written)
    assert np.char.decode(sorted_keys(latest)).tolist() == sorted(
        ["0", "1", "2", "3", "4", "5", "6", "9"]
    )  # the torn file left out
    covered = series_index.load(str(tmp_path / "_index" / "index.parquet"))[1]
    assert set(covered) == {"run=r1/part.parquet", "run=r2/part.parquet"}  # the torn one is read again next time
    keys = ["3", "5", "6", "9", "new", "0"]
    assert last_texts(keys, latest, str(tmp_path)) == ["second 3", "first 5", "first 6", "second 9", None, "first 0"]
    # The later run's file written earlier: the first run's text is the latest.
    swapped = kept_latest(str(tmp_path), str(tmp_path / "other-index.parquet"), {first: 300, second: 200})
    assert last_texts(["3", "9"], swapped, str(tmp_path)) == ["first 3", "second 9"]


def test_an_empty_history_finds_nothing(tmp_path):
    latest = latest_outputs(tmp_path, {})
    assert latest.num_rows == 0 and last_texts(["a"], latest, str(tmp_path)) == [None]


def test_ids_of_any_width_and_script_find_their_own_text(tmp_path):
    ids = ["9", "10", "100", "é", "日本", "a" * 40]
    path = write_run(tmp_path, "r1", [(i, f"text {i}", None) for i in ids])
    latest = latest_outputs(tmp_path, {path: 1})
    asked = ["100", "1", "日本", "10", "a" * 41, "é", "9", "a" * 40]
    expected = ["text 100", None, "text 日本", "text 10", None, "text é", "text 9", "text " + "a" * 40]
    assert last_texts(asked, latest, str(tmp_path)) == expected


def test_only_the_row_groups_of_the_ids_looked_up_are_read(tmp_path, monkeypatch):
    path = write_run(tmp_path, "r1", [(str(i), f"text {i}", None) for i in range(10)], row_group_size=3)
    latest = latest_outputs(tmp_path, {path: 1})
    read = []
    original = pq.ParquetFile.read_row_groups

    def recording(self, groups, *args, **kwargs):
        read.append(list(groups))
        return original(self, groups, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "read_row_groups", recording)
    assert last_texts(["7", "1", "8"], latest, str(tmp_path)) == ["text 7", "text 1", "text 8"]
    assert read == [[0, 2]]  # rows 1, 7 and 8 of groups [0-2], [3-5], [6-8], [9]


def test_a_file_read_by_many_blocks_has_its_footer_parsed_once(tmp_path, monkeypatch):
    from pipeline.job import series

    path = write_run(tmp_path, "r1", [(str(i), f"text {i}", None) for i in range(10)], row_group_size=3)
    latest = latest_outputs(tmp_path, {path: 1})
    parsed = []
    original = series.footer.__wrapped__
    monkeypatch.setattr(series, "footer", functools.lru_cache(lambda *a: parsed.append(a) or original(*a)))
    blocks = [["7", "1"], ["8"], ["0", "9"]]
    assert [last_texts(keys, latest, str(tmp_path)) for keys in blocks] == [
        ["text 7", "text 1"],
        ["text 8"],
        ["text 0", "text 9"],
    ]
    assert parsed == [(str(tmp_path), path)]


def test_the_index_is_kept_and_a_run_reads_only_the_files_written_since(tmp_path, monkeypatch):
    first = write_run(tmp_path, "r1", [(str(i), f"first {i}", None) for i in range(5)])
    index_path = str(tmp_path / "_index" / "index.parquet")
    kept_latest(str(tmp_path), index_path, {first: 100})
    scanned = []
    original = series_index.scan

    def recording(runs_root, files):
        scanned.append(sorted(files))
        return original(runs_root, files)

    monkeypatch.setattr(series_index, "scan", recording)
    second = write_run(tmp_path, "r2", [("1", "second 1", None), ("2", None, "engine failed"), ("7", "second 7", None)])
    latest = kept_latest(str(tmp_path), index_path, {first: 100, second: 200})
    assert scanned == [["run=r2/part.parquet"]]  # the first run's file is not read again
    keys = ["0", "1", "2", "7"]
    assert last_texts(keys, latest, str(tmp_path)) == ["first 0", "second 1", "first 2", "second 7"]
    # The same as an index built from every file at once.
    whole = kept_latest(str(tmp_path), str(tmp_path / "whole.parquet"), {first: 100, second: 200})
    assert last_texts(keys, whole, str(tmp_path)) == last_texts(keys, latest, str(tmp_path))
    # An id whose newest row is an error row keeps it in the index too (retirement keeps its file).
    index, covered = series_index.load(index_path)
    errors = index.filter(index["error"])
    assert errors["key"].to_pylist() == ["2"] and set(covered) == {"run=r1/part.parquet", "run=r2/part.parquet"}
    scanned.clear()
    kept_latest(str(tmp_path), index_path, {first: 100, second: 200})
    assert scanned == []  # nothing new: nothing read, nothing written


def test_a_file_gone_from_the_runs_leaves_the_index_or_rebuilds_it_where_it_pointed_into_it(tmp_path):
    first = write_run(tmp_path, "r1", [("a", "first a", None), ("b", "first b", None)])
    second = write_run(tmp_path, "r2", [("a", "second a", None)])
    index_path = str(tmp_path / "_index" / "index.parquet")
    kept_latest(str(tmp_path), index_path, {first: 100, second: 200})
    # r2 gone (set aside, removed by hand): 'a' has its first output again, from a rebuilt index.
    latest = kept_latest(str(tmp_path), index_path, {first: 100})
    assert last_texts(["a", "b"], latest, str(tmp_path)) == ["first a", "first b"]
    # A torn index is built again from the files.
    (tmp_path / "_index" / "index.parquet").write_bytes(b"PAR1 torn")
    latest = kept_latest(str(tmp_path), index_path, {first: 100, second: 200})
    assert last_texts(["a", "b"], latest, str(tmp_path)) == ["second a", "first b"]
