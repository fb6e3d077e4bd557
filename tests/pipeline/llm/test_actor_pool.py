"""The job at scale, on this one machine: a three-node cluster whose head runs no actor, an actor
killed mid-run, input, output and checkpoints in an S3 server on the loopback address with the
driver killed half-way, and a driver whose memory does not grow with the corpus."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
import ray
from ray.cluster_utils import Cluster

from tests import outputs
from tests.processes import environment, free_port

REPO = Path(__file__).resolve().parents[3]


def write_jsonl(path: Path, ids: list[str], edited: str = "") -> Path:
    path.write_text(
        "".join(json.dumps({"id": i, "prompt": f"Question {i}" + " (edited)" * (i == edited)}) + "\n" for i in ids)
    )
    return path


def generate_command(tiny_model_dir, input_path: str, output: str, *overrides: str) -> list[str]:
    command = [
        sys.executable,
        "-m",
        "jobs.generate",
        "--config",
        "configs/default.yaml",
        "--input",
        input_path,
        "--output",
        output,
        "--run-id",
        "nightly",
        "--set",
        "engine.name=transformers",
        "--set",
        f"model.name={tiny_model_dir}",
        "--set",
        "input.limit=0",
    ]
    for override in overrides:
        command += ["--set", override]
    return command


# --- A cluster of three nodes, one actor killed ------------------------------------------------


def map_worker_pids() -> list[int]:
    from ray.util.state import list_actors

    return [
        actor.pid
        for actor in list_actors(filters=[("state", "=", "ALIVE")], detail=True)
        if "GenerationStage" in actor.class_name and actor.pid  # the engine's actors, not the tokenize stage's
    ]


@pytest.mark.slow  # a cluster of its own: make test-slow
def test_actors_run_on_workers_not_the_head_and_survive_a_killed_actor(tiny_model_dir, tmp_path, processes):
    """The job runs as a user's driver does, in a process of its own joined to the cluster by
    RAY_ADDRESS: a failure kills that process, so the cluster always shuts down (a driver thread in
    this process would join it again and keep it alive for the next test), and the report shows the
    driver's output (Ray Data's progress: which operator waited, and on what)."""
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "object_store_memory": 150 * 2**20})
    workers = [cluster.add_node(num_cpus=1, object_store_memory=150 * 2**20) for _ in range(2)]
    ray.init(address=cluster.address)  # for the state API: the actors' processes
    try:
        ids = [f"q{i:02d}" for i in range(32)]
        command = generate_command(
            tiny_model_dir,
            str(write_jsonl(tmp_path / "in.jsonl", ids)),
            str(tmp_path / "out"),
            "sampling.max_new_tokens=120",
            "ray.batch_size=1",
            "transformers.max_batch_requests=1",
            "ray.min_actors=2",
            "ray.max_actors=2",
        )
        # The cluster's authentication mode (this process's): the job would otherwise turn tokens on, and the
        # cluster's workers, sending none, could not reach it.
        mode = os.environ.get("RAY_AUTH_MODE", "disabled")
        driver = processes.start(command, cwd=REPO, env=environment(RAY_ADDRESS=cluster.address, RAY_AUTH_MODE=mode))
        run_dir = tmp_path / "out" / "run=nightly"
        deadline = time.time() + 240
        while time.time() < deadline and len(map_worker_pids()) < 2 and driver.poll() is None:
            time.sleep(0.2)
        time.sleep(3)  # both actors are generating now
        running = map_worker_pids()
        assert len(running) == 2, "both actors should be running"
        killed = running[0]
        os.kill(killed, signal.SIGKILL)  # the actor's process dies mid-run, as on a lost node
        assert driver.poll() is None and len(outputs.read_run(run_dir)) < len(ids), "the kill should land mid-run"
        try:
            driver.wait(timeout=400)
        except subprocess.TimeoutExpired:
            pass
        assert driver.poll() == 0, "the job should finish despite the killed actor"
        assert killed not in map_worker_pids()
        assert sorted(row["id"] for row in outputs.read_run(run_dir)) == ids, "every id exactly once"
        nodes = set(json.loads((run_dir / "summary.json").read_text())["actor_nodes"])
        assert nodes and nodes <= {worker.node_id for worker in workers}
        assert cluster.head_node.node_id not in nodes
    finally:
        processes.stop_all()
        ray.shutdown()
        cluster.shutdown()


# --- S3 on the loopback address: driver killed, job resumed ------------------------------------


@pytest.fixture
def s3_server(processes):
    """An S3 server (moto) on 127.0.0.1 with a bucket; the environment that points clients at it."""
    port = free_port()
    server = processes.start([Path(sys.executable).parent / "moto_server", "-H", "127.0.0.1", "-p", str(port)])
    env = {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    os.environ.update(env)
    filesystem = pafs.S3FileSystem(
        endpoint_override=env["AWS_ENDPOINT_URL"],
        access_key="test",
        secret_key="test",
        region="us-east-1",
        scheme="http",
        allow_bucket_creation=True,
    )
    deadline = time.time() + 30
    while True:
        try:
            filesystem.create_dir("corpus")
            break
        except OSError:
            assert server.poll() is None and time.time() < deadline, "the S3 server did not start"
            time.sleep(0.3)
    yield filesystem, env
    for name in env:
        os.environ.pop(name, None)


def s3_parquet(filesystem, directory: str) -> list[str]:
    found = filesystem.get_file_info(pafs.FileSelector(directory, allow_not_found=True))
    return sorted(entry.path for entry in found if entry.path.endswith(".parquet"))


@pytest.mark.slow  # a cluster of its own: make test-slow
def test_s3_series_resumes_a_killed_driver_exactly_once_and_drafts_its_next_run_from_its_store(
    tiny_model_dir, tmp_path, processes, s3_server
):
    """Input, output, the series' checkpoints and its store of earlier outputs all in S3."""
    filesystem, env = s3_server
    ids = [f"q{i:02d}" for i in range(12)]
    with filesystem.open_output_stream("corpus/in.jsonl") as stream:
        stream.write(write_jsonl(tmp_path / "in.jsonl", ids).read_bytes())
    settings = [
        "job.series=nightly",
        "ray.batch_size=1",
        "transformers.max_batch_requests=1",
        "sampling.max_new_tokens=120",
    ]
    command = generate_command(tiny_model_dir, "s3://corpus/in.jsonl", "s3://corpus/out", *settings)
    driver = processes.start(command, cwd=REPO, env=environment(**env))
    run = "corpus/out/series=nightly/run=nightly"
    deadline = time.time() + 240
    while time.time() < deadline and len(s3_parquet(filesystem, run)) < 2 and driver.poll() is None:
        time.sleep(0.2)
    driver.send_signal(signal.SIGKILL)
    driver.wait()

    def rows(directory=run):
        return [
            row
            for path in s3_parquet(filesystem, directory)
            for row in pq.read_table(path, filesystem=filesystem).to_pylist()
        ]

    before = rows()
    assert 2 <= len(before) < len(ids), "the kill should land mid-run"
    assert s3_parquet(filesystem, "corpus/out/_checkpoints/series=nightly/rows"), "the checkpoints are in S3 too"
    processes.run(command, cwd=REPO, env=environment(**env), timeout=400)
    assert sorted(row["id"] for row in rows()) == ids, "every id exactly once"
    with filesystem.open_input_stream(f"{run}/summary.json") as stream:
        summary = json.loads(stream.read())
    assert summary["rows"] == len(ids) and summary["rows_skipped_already_done"] == len(before)
    assert summary["series_store"]["documents"] == len(ids) and summary["series_store"]["path"].startswith("s3://")
    # The next run: the one row edited is generated again, drafting from the store.
    with filesystem.open_output_stream("corpus/in.jsonl") as stream:
        stream.write(write_jsonl(tmp_path / "in.jsonl", ids, edited="q03").read_bytes())
    following = [*command[: command.index("--run-id") + 1], "edit", *command[command.index("--run-id") + 2 :]]
    processes.run(following, cwd=REPO, env=environment(**env), timeout=400)
    with filesystem.open_input_stream("corpus/out/series=nightly/run=edit/summary.json") as stream:
        edited = json.loads(stream.read())
    assert (edited["rows"], edited["changed_rows"]) == (1, 1), edited
    assert edited["settings"]["drafting"]["datastore"] == summary["series_store"]["path"]
    assert [row["changed"] for row in rows("corpus/out/series=nightly/run=edit")] == [True]


