"""Replay mode: recorded greedy outputs through the drafters, no model; the report's rows and the
projection's arithmetic."""
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs.benchmark.cli import main
from jobs.benchmark.replay import StepClock

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
    report = main(["--replay", str(run_dir), "--batch", "1,4", "--methods", "ours,vllm_ngram,plain", "--max-draft", "6",
                   "--project", "a100-8b", "--out", str(out)])
    assert json.loads(out.read_text()) == report
    rows = report["replay"]
    assert [(r["method"], r["batch"]) for r in rows] == [
        (method, batch) for batch in (1, 4) for method in ("ours", "vllm_ngram", "plain", "ours_budget_a100_8b")]
    for row in rows:
        assert FIELDS <= set(row)
        assert 1.0 <= row["tokens_per_step"] <= 7.0 and row["draft_tokens_per_step"] <= 6
    plain = next(r for r in rows if r["method"] == "plain" and r["batch"] == 4)
    assert plain["tokens_per_step"] == 1.0 and plain["draft_tokens_per_step"] == 0.0
    ours = next(r for r in rows if r["method"] == "ours" and r["batch"] == 4)
    assert ours["tokens_per_step"] > 1.5  # the answers repeat each other: drafts from answers are accepted
    projected = {(r["method"], r["batch"]): r for r in report["projection"]["rows"]}
    assert projected[("plain", 4)]["vs_plain"] == 1.0
    # 4 requests are far from compute-bound on an A100: accepted drafts are nearly free tokens
    assert projected[("ours_budget_a100_8b", 4)]["vs_plain_drafting_hidden"] > 1.4


def test_the_step_clock_sums_each_steps_roofline_cost():
    clock = StepClock("a100-8b")
    clock.step(256, 512, 256 * 200)
    memory = (2 * 8.03e9 + 256 * 200 * 131072) / 2.039e12
    assert clock.seconds == pytest.approx(max(memory, 2 * 8.03e9 * 512 / 312e12), rel=1e-9)
    clock.step(2, 4, 2 * 100)  # two requests: memory-bound, drafts free
    assert clock.seconds == pytest.approx(max(memory, 2 * 8.03e9 * 512 / 312e12)
                                          + (2 * 8.03e9 + 2 * 100 * 131072) / 2.039e12, rel=1e-9)
