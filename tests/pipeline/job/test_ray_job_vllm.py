"""The Ray Data job on the vLLM engine (the default where vLLM is installed), tiny model: every
row back once, bad rows as error rows, statistics columns filled, the engine named on every row and
kept fed by concurrent batches; a killed actor."""

import json

import pytest
import ray

from pipeline.config import load_config
from pipeline.job.ray_job import run_job
from tests.outputs import read_run
from tests.pipeline.job.test_ray_job import REPO, write_jsonl


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False)
    yield
    ray.shutdown()


@pytest.mark.slow  # vLLM in a Ray actor: make test-slow
def test_the_job_on_vllm_returns_every_row_once_with_statistics_and_keeps_the_engine_fed(
    local_ray, tiny_model_dir, tmp_path
):
    """Bad rows beside good ones, each row back once; and batches of 2 rows into an engine of 4 slots:
    one batch at a time keeps at most half of them busy, the actor's concurrent batches keep them
    full while input remains."""
    rows = [
        {"id": "ok", "prompt": "def add(a, b):"},
        {"id": "empty", "prompt": ""},
        {"id": "number", "prompt": 7},
        {"id": "long", "prompt": "word " * 2000},
        {"id": "short", "prompt": "Hi", "max_new_tokens": 2},
        {"id": "hot", "prompt": "Hi", "temperature": 0.7},
        {"id": "none"},
        {"id": "ok", "prompt": "again, the same id"},
    ]
    counting = [{"id": f"q{i:02d}", "prompt": f"Count {i}:"} for i in range(24)]
    config = load_config(
        REPO / "configs/default.yaml",
        [
            "engine.name=vllm",
            f"model.name={tiny_model_dir}",
            "vllm.execution=eager",
            "vllm.cpu_kv_cache_gib=1",
            "vllm.max_model_len=384",
            "vllm.max_num_seqs=4",
            "drafting.drafter=mixed",
            "drafting.w=auto",
            "sampling.max_new_tokens=100",
            "ray.batch_size=2",
            f"job.output={tmp_path / 'out'}",
            f"input.path={write_jsonl(tmp_path / 'in.jsonl', counting + rows)}",
            "ray.num_cpus_per_actor=0.5",
        ],
    )
    summary = run_job(config, "v")
    out = read_run(tmp_path / "out" / "run=v")
    assert sorted(row["id"] for row in out) == sorted(row["id"] for row in rows + counting)
    by_id = {}
    for row in out:
        by_id.setdefault(row["id"], []).append(row)
    assert all(
        row["error"] is None and (len(row["generated_tokens"]) == 100 or row["finish_reason"] == "eos")
        for row in by_id["ok"]
    )
    assert "the prompt is empty" in by_id["empty"][0]["error"] and "must be text" in by_id["number"][0]["error"]
    assert "no room to generate" in by_id["long"][0]["error"] and "has no messages, prompt" in by_id["none"][0]["error"]
    assert len(by_id["short"][0]["generated_tokens"]) == 2 and by_id["hot"][0]["temperature"] == pytest.approx(0.7)
    generated = by_id["ok"] + by_id["short"] + by_id["hot"] + [row for row in out if row["id"].startswith("q")]
    for row in generated:
        assert row["engine"] == "vllm" and row["drafter"] == "mixed" and row["auto_w"] is True
        assert (
            row["num_target_calls"] >= 1
            and row["tokens_per_call"] == row["num_generated_tokens"] / row["num_target_calls"]
        )
        assert sum(row["accepted_length_histogram"]) == row["num_target_calls"] and row["finish_reason"] in (
            "length",
            "eos",
        )
        assert sum(count for _, count in row["strategy_rows"]) == row["num_target_calls"]
    assert summary["rows"] == 32 and summary["errored_rows"] == 4
    assert all(row["prompt_token_ids"] for row in by_id["ok"]) and by_id["empty"][0]["prompt_token_ids"] is None
    # One 2-row batch at a time keeps at most 2 of 4 slots busy (occupancy <= 0.5), whatever the
    # machine's speed: more than that shows batches overlapping in the engine.
    assert summary["engine_occupancy"] > 0.5, summary["engine_series"]
    series = summary["engine_series"]
    assert len(series) == 16 and all(0 < occupancy <= 1 for _, occupancy in series if occupancy is not None)
    assert summary["engine_steps"] > 0 and summary["engine_drain_seconds"] > 0
    cost = summary["engine_step_cost"]  # what the proposer's budget measured a step to cost
    assert cost["seconds"] > 0 and cost["seconds_per_fed_token"] > 0 and cost["fed_token_share"] > 0, cost
    assert json.loads((tmp_path / "out" / "run=v" / "summary.json").read_text())["settings"]["engine"]["name"] == "vllm"


def map_worker_pids() -> list[int]:
    import psutil

    return [p.pid for p in psutil.process_iter(["cmdline"]) if "GenerationStage" in " ".join(p.info["cmdline"] or [])]


