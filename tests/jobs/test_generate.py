"""The job as users launch it, in a process of its own (`ray job submit` to a Ray head from the
installed wheel: tests/test_wheel.py)."""

import json
import sys
from pathlib import Path

import pytest

from tests.outputs import read_run
from tests.processes import environment

REPO = Path(__file__).resolve().parents[2]


GOLDEN = REPO / "tests" / "data" / "golden_job_run.json"
# What a run's Parquet holds that does not depend on the machine: its schema and every column but
# the timings, the model's path (a temporary directory), how Ray Data cut the batches (batch_uuid,
# the actor's request_id) and the statistics that `w: auto` makes from measured step costs (how
# many calls, which drafts were checked).
MEASURED = {
    "model",
    "fingerprint",
    "batch_uuid",
    "request_id",
    "forward_call_share",
    "draft_cost_ratio",
    "draft_seconds",
    "median_draft_seconds",
    "verify_seconds",
    "time_taken_llm",
    "num_target_calls",
    "num_verified_tokens",
    "tokens_per_call",
    "accepted_length_histogram",
    "accepted_rank_histogram",
    "strategy_rows",
    "strategy_wins",
    "strategy_accepted_tokens",
    "num_checked_draft_tokens",
    "sum_acceptance_probability",
    "acceptance_rate",
}


def assert_golden(run_dir: Path, golden: Path) -> None:
    """The job's Parquet against a run held in tests/data (NGRAMMYS_UPDATE_GOLDEN=1 rewrites it,
    for a change of output that is meant)."""
    import os

    import pyarrow.parquet as pq

    from tests.outputs import run_files

    schema = pq.read_schema(run_files(run_dir)[0])
    rows = sorted(read_run(run_dir), key=lambda row: row["id"])
    held = {
        "schema": [[field.name, str(field.type)] for field in schema],
        "rows": [{name: value for name, value in row.items() if name not in MEASURED} for row in rows],
    }
    if os.environ.get("NGRAMMYS_UPDATE_GOLDEN"):
        golden.write_text(json.dumps(held, indent=1) + "\n")
    expected = json.loads(golden.read_text())
    assert held["schema"] == expected["schema"], "the job's output schema changed"
    for row, want in zip(held["rows"], expected["rows"], strict=True):
        assert row == want, f"row {want['id']} differs from {golden.name}"


@pytest.mark.slow  # a job run in a process of its own (about 35 s): make test-slow
def test_a_job_given_an_input_reads_all_of_it_and_says_what_it_read(tiny_model_dir, tmp_path, processes):
    """The default config (the README's form) on a 30-row file writes 30 rows, the same as the
    golden run's, and says so. (A limit, the user's to set: test_ray_job_submit_runs_the_job_on_a_ray_head.)"""
    inputs = tmp_path / "corpus.jsonl"
    inputs.write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"Say {i}"}) + "\n" for i in range(30)))
    command = [
        sys.executable,
        "-m",
        "jobs.generate",
        "--config",
        "configs/default.yaml",
        "--input",
        str(inputs),
        "--output",
        str(tmp_path / "out"),
        "--run-id",
        "all",
        "--set",
        f"model.name={tiny_model_dir}",
        "--set",
        "sampling.max_new_tokens=6",
        "--set",
        "engine.name=transformers",
    ]  # the rows read are the point here, not the engine
    full = processes.run(command, cwd=REPO, env=environment(), timeout=400)
    rows = read_run(tmp_path / "out" / "run=all")
    assert sorted(row["id"] for row in rows) == sorted(f"q{i}" for i in range(30))
    assert_golden(tmp_path / "out" / "run=all", GOLDEN)
    summary = json.loads((tmp_path / "out" / "run=all" / "summary.json").read_text())
    assert (summary["input_rows"], summary["rows_read"], summary["rows"]) == (30, 30, 30)
    assert "Read 30 of the input's 30 rows: 30 generated, 0 errored, 0 skipped as already done." in full.stdout