@pytest.mark.slow  # a job process that starts its own Ray (about 35 s): make test-slow
def test_an_unreachable_output_fails_at_start_naming_the_setting(tiny_model_dir, tmp_path, processes):
    command = generate_command(tiny_model_dir, "humaneval", "s3://nowhere/out")
    env = environment(
        AWS_ENDPOINT_URL=f"http://127.0.0.1:{free_port()}",
        AWS_ACCESS_KEY_ID="x",
        AWS_SECRET_ACCESS_KEY="x",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_EC2_METADATA_DISABLED="true",
    )
    result = processes.run(command, cwd=REPO, env=env, timeout=120, check=False)
    assert result.returncode != 0
    assert "job.output: cannot write to 's3://nowhere/out" in result.stderr


# --- The driver's memory does not grow with the corpus -----------------------------------------


@pytest.mark.scale  # 22,000 rows: `make test-scale`, outside `make test`'s 15 minutes
def test_driver_memory_does_not_grow_with_the_corpus(tiny_model_dir, tmp_path, processes):
    peaks = {}
    for rows in (2_000, 20_000):
        path = write_jsonl(tmp_path / f"in{rows}.jsonl", [f"r{i}" for i in range(rows)])
        command = generate_command(
            tiny_model_dir,
            str(path),
            str(tmp_path / f"out{rows}"),
            "sampling.max_new_tokens=4",
            "ray.batch_size=1000",
            "transformers.max_batch_requests=500",
        )
        processes.run(command, cwd=REPO, env=environment(), timeout=600)
        summary = json.loads((tmp_path / f"out{rows}" / "run=nightly" / "summary.json").read_text())
        assert summary["rows"] == rows
        peaks[rows] = summary["driver_peak_rss_mb"]
        print(
            f"{rows} rows: driver peak RSS {peaks[rows]} MB, {summary['rows_per_second_after_startup']} rows/s "
            f"after start-up, {summary['wall_seconds']} s in all"
        )
    assert peaks[20_000] <= 1.10 * peaks[2_000], peaks


