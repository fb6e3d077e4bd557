"""lab edits (lab/edits.py): a series' runs written for the replay, drafted from by ours_prediction."""

import json
import sys
from pathlib import Path

import pytest

from jobs import benchmark
from tests.processes import environment

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.nightly  # vLLM started (about a minute): make test-nightly
def test_edits_writes_a_series_runs_that_the_replay_drafts_from(tiny_model_dir, tmp_path, processes):
    """edits --write-runs: plain vLLM's earlier run and an edited rerun as Parquet, the rows joined by
    id; the replay gives each edited row its earlier output as prediction (ours_prediction)."""
    runs = tmp_path / "runs"
    processes.run(
        [
            sys.executable,
            "-m",
            "lab",
            "edits",
            "--dataset",
            "corpus-rewrite-code",
            "--limit",
            "4",
            "--max-new-tokens",
            "8",
            "--batch",
            "4",
            "--edit",
            "line,field",
            "--write-runs",
            str(runs),
            "--model",
            str(tiny_model_dir),
            "--out",
            str(tmp_path / "edits.json"),
        ],
        cwd=REPO,
        env=environment(),
        timeout=600,
    )
    written = json.loads((tmp_path / "edits.json").read_text())
    assert [(r["run"], r["rows"]) for r in written["runs"]] == [("earlier", 4), ("line", 4), ("field", 4)]
    report = benchmark.main(
        [
            "replay",
            str(runs / "line"),
            "--predictions",
            str(runs / "earlier"),
            "--batch",
            "2",
            "--methods",
            "ours_prediction,plain",
            "--project",
            "",
            "--out",
            str(tmp_path / "r.json"),
        ]
    )
    assert report["predicted_answers"] == 4 and {r["method"] for r in report["replay"]} == {"ours_prediction", "plain"}
