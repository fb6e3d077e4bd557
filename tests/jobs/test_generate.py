"""The job as users launch it: `ray job submit` to a running Ray head."""
import json
import sys
import time
from importlib.util import find_spec
from pathlib import Path

import pytest

from jobs import benchmark
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
    assert all(row["error"] is None and len(row["token_ids"]) == 5 for row in rows)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["input_rows"], summary["rows_read"], summary["rows"]) == (4, 3, 3)
    assert "Read 3 of the input's 4 rows (input.limit=3: 1 rows NOT read): 3 generated" in submitted.stdout


GOLDEN = REPO / "tests" / "data" / "golden_job_run.json"
# What a run's Parquet holds that does not depend on the machine: its schema and every column but
# the timings, the model's path (a temporary directory) and the statistics that `w: auto` makes
# from measured step costs (how many calls, which drafts were checked).
MEASURED = {"model", "forward_call_share", "draft_cost_ratio", "draft_seconds", "median_draft_seconds",
            "verify_seconds", "total_seconds", "num_target_calls", "num_verified_tokens", "tokens_per_call",
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


def test_benchmark_writes_results_with_identity_checked(tiny_model_dir, tmp_path):
    out = tmp_path / "results.json"
    benchmark.main(["--dataset", "humaneval", "--limit", "2", "--max-new-tokens", "6", "--out", str(out),
                    "--model", str(tiny_model_dir), "--methods", "hf_prompt_lookup:3,plain,context_ngram:1:3"])
    runs = {run["method"]: run for run in json.loads(out.read_text())["runs"]}
    assert set(runs) == {"hf_greedy", "hf_prompt_lookup:3", "plain", "context_ngram:1:3"}
    assert all(run["identical_fraction"] == 1.0 and run["generated_tokens"] == 12 for run in runs.values())
    assert runs["plain"]["tokens_per_call"] == 1.0


def test_benchmark_samples_with_the_same_seeds_and_predicts_the_speedup(tiny_model_dir, tmp_path):
    out = tmp_path / "results.json"
    benchmark.main(["--dataset", "humaneval", "--limit", "2", "--max-new-tokens", "8", "--out", str(out),
                    "--model", str(tiny_model_dir), "--temperature", "0.8", "--top-p", "0.9", "--seed", "3",
                    "--methods", "plain,context_ngram:2:3,self_draft:1:2,hf_assisted:1:2"])
    runs = {run["method"]: run for run in json.loads(out.read_text())["runs"]}
    assert set(runs) == {"hf_sample", "plain", "context_ngram:2:3", "self_draft:1:2", "hf_assisted:1:2"}
    # Point drafts use the same per-position uniforms as plain sampling: the same samples.
    assert runs["context_ngram:2:3"]["identical_fraction"] == 1.0
    draft = runs["self_draft:1:2"]
    assert 0 <= draft["alpha"] <= 1 and draft["draft_cost_ratio"] > 0 and draft["predicted_speedup_vs_plain"] > 0
    assert all(run["generated_tokens"] == 16 for run in runs.values())


def test_benchmark_grid_sweeps_k_and_w_and_draws_the_figures(tiny_model_dir, tmp_path, monkeypatch):
    import pipeline.engines.transformers.engine as stage
    from pipeline.engines.transformers.cost_model import CostModel

    # A flat cost model stands in for measuring the tiny model (pipeline/test_cost_model covers measuring).
    table = [[1.0 + 0.1 * (k * w - 1) for w in (1, 2, 3, 5, 9)] for k in (1, 2, 4, 8, 16)]
    flat = CostModel((1, 2, 4, 8, 16), (1, 2, 3, 5, 9), (1, 1000), [table, table], [0.01, 0.01], "cpu")
    monkeypatch.setattr(stage, "cached_cost_model", lambda *args: flat)
    out = tmp_path / "grid.json"
    report = benchmark.main(["--grid", "--grid-drafter", "context_ngram", "--dataset", "humaneval,gsm8k",
                             "--limit", "1", "--max-new-tokens", "6", "--out", str(out), "--model", str(tiny_model_dir),
                             "--plots", str(tmp_path / "plots")])
    assert [r["dataset"] for r in json.loads(out.read_text())["datasets"]] == ["humaneval", "gsm8k"]
    for dataset in report["datasets"]:
        methods = {run["method"]: run for run in dataset["runs"]}
        assert len([m for m in methods if m.startswith("context_ngram:") and "auto" not in m]) == 20
        assert all(run["identical_fraction"] == 1.0 for run in methods.values())
        grid = dataset["grid"]
        assert grid["best_fixed"] in methods
        assert grid["best_fixed_speedup"] == max(methods[f"context_ngram:{k}:{w}"]["speedup_vs_hf_greedy"]
                                                 for k in (1, 2, 4, 8, 16) for w in (1, 2, 4, 8))
    names = sorted(p.name for p in (tmp_path / "plots").iterdir())
    for dataset in ("humaneval", "gsm8k"):
        for figure in ("tokens_per_call", "speedup", "accepted_length", "accepted_rank", "strategy_rows",
                       "strategy_wins"):
            assert f"{dataset}_{figure}.png" in names


def test_benchmark_throughput_compares_batched_methods_at_each_batch_size(tiny_model_dir, tmp_path):
    out = tmp_path / "throughput.json"
    report = benchmark.main(["--throughput", "--batch", "1,3", "--spec", "context_ngram:2:3", "--dataset", "humaneval",
                             "--limit", "4", "--max-new-tokens", "8", "--out", str(out), "--model", str(tiny_model_dir)])
    runs = report["throughput"]["runs"]
    # generate as its users get it, generate on our engine's attention call, ours plain, ours drafting.
    methods = ["hf_greedy", "hf_greedy_gqa", "plain", "context_ngram:2:3"]
    assert [(r["batch"], r["method"]) for r in runs[1:5]] == [(1, method) for method in methods]
    assert {r["method"] for r in runs if r["batch"] == 3} == set(methods)
    # Ours is identical to single-request greedy at every batch size (generate batched may not be).
    assert all(r["identical_fraction"] == 1.0 for r in runs if not r["method"].startswith("hf_greedy"))
    assert json.loads(out.read_text())["throughput"]["runs"] == runs


@pytest.mark.nightly  # vLLM started beside our engine (about 1.5 minutes): make test-nightly
def test_benchmark_compares_engines_side_by_side_on_the_same_prompts(tiny_model_dir, tmp_path, processes):
    """--throughput --engine vllm: vLLM plain, vLLM's n-gram, ours on vLLM and ours on the
    transformers engine, per batch size, each checked against plain greedy on the same engine.
    A process of its own: vLLM's n-gram imports numba, which no later vLLM start in a process survives."""
    out = tmp_path / "engines.json"
    processes.run([sys.executable, "-m", "jobs.benchmark", "--throughput", "--engine", "vllm", "--batch", "1,2",
                   "--spec", "context_ngram:1:3,mixed:1:auto", "--reference", "context_ngram:2:3",
                   "--dataset", "humaneval", "--limit", "3", "--rounds", "2", "--max-new-tokens", "8",
                   "--model", str(tiny_model_dir), "--out", str(out)], cwd=REPO, env=environment(), timeout=600)
    report = json.loads(out.read_text())
    runs = report["runs"]
    # Two rounds at two batch sizes, each run on 3 prompts of its own: 12 prompts, none repeated.
    assert (report["prompts"], report["prompts_per_run"], report["rounds"]) == (12, 3, 2)
    assert [(c["round"], c["batch"]) for c in report["chunks"]] == [(1, 1), (1, 2), (2, 1), (2, 2)]
    assert len({p for c in report["chunks"] for p in c["prompts"]}) == 12
    assert all(len(r["tokens_per_second_rounds"]) == 2 for r in runs)
    expected = {("vllm", "plain"), ("vllm", "vllm_ngram"), ("vllm", "context_ngram:1:3"), ("vllm", "mixed:1:auto"),
                ("transformers", "context_ngram:2:3")} | ({("vllm", "vllm_suffix")} if find_spec("arctic_inference") else set())
    for batch in (1, 2):
        rows = {(r["engine"], r["method"]): r for r in runs if r["batch"] == batch}
        assert set(rows) == expected
        assert all(r["tokens_per_second"] > 0 and r["tokens_per_call"] >= 1 for r in rows.values())
        assert all(r["identical_fraction"] == 1.0 for r in rows.values() if r["engine"] == "vllm")
        assert rows["vllm", "plain"]["tokens_per_call"] == 1.0 and rows["vllm", "plain"]["vs_plain"] == 1.0