@pytest.mark.slow  # vLLM in a Ray actor, started twice: make test-slow
def test_a_killed_actor_on_the_streaming_engine_still_writes_every_id_once(local_ray, tiny_model_dir, tmp_path):
    import os
    import signal
    import threading
    import time

    ids = [f"q{i:02d}" for i in range(24)]
    config = load_config(
        REPO / "configs/default.yaml",
        [
            "engine.name=vllm",
            f"model.name={tiny_model_dir}",
            "vllm.execution=eager",
            "vllm.cpu_kv_cache_gib=1",
            "vllm.max_model_len=384",
            "vllm.max_num_seqs=4",
            "drafting.drafter=context_ngram",
            "drafting.w=4",
            "sampling.max_new_tokens=200",
            "ray.batch_size=2",
            f"input.path={write_jsonl(tmp_path / 'in.jsonl', [{'id': i, 'prompt': f'Count {i}:'} for i in ids])}",
            f"job.output={tmp_path / 'out'}",
            "ray.num_cpus_per_actor=0.5",
        ],
    )
    finished: dict = {}
    job = threading.Thread(target=lambda: finished.update(summary=run_job(config, "k")))
    job.start()
    run_dir = tmp_path / "out" / "run=k"
    deadline = time.time() + 300
    while time.time() < deadline and not read_run(run_dir):  # the engine is streaming: some rows are out
        time.sleep(0.2)
    pids = map_worker_pids()
    assert pids and job.is_alive(), "the kill should land mid-run"
    os.kill(pids[0], signal.SIGKILL)  # the actor's process dies with batches in flight
    assert len(read_run(run_dir)) < len(ids), "the kill should land mid-run"
    job.join(timeout=400)
    assert not job.is_alive() and "summary" in finished, "the job should finish despite the killed actor"
    assert sorted(row["id"] for row in read_run(run_dir)) == ids, "every id exactly once"


@pytest.mark.slow  # vLLM in a Ray actor: make test-slow
def test_an_openai_batch_file_runs_unchanged_and_resumed_each_custom_id_is_written_once(
    local_ray, tiny_model_dir, tmp_path
):
    """tests/data/openai_batch.jsonl, written from OpenAI's documentation: chat and completions, n = 4
    with a seed, a prediction, a JSON schema with log probabilities, a tool (not run), an embedding
    (not run) and a line cut short. Half of it first (input.limit), then the run resumed: every
    request one output or error line, every output line valid as OpenAI's types, its usage the
    tokens its rows generated."""
    from openai.types import Completion
    from openai.types.chat import ChatCompletion

    source = REPO / "tests" / "data" / "openai_batch.jsonl"
    settings = [
        "engine.name=vllm",
        f"model.name={tiny_model_dir}",
        "vllm.execution=eager",
        "vllm.cpu_kv_cache_gib=1",
        "vllm.max_model_len=384",
        "vllm.max_num_seqs=8",
        f"input.path={source}",
        f"job.output={tmp_path / 'out'}",
        "ray.num_cpus_per_actor=0.5",
    ]
    run_job(load_config(REPO / "configs/default.yaml", [*settings, "input.limit=4"]), "b")
    summary = run_job(load_config(REPO / "configs/default.yaml", settings), "b")
    rows = read_run(tmp_path / "out" / "run=b")
    files = {
        name: [
            json.loads(line)
            for line in (tmp_path / "out" / "run=b" / "openai" / f"{name}.jsonl").read_text().splitlines()
        ]
        for name in ("output", "errors")
    }
    keys = [line["custom_id"] for lines in files.values() for line in lines]
    cut_short = f"{source}:8"
    assert sorted(keys) == sorted([f"request-{i}" for i in (1, 2, 3, 4, 5, 6, 7, 9)] + [cut_short])
    assert summary["openai_batch"]["requests"] == len(files["output"]) == 6
    assert {line["custom_id"] for line in files["errors"]} == {"request-6", "request-7", cut_short}
    tool = next(error for error in files["errors"] if error["custom_id"] == "request-6")
    assert "body.tools is not run here" in tool["error"]["message"]
    for line in files["output"]:
        body = line["response"]["body"]
        kind = ChatCompletion if body["object"] == "chat.completion" else Completion
        answer = kind.model_validate(body)
        mine = sorted((r for r in rows if r["id"] == line["custom_id"]), key=lambda r: r["sample_index"])
        assert answer.usage.completion_tokens == sum(r["num_generated_tokens"] for r in mine)
        assert [c.index for c in answer.choices] == [r["sample_index"] for r in mine] and answer.model == str(
            tiny_model_dir
        )
    by_key = {line["custom_id"]: line["response"]["body"] for line in files["output"]}
    haiku = [r for r in rows if r["id"] == "request-2"]
    assert len(by_key["request-2"]["choices"]) == 4 and len({tuple(r["generated_tokens"]) for r in haiku}) > 1
    assert sorted(r["seed"] for r in haiku)[0] != sorted(r["seed"] for r in haiku)[1]  # each sample its own seed
    assert by_key["request-5"]["choices"][0]["logprobs"]["content"], "log probabilities asked for, given"
    assert (
        by_key["request-3"]["choices"][0]["logprobs"]["tokens"] and by_key["request-9"]["object"] == "text_completion"
    )
