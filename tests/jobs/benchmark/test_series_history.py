"""bench series-history (jobs/benchmark/series_history.py): a synthetic history in the job's output
format, the rerun's planning timed against the index rebuilt from every file (tiny sizes)."""

import json

from jobs.benchmark.cli import main


def test_series_history_writes_its_history_and_times_the_reruns_planning(tmp_path):
    report = main(
        [
            "series-history",
            "--documents", "300",
            "--runs", "3",
            "--edited", "40",
            "--answer-tokens", "16",
            "--files-per-run", "3",
            "--work-dir", str(tmp_path / "history"),
            "--out", str(tmp_path / "report.json"),
        ]
    )  # fmt: skip
    assert (report["documents"], report["runs"], report["files"]) == (300, 3, 3 + 2 + 1)
    assert set(report["seconds"]) == {"list_files", "index_update", "last_texts", "planning", "index_rebuild"}
    assert json.loads((tmp_path / "report.json").read_text())["edited"] == 40
    assert "| 300 | 3 | 40 | 6 |" in (tmp_path / "report.md").read_text()
    index = tmp_path / "history" / "_checkpoints" / "series=history" / "outputs" / "index.parquet"
    assert index.is_file()  # kept, as each night's run keeps it
