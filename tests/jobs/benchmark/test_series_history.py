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


def test_a_history_for_the_job_carries_the_fingerprints_the_job_gives_its_rows(tmp_path):
    """series-history --model: the history's rows and checkpoint hold the keys the job's own filter
    computes for the corpus it writes, so the rerun skips every unedited document."""
    import argparse

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from jobs.benchmark.series_rerun import JobHistory, prompt
    from pipeline.job.series import fingerprint_filter

    args = argparse.Namespace(
        engine="transformers", model="tests/none", max_new_tokens=8, store_tokens=1 << 20, overrides=[]
    )
    job = JobHistory(args, tmp_path, "history")
    versions = np.array([0, 3, 0], dtype=np.int32)
    fingerprints = job.at(versions).fingerprints(np.arange(3))
    job.record(pa.chunked_array([fingerprints]), "run-0000")
    corpus = pa.table({"id": [0, 1, 2], "prompt": [prompt(i, int(v)) for i, v in enumerate(versions)]})
    keys = fingerprint_filter(job.config, job.settings).keys(None, corpus)
    assert keys == fingerprints and len(set(keys)) == 3
    recorded = pq.read_table(tmp_path / "_checkpoints" / "series=history" / "rows" / "run-0000.parquet")
    assert recorded["fingerprint"].to_pylist() == fingerprints
