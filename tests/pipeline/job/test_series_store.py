"""A series' store of earlier outputs (pipeline/job/series_store.py), kept by the job after each run:
built from the runs it does not hold, extended, versioned, and drafted from by default. No model
and no Ray cluster: the store's task runs in-process."""

import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from drafters.datastore import Datastore
from drafters.suffix.store_search import SEPARATOR
from pipeline import storage
from pipeline.config import load_config
from pipeline.job.run import RunPaths
from pipeline.job.series_store import current_version, extend_store, series_datastore

extend = extend_store._function  # the Ray task's body
MODEL = load_config().model.name


def write_run(
    runs_root, run_id: str, rows: list[tuple[list[int], str | None]], model: str = MODEL, name: str = "0.parquet"
) -> None:
    directory = runs_root / f"run={run_id}"
    directory.mkdir(parents=True, exist_ok=True)
    pq.write_table(
        pa.table(
            {
                "generated_tokens": pa.array([tokens for tokens, _ in rows], pa.list_(pa.int64())),
                "error": pa.array([error for _, error in rows], pa.string()),
                "model": pa.array([model] * len(rows), pa.string()),
            }
        ),
        directory / name,
    )


def documents(store: Datastore) -> list[list[int]]:
    tokens = np.asarray(store.tokens).tolist()
    found, current = [], []
    for token in tokens + [int(SEPARATOR)]:
        if token == SEPARATOR:
            found.append(current)
            current = []
        else:
            current.append(token)
    return [document for document in found if document]  # (a segment ends with a SEPARATOR)


def test_the_store_holds_every_runs_generated_rows_once_and_is_extended_run_by_run(tmp_path):
    config = load_config(overrides=[f"job.output={tmp_path / 'out'}", "job.series=nightly"])
    paths = RunPaths.of(config, "unused")
    runs_root, store = tmp_path / "out" / "series=nightly", paths.store
    assert (
        paths.runs_root == str(runs_root)
        and store
        == str(tmp_path / "out" / "_checkpoints" / "series=nightly" / "store")
        + f"/model={paths.store.rsplit('=', 1)[1]}"
    )
    assert extend(config, paths) is None and series_datastore(config, store) == ""  # nothing run yet
    write_run(runs_root, "r1", [([1, 2, 3], None), ([9, 9], "row 'x': refused"), ([], None)])
    write_run(runs_root, "r2", [([4, 5], None)])  # a run that was never resumed is taken in too
    write_run(runs_root, "r2", [([7, 7, 7], None)], model="another", name="1.parquet")  # another model's: left out
    first = extend(config, paths)
    assert (first["runs"], first["documents"], first["tokens"]) == (2, 2, 5)
    assert sorted(documents(Datastore.open(current_version(store)))) == [[1, 2, 3], [4, 5]]
    assert extend(config, paths)["path"] == first["path"]  # no new run: the same version
    write_run(runs_root, "r3", [([6, 7, 8], None)])
    write_run(runs_root, "r1", [([9, 8], None)], name="1.parquet")  # r1 resumed after the store took it in
    second = extend(config, paths)
    extended = Datastore.open(second["path"])
    assert sorted(documents(extended)[-2:]) == [[6, 7, 8], [9, 8]] and second["runs"] == 3
    assert storage.list_directories(store, "v=") == [second["path"].rsplit("/", 1)[1]]
    # The next run drafts from the newest version, unless the config names a store of its own.
    assert series_datastore(config, store) == second["path"]
    own = load_config(
        overrides=[
            f"job.output={tmp_path / 'out'}",
            "job.series=nightly",
            "drafting.drafter=rest",
            f"drafting.datastore={tmp_path / 'elsewhere'}",
        ]
    )
    assert series_datastore(own, store) == own.drafting.datastore
    no_drafts = load_config(overrides=[f"job.output={tmp_path / 'out'}", "job.series=nightly", "drafting.w=0"])
    assert series_datastore(no_drafts, store) == ""


def test_a_series_copied_elsewhere_finds_its_store_holding_its_files(tmp_path):
    """The store names the runs' files by their path under the series: a series moved or copied to
    another directory (or bucket) extends its store with new runs only, never its old ones again."""
    config = load_config(overrides=[f"job.output={tmp_path / 'out'}", "job.series=nightly"])
    write_run(tmp_path / "out" / "series=nightly", "r1", [([1, 2, 3], None), ([4, 5], None)])
    assert extend(config, RunPaths.of(config, "unused"))["documents"] == 2
    shutil.copytree(tmp_path / "out", tmp_path / "copy")
    copied = load_config(overrides=[f"job.output={tmp_path / 'copy'}", "job.series=nightly"])
    paths = RunPaths.of(copied, "unused")
    write_run(tmp_path / "copy" / "series=nightly", "r2", [([6, 7], None)])
    extended = extend(copied, paths)
    assert (extended["runs"], extended["documents"]) == (2, 3)
    assert sorted(documents(Datastore.open(extended["path"]))) == [[1, 2, 3], [4, 5], [6, 7]]


