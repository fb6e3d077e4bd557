"""The job as users launch it: `ray job submit` to a running Ray head."""
import json
import sys
import time
from pathlib import Path

import pytest

from tests.outputs import read_run
from tests.processes import environment, start_ray_head

REPO = Path(__file__).resolve().parents[2]
RAY = str(Path(sys.executable).parent / "ray")


def scrape_counters(port: str, run_id: str, expected: dict, timeout: float = 60) -> dict:
    """Our counters for `run_id` on Ray's metrics endpoint, polled until they reach `expected`
    (the actors report every second here) or the timeout."""
    import re
    import urllib.request

    deadline, found = time.monotonic() + timeout, {}
    while time.monotonic() < deadline:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        found = {}
        for name, labels, value in re.findall(r"^ray_ngrammys_(\w+)_total\{([^}]*)\} (\S+)$", text, re.M):
            if f'run_id="{run_id}"' in labels:
                found[name] = found.get(name, 0.0) + float(value)
        if all(found.get(name, 0) >= value for name, value in expected.items()):
            break
        time.sleep(2)
    return found


@pytest.mark.slow  # a Ray head of its own: make test-slow
def test_ray_job_submit_runs_the_job_on_a_ray_head(tiny_model_dir, tmp_path, processes):
    """As users launch it, with a limit of the user's: the summary and the printed line say how many
    of the input's rows were not read."""
    inputs = tmp_path / "in.jsonl"
    inputs.write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"Count to {i}"}) + "\n" for i in range(4)))
    # Token authentication stays on. Ray refuses to start a token head without a token, so the
    # test makes its own, as the README tells a user to, in a home directory of its own.
    env = environment(HOME=str(tmp_path / "home"), RAY_AUTH_MODE="token", RAY_metrics_report_interval_ms="1000")
    processes.run([RAY, "get-auth-token", "--generate"], timeout=60, env=env)
    assert (tmp_path / "home" / ".ray" / "auth_token").is_file()
    head = start_ray_head(processes, env)
    try:
        submitted = processes.run(
            [RAY, "job", "submit", "--address", head["dashboard"], "--working-dir", ".", "--",
             sys.executable, "-m", "jobs.generate", "--config", "configs/default.yaml", "--input", str(inputs),
             "--output", str(tmp_path / "out"), "--run-id", "submitted", "--set", f"model.name={tiny_model_dir}",
             "--set", "decoder.max_new_tokens=5", "--set", "input.limit=3"],
            cwd=REPO, env=env, timeout=400)
        counters = scrape_counters(head["metrics_port"], "submitted", {"rows": 3, "generation_tokens": 15})
        # A user who joins it without the token (and without RAY_AUTH_MODE) is told what to run.
        forgot = {key: value for key, value in environment(HOME=str(tmp_path / "other-home"),
                                                           RAY_ADDRESS=head["gcs"]).items() if key != "RAY_AUTH_MODE"}
        refused = processes.run([sys.executable, "-m", "jobs.generate", "--input", str(inputs)], cwd=REPO,
                                env=forgot, timeout=120, check=False)
    finally:
        processes.run([RAY, "stop", "--force"], env=env, timeout=120, check=False)
    assert refused.returncode != 0 and "run `ray get-auth-token --generate`" in refused.stderr
    assert "succeeded" in submitted.stdout
    # The actors' live metrics reached Ray's Prometheus endpoint with the run's totals.
    assert counters["rows"] == 3 and counters["generation_tokens"] == 15, counters
    assert counters["target_calls"] >= 1, counters
    run_dir = tmp_path / "out" / "run=submitted"
    rows = read_run(run_dir)
    assert sorted(row["id"] for row in rows) == ["p0", "p1", "p2"]
    assert all(row["error"] is None and len(row["generated_tokens"]) == 5 for row in rows)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["input_rows"], summary["rows_read"], summary["rows"]) == (4, 3, 3)
    assert "Read 3 of the input's 4 rows (input.limit=3: 1 rows NOT read): 3 generated" in submitted.stdout


GOLDEN = REPO / "tests" / "data" / "golden_job_run.json"
# What a run's Parquet holds that does not depend on the machine: its schema and every column but
# the timings, the model's path (a temporary directory), how Ray Data cut the batches (batch_uuid,
# the actor's request_id) and the statistics that `w: auto` makes from measured step costs (how
# many calls, which drafts were checked).
MEASURED = {"model", "fingerprint", "batch_uuid", "request_id", "forward_call_share", "draft_cost_ratio", "draft_seconds", "median_draft_seconds",
            "verify_seconds", "time_taken_llm", "num_target_calls", "num_verified_tokens", "tokens_per_call",
            "accepted_length_histogram", "accepted_rank_histogram", "strategy_rows", "strategy_wins",
            "strategy_accepted_tokens", "num_checked_draft_tokens", "sum_acceptance_probability", "alpha"}


def assert_golden(run_dir: Path, golden: Path) -> None:
    """The job's Parquet against a run held in tests/data (NGRAMMYS_UPDATE_GOLDEN=1 rewrites it,
    for a change of output that is meant)."""
    import os

    import pyarrow.parquet as pq

    from tests.outputs import run_files

    schema = pq.read_schema(run_files(run_dir)[0])
    rows = sorted(read_run(run_dir), key=lambda row: row["id"])
    held = {"schema": [[field.name, str(field.type)] for field in schema],
            "rows": [{name: value for name, value in row.items() if name not in MEASURED} for row in rows]}
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
    command = [sys.executable, "-m", "jobs.generate", "--config", "configs/default.yaml", "--input", str(inputs),
               "--output", str(tmp_path / "out"), "--run-id", "all", "--set", f"model.name={tiny_model_dir}",
               "--set", "decoder.max_new_tokens=6",
               "--set", "engine.name=transformers"]  # the rows read are the point here, not the engine
    full = processes.run(command, cwd=REPO, env=environment(), timeout=400)
    rows = read_run(tmp_path / "out" / "run=all")
    assert sorted(row["id"] for row in rows) == sorted(f"q{i}" for i in range(30))
    assert_golden(tmp_path / "out" / "run=all", GOLDEN)
    summary = json.loads((tmp_path / "out" / "run=all" / "summary.json").read_text())
    assert (summary["input_rows"], summary["rows_read"], summary["rows"]) == (30, 30, 30)
    assert "Read 30 of the input's 30 rows: 30 generated, 0 errored, 0 skipped as already done." in full.stdout