@pytest.mark.scale  # 22,000 rows through vLLM: `make test-scale`, outside `make test`'s 15 minutes
def test_the_streaming_actor_memory_does_not_grow_with_the_corpus(tiny_model_dir, tmp_path, processes):
    """The vLLM engine is fed continuously from several batches at once: what it holds is bounded
    by the batches in flight, not by the corpus."""
    peaks = {}
    for rows in (2_000, 20_000):
        path = write_jsonl(tmp_path / f"in{rows}.jsonl", [f"r{i}" for i in range(rows)])
        command = generate_command(
            tiny_model_dir,
            str(path),
            str(tmp_path / f"out{rows}"),
            "engine.name=vllm",
            "vllm.execution=eager",
            "vllm.cpu_kv_cache_gib=1",
            "vllm.max_model_len=384",
            "vllm.max_num_seqs=64",
            "drafting.drafter=context_ngram",
            "sampling.max_new_tokens=4",
            "ray.batch_size=256",
        )
        processes.run(command, cwd=REPO, env=environment(), timeout=1200)
        summary = json.loads((tmp_path / f"out{rows}" / "run=nightly" / "summary.json").read_text())
        assert summary["rows"] == rows and summary["engine_occupancy"] > 0
        peaks[rows] = summary["actor_peak_rss_mb"]
        print(
            f"{rows} rows: actor peak RSS {peaks[rows]} MB, occupancy {summary['engine_occupancy']}, "
            f"{summary['rows_per_second_after_startup']} rows/s after start-up"
        )
    assert peaks[20_000] <= 1.10 * peaks[2_000], peaks