def write_ids(runs_root, run_id: str, rows: list[tuple[str, list[int]]]) -> None:
    directory = runs_root / f"run={run_id}"
    directory.mkdir(parents=True, exist_ok=True)
    pq.write_table(
        pa.table(
            {
                "id": [key for key, _ in rows],
                "generated_tokens": pa.array([tokens for _, tokens in rows], pa.list_(pa.int64())),
                "error": pa.nulls(len(rows), pa.string()),
                "model": [MODEL] * len(rows),
            }
        ),
        directory / "0.parquet",
    )


def live(result: dict) -> list[list[int]]:
    """The store's live documents: each segment's whose id no newer segment holds."""
    from pipeline.job.store_segments import read_segments

    root, names = result["path"].rsplit("/", 1)[0], Datastore.open(result["path"]).meta["segments"]
    kept = []
    for segment in read_segments(root, names):
        store = Datastore.open(f"{root}/{segment.name}")
        kept += [d for d, alive in zip(documents(store), segment.live) if alive]
    return kept


def test_a_run_adds_a_segment_of_what_it_generated_and_reads_only_its_own_files(tmp_path, monkeypatch):
    from pipeline.job import series_store

    config = load_config(overrides=[f"job.output={tmp_path / 'out'}", "job.series=nightly", "job.store_tokens=40"])
    paths, runs_root = RunPaths.of(config, "unused"), tmp_path / "out" / "series=nightly"
    write_ids(runs_root, "r1", [("a", [1, 1]), ("b", [2, 2]), ("c", [3, 3])])
    assert (extend(config, paths)["documents"], extend(config, paths)["segments"]) == (3, 1)
    read = []
    original = series_store.readable_columns
    monkeypatch.setattr(
        series_store, "readable_columns", lambda fs, path, *a: read.append(path) or original(fs, path, *a)
    )
    write_ids(runs_root, "r2", [("b", [4, 4, 4]), ("d", [5])])  # b edited: its new answer supersedes the old
    second = extend(config, paths)
    assert [path.rsplit("/", 2)[-2] for path in read] == ["run=r2"]  # the first run's file is not read again
    assert (second["segments"], second["added"], second["superseded"]) == (2, 2, 1)
    assert sorted(live(second)) == [[1, 1], [3, 3], [4, 4, 4], [5]] and second["documents"] == 4
    # b's old answer stays in the first segment (drafts are verified) until it is rewritten: once
    # most of a segment is superseded, its live outputs are written anew and the old one goes.
    write_ids(runs_root, "r3", [("a", [6]), ("c", [7])])
    third = extend(config, paths)
    assert third["rewritten"] == 1 and sorted(documents(Datastore.open(third["path"]))) == [[4, 4, 4], [5], [6], [7]]
    segments = storage.list_directories(paths.store, "seg=")
    assert len(segments) == third["segments"] == 2  # the rewritten segment removed with the old versions


def test_past_store_tokens_the_oldest_segment_goes_and_too_many_segments_merge(tmp_path, monkeypatch):
    from pipeline.job import store_segments

    monkeypatch.setattr(store_segments, "MAX_SEGMENTS", 3)
    config = load_config(overrides=[f"job.output={tmp_path / 'out'}", "job.series=nightly", "job.store_tokens=24"])
    paths, runs_root = RunPaths.of(config, "unused"), tmp_path / "out" / "series=nightly"
    for night in range(5):  # a segment of 2 tokens a night: merged in pairs of fewest tokens, at most 6
        write_ids(runs_root, f"r{night}", [(f"id{night}", [night + 1, night + 1])])
        result = extend(config, paths)
    assert result["segments"] == 3 and result["merged"] == 1 and result["documents"] == 5
    assert sorted(documents(Datastore.open(result["path"]))) == [[n + 1, n + 1] for n in range(5)]
    write_ids(runs_root, "big", [("big", list(range(10, 26)))])  # 16 tokens: over 24 with the rest
    result = extend(config, paths)
    assert result["dropped_segments"] >= 1 and result["tokens"] <= 24
    assert [10, 11, 12] == documents(Datastore.open(result["path"]))[-1][:3]  # the newest kept
