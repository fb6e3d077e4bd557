"""An autoscaling cluster on this machine (Ray's fake multi-node provider): a head without
accelerators and a worker type `a100` ({CPU: 1, GPU: 1, accelerator_type:A100: 1}) at zero nodes.
The job asks for A100 actors; the autoscaler starts workers for them and removes them when idle.
The fake GPU has no CUDA: the model runs on the CPU there."""

import json
import sys
import time
from pathlib import Path

import pytest

from tests.outputs import read_run
from tests.processes import environment, free_port, start_ray_head, stop_ray_head

REPO = Path(__file__).resolve().parents[3]
RAY = str(Path(sys.executable).parent / "ray")
A100 = "accelerator_type:A100"


def autoscaling_config(head_cpus: float, gcs_address: str) -> dict:
    """Ray's fake_multi_node example, written here (the wheel does not ship it); its workers join
    the head at `gcs_address` (the provider would assume port 6379)."""
    return {
        "cluster_name": "fake-a100",
        "max_workers": 2,
        "upscaling_speed": 1.0,
        "idle_timeout_minutes": 0.1,
        "provider": {
            "type": "fake_multinode",
            "use_node_id_as_ip": True,
            "disable_node_updaters": True,
            "disable_launch_config_check": True,
            "gcs_address": gcs_address,
        },
        "available_node_types": {
            "ray.head.default": {"resources": {"CPU": head_cpus}, "node_config": {}, "max_workers": 0},
            "a100": {
                "resources": {"CPU": 1, "GPU": 1, A100: 1, "object_store_memory": 300 * 2**20},
                "node_config": {},
                "min_workers": 0,
                "max_workers": 2,
            },
        },
        "head_node_type": "ray.head.default",
        "auth": {},
        "docker": {},
        "file_mounts": {},
        "cluster_synced_files": [],
        "file_mounts_sync_continuously": False,
        "rsync_exclude": [],
        "rsync_filter": [],
        "initialization_commands": [],
        "setup_commands": [],
        "head_setup_commands": [],
        "worker_setup_commands": [],
        "head_start_ray_commands": [],
        "worker_start_ray_commands": [],
    }


NODES = """import json, ray
ray.init(address="auto", logging_level="ERROR", log_to_driver=False)
nodes = [{"id": n["NodeID"], "alive": n["Alive"], "resources": n["Resources"]} for n in ray.nodes()]
print("NODES", json.dumps(nodes))"""


def nodes(processes, env) -> list[dict]:
    done = processes.run([sys.executable, "-c", NODES], env=env, timeout=120)
    line = next(line for line in done.stdout.splitlines() if line.startswith("NODES "))  # not Ray's own lines
    return [node for node in json.loads(line[len("NODES ") :]) if node["alive"]]


def a100_workers(processes, env) -> list[str]:
    return [node["id"] for node in nodes(processes, env) if A100 in node["resources"]]


@pytest.mark.slow  # an autoscaling cluster of its own: make test-slow
def test_a100_workers_scale_from_zero_for_the_job_and_back(tiny_model_dir, tmp_path, processes):
    inputs = tmp_path / "in.jsonl"
    inputs.write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"Count to {i}"}) + "\n" for i in range(12)))
    port = free_port()
    config_path = tmp_path / "autoscaling.json"
    config_path.write_text(json.dumps(autoscaling_config(1, f"127.0.0.1:{port}")))
    env = environment(
        HOME=str(tmp_path / "home"), RAY_AUTH_MODE="token", RAY_FAKE_CLUSTER="1", AUTOSCALER_UPDATE_INTERVAL_S="1"
    )
    processes.run([RAY, "get-auth-token", "--generate"], timeout=60, env=env)
    head = start_ray_head(processes, env, num_cpus=1, extra=(f"--autoscaling-config={config_path}",), port=port)
    env["RAY_ADDRESS"] = head["gcs"]
    try:
        assert a100_workers(processes, env) == []
        head_id = nodes(processes, env)[0]["id"]
        processes.run(
            [
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
                "scaled",
                "--set",
                f"model.name={tiny_model_dir}",
                "--set",
                "engine.name=transformers",
                "--set",
                "sampling.max_new_tokens=4",
                "--set",
                "ray.accelerator_type=A100",
                "--set",
                "ray.num_gpus_per_actor=1",
                "--set",
                "ray.num_cpus_per_actor=0.5",
                "--set",
                "ray.wait_for_actors_s=300",
            ],
            cwd=REPO,
            env=env,
            timeout=600,
        )
        summary = json.loads((tmp_path / "out" / "run=scaled" / "summary.json").read_text())
        deadline = time.monotonic() + 180  # idle timeout 6 s, then the autoscaler's next pass
        while a100_workers(processes, env) and time.monotonic() < deadline:
            time.sleep(3)
        left = a100_workers(processes, env)
    finally:
        stop_ray_head(head)
    rows = read_run(tmp_path / "out" / "run=scaled")
    assert sorted(row["id"] for row in rows) == sorted(f"p{i}" for i in range(12))
    assert all(row["error"] is None for row in rows)
    assert summary["actor_nodes"] and head_id not in summary["actor_nodes"]  # every batch ran on an A100 worker
    assert left == [], f"A100 workers still up after the idle timeout: {left}"
    print(f"seconds to the first batch on a scaled-from-zero worker: {summary['seconds_to_first_batch']}")
