"""Retiring a series' old runs (pipeline/job/series_retire.py, `ngrammys retire`): the newest runs
kept whole, older files removed only where they hold no id's latest output; a dry run removes nothing."""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs import retire as retire_command
from pipeline.job.run import RunPaths
from pipeline.job.series import kept_latest, last_texts, output_files
from pipeline.job.series_retire import retire

IDS = [str(i) for i in range(12)]


def write_file(runs_root, run: int, part: int, rows: list[tuple[str, str | None, str | None]]) -> None:
    path = runs_root / f"run=r{run}" / f"part-{part}.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    ids, texts, errors = zip(*rows)
    pq.write_table(
        pa.table({"id": list(ids), "generated_text": list(texts), "error": pa.array(errors, pa.string())}), path
    )
    os.utime(path, ns=(run * 10**9, run * 10**9))  # run r<n> written at second n


@pytest.fixture
def history(tmp_path):
    """Six nightly runs: r0 writes every id (two files); each later run rewrites two ids (r3's second
    one fails), and r5 writes id 0 again."""
    paths = RunPaths(str(tmp_path), "", "nightly")
    root = tmp_path / "series=nightly"
    write_file(root, 0, 0, [(i, f"r0 {i}", None) for i in IDS[:6]])
    write_file(root, 0, 1, [(i, f"r0 {i}", None) for i in IDS[6:]])
    for run in range(1, 5):
        edited = [IDS[2 * run], IDS[2 * run + 1]]
        error = "engine failed" if run == 3 else None
        write_file(root, run, 0, [(edited[0], f"r{run} {edited[0]}", None), (edited[1], None if error else "x", error)])
    write_file(root, 5, 0, [("0", "r5 0", None)])
    return paths


def latest_texts(paths: RunPaths, index: str) -> list:
    written = output_files(paths.runs_root)
    return last_texts(IDS, kept_latest(paths.runs_root, index, written), paths.runs_root)


def supersede_the_first_runs(tmp_path) -> None:
    """r6 rewrites ids 1-3: r0's first file (ids 0-5) and r1's (ids 2-3) then hold no id's latest."""
    write_file(tmp_path / "series=nightly", 6, 0, [(i, f"r6 {i}", None) for i in ("1", "2", "3")])


def test_a_dry_run_says_what_it_would_remove_and_removes_nothing(history, tmp_path):
    supersede_the_first_runs(tmp_path)
    before = sorted(output_files(history.runs_root))
    plan = retire(history, keep_runs=2, dry_run=True)
    assert plan.runs == 7 and plan.kept_runs == ["r6", "r5"]
    assert plan.removed == ["run=r1/part-0.parquet", "run=r0/part-0.parquet"]
    assert sorted(output_files(history.runs_root)) == before and "would_remove" in plan.as_dict()


def test_retiring_keeps_every_ids_latest_output_and_the_newest_runs(history, tmp_path):
    before = latest_texts(history, history.outputs_index)
    plan = retire(history, keep_runs=2)
    # Every older file holds some id's latest output (id 7's newest row, an error, keeps r3's file).
    assert plan.removed == [] and len(plan.kept_for_latest) == 5
    supersede_the_first_runs(tmp_path)
    torn = tmp_path / "series=nightly" / "run=r0" / "part-9.parquet"
    torn.write_bytes(b"PAR1 torn")  # unreadable now: never removed for holding nothing
    os.utime(torn, ns=(0, 0))  # (written with r0)
    plan = retire(history, keep_runs=2)
    assert plan.removed == ["run=r1/part-0.parquet", "run=r0/part-0.parquet"] and torn.exists()
    torn.unlink()
    left = {name.split("/series=nightly/", 1)[1] for name in output_files(history.runs_root)}
    assert not left & set(plan.removed) and {"run=r6/part-0.parquet", "run=r5/part-0.parquet"} <= left
    after = latest_texts(history, history.outputs_index)
    rebuilt = latest_texts(history, str(tmp_path / "rebuilt.parquet"))  # an index made from the files left
    assert after == rebuilt == [before[0], "r6 1", "r6 2", "r6 3", *before[4:]]


def test_the_command_prints_its_plan_and_refuses_a_series_that_is_not_there(history, tmp_path, capsys):
    result = retire_command.main(["--output", str(tmp_path), "--series", "nightly", "--keep-runs", "3", "--dry-run"])
    assert json.loads(capsys.readouterr().out) == result and result["kept_runs"] == ["r5", "r4", "r3"]
    with pytest.raises(SystemExit):
        retire_command.main(["--output", str(tmp_path), "--series", "weekly", "--keep-runs", "3"])
    assert "no series under" in capsys.readouterr().err
