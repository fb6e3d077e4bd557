"""Replay mode: recorded greedy outputs through the drafters, no model; the report's rows and the
projection's arithmetic."""
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs.benchmark.cli import main
from jobs.benchmark.replay import projection

FIELDS = {"method", "batch", "tokens_per_step", "draft_tokens_per_step", "us_per_request_step_mean",
          "us_per_request_step_p99", "memory_mb"}


@pytest.fixture
def run_dir(tmp_path):
    rng = np.random.default_rng(0)
    phrase = rng.integers(0, 40, 12).tolist()
    prompts = [rng.integers(0, 40, 20).tolist() for _ in range(12)]
    outputs = [(phrase * 4)[i % 5:i % 5 + 40] for i in range(12)]  # answers that repeat one another
    table = pa.table({"prompt_token_ids": prompts, "generated_tokens": outputs, "finish_reason": ["length"] * 12})
    directory = tmp_path / "run=r"
    directory.mkdir()
    pq.write_table(table, directory / "part-0.parquet")
    return directory


def test_replay_reports_every_method_and_batch_and_ours_gains_from_repeats(run_dir, tmp_path):
    out = tmp_path / "r.json"
    report = main(["--replay", str(run_dir), "--batch", "1,4", "--methods", "ours,vllm_ngram", "--max-draft", "6",
                   "--project", "a100-8b", "--out", str(out)])
    assert json.loads(out.read_text()) == report
    rows = report["replay"]
    assert [(r["method"], r["batch"]) for r in rows] == [
        ("ours", 1), ("vllm_ngram", 1), ("ours_budget_a100_8b", 1), ("ours", 4), ("vllm_ngram", 4), ("ours_budget_a100_8b", 4)]
    for row in rows:
        assert FIELDS <= set(row)
        assert 1.0 <= row["tokens_per_step"] <= 7.0 and row["draft_tokens_per_step"] <= 6
    ours = next(r for r in rows if r["method"] == "ours" and r["batch"] == 4)
    assert ours["tokens_per_step"] > 1.5  # the answers repeat each other: drafts from answers are accepted
    assert {r["method"] for r in report["projection"]["rows"]} == {"plain", "ours", "vllm_ngram", "ours_budget_a100_8b"}


def test_projection_follows_its_formula():
    rows = [{"method": "m", "batch": 256, "tokens_per_step": 2.0, "draft_tokens_per_step": 1.0,
             "us_per_request_step_mean": 10.0}]

    class Answer:
        prompt, output = np.zeros(100), np.zeros(200)

    result = projection(rows, [Answer()], "a100-8b")
    plain, ours = result["rows"]
    # c(n) = max((2 P + B ctx kv) / bandwidth, 2 P n / flops), ctx = 100 + 200 / 2
    memory = (2 * 8.03e9 + 256 * 200 * 131072) / 2.039e12
    assert plain["tokens_per_second"] == pytest.approx(256 / max(memory, 2 * 8.03e9 * 256 / 312e12), rel=1e-3)
    seconds = max(memory, 2 * 8.03e9 * 512 / 312e12) + 256 * 10e-6
    assert ours["tokens_per_second"] == pytest.approx(256 * 2.0 / seconds, rel=1e-3)
