"""The cluster-launch configs under configs/cluster/ parse, autoscale A100 workers from zero, install
the wheel (never the source tree), and run `ngrammys generate` (or `python -m jobs.generate`) with
flags and `--set` keys the job actually accepts.

Only parsing: nothing here talks to Kubernetes, AWS or Ray.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

from pipeline.config import load_config

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "configs" / "cluster"
GENERATES = (["ngrammys", "generate"], ["python", "-m", "jobs.generate"])


def load(name: str) -> dict:
    return yaml.safe_load((CLUSTER / name).read_text())


def load_kind(name: str, kind: str) -> dict:
    """The one document of `kind` in a (possibly multi-document) YAML file."""
    docs = [doc for doc in yaml.safe_load_all((CLUSTER / name).read_text()) if doc and doc.get("kind") == kind]
    assert len(docs) == 1, f"{name}: expected one {kind}, found {len(docs)}"
    return docs[0]


def cluster_section(readme: Path) -> str:
    """docs/clusters.md's "Running on a cluster" section (up to the next heading of its level)."""
    text = readme.read_text()
    start = text.index("## Running on a cluster")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else len(text)]


def documented_commands(path: Path) -> list[str]:
    """`ngrammys generate ...` (or `python -m jobs.generate ...`) commands written in a file's
    comments (YAML) or, for docs/clusters.md, in its cluster section, with shell line continuations joined."""
    lines = (cluster_section(path) if path.suffix == ".md" else path.read_text()).splitlines()
    if path.suffix in (".yaml", ".yml"):
        lines = [re.sub(r"^\s*#\s?", "", line) for line in lines if line.lstrip().startswith("#")]
    commands, pending = [], ""
    for line in lines:
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        line, pending = pending + line, ""
        start = max(line.find(" ".join(command)) for command in GENERATES)
        if start >= 0:
            commands.append(line[start:].strip())
    return commands


def entrypoints() -> dict[str, str]:
    """Every job command the configs run or document, by where it comes from."""
    found = {
        "rayjob.yaml entrypoint": load_kind("rayjob.yaml", "RayJob")["spec"]["entrypoint"],
        "raycronjob.yaml entrypoint": load_kind("raycronjob.yaml", "RayCronJob")["spec"]["jobTemplate"]["entrypoint"],
    }
    for path in sorted(CLUSTER.glob("*.yaml")) + [ROOT / "docs" / "clusters.md"]:
        for i, command in enumerate(documented_commands(path)):
            found[f"{path.name} command {i + 1}"] = command
    return found


ENTRYPOINTS = entrypoints()


def argv_of(command: str) -> list[str]:
    argv = shlex.split(command)
    ran = [generate for generate in GENERATES if argv[: len(generate)] == generate]
    assert ran, f"does not run `ngrammys generate` or `python -m jobs.generate`: {command!r}"
    return argv[len(ran[0]) :]


def flag_value(argv: list[str], flag: str) -> str:
    values = [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == flag]
    values += [arg.split("=", 1)[1] for arg in argv if arg.startswith(flag + "=")]
    assert len(values) == 1, f"{flag} given {len(values)} times in {argv}"
    return values[0]


def set_overrides(argv: list[str]) -> list[str]:
    return [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == "--set"] + [
        arg.split("=", 1)[1] for arg in argv if arg.startswith("--set=")
    ]


def containers(pod_template: dict) -> list[dict]:
    return pod_template["spec"]["containers"]


def check_autoscaling_a100_cluster(spec: dict) -> None:
    """A RayClusterSpec: in-tree autoscaling, token auth, a GPU-less head, and an `a100` worker
    group that scales from zero and asks for whole A100s."""
    assert spec["enableInTreeAutoscaling"] is True
    assert spec["authOptions"]["mode"] == "token"
    assert spec["rayVersion"] == "2.60.0"

    head = spec["headGroupSpec"]
    assert head["rayStartParams"]["num-gpus"] == "0"
    for container in containers(head["template"]):
        for section in ("requests", "limits"):
            assert "nvidia.com/gpu" not in container.get("resources", {}).get(section, {})

    groups = {group["groupName"]: group for group in spec["workerGroupSpecs"]}
    a100 = groups["a100"]
    assert a100["minReplicas"] == 0 and a100.get("replicas", 0) == 0
    assert a100["maxReplicas"] > 0
    worker = containers(a100["template"])[0]
    limits, requests = worker["resources"]["limits"], worker["resources"]["requests"]
    assert int(limits["nvidia.com/gpu"]) >= 1
    assert requests["nvidia.com/gpu"] == limits["nvidia.com/gpu"]
    assert "A100" in a100["template"]["spec"]["nodeSelector"]["nvidia.com/gpu.product"]
    assert any(t.get("key") == "nvidia.com/gpu" for t in a100["template"]["spec"]["tolerations"])
    # Pinned Ray image, same on head and workers.
    images = {c["image"] for c in containers(head["template"]) + containers(a100["template"])}
    assert len(images) == 1 and images.pop().split(":")[1].startswith("2.60.0")


def test_raycluster_autoscales_a100_workers_from_zero():
    cluster = load_kind("raycluster.yaml", "RayCluster")
    assert cluster["apiVersion"] == "ray.io/v1"
    check_autoscaling_a100_cluster(cluster["spec"])


def test_rayjob_runs_generate_on_a_cluster_it_deletes_afterwards():
    job = load_kind("rayjob.yaml", "RayJob")
    assert job["apiVersion"] == "ray.io/v1"
    spec = job["spec"]
    assert spec["shutdownAfterJobFinishes"] is True
    assert spec["ttlSecondsAfterFinished"] > 0
    check_autoscaling_a100_cluster(spec["rayClusterSpec"])


def test_raycronjob_gives_every_scheduled_run_its_own_run_id():
    cron = load_kind("raycronjob.yaml", "RayCronJob")
    assert cron["apiVersion"] == "ray.io/v1"
    spec = cron["spec"]
    assert len(spec["schedule"].split()) == 5
    template = spec["jobTemplate"]
    assert template["shutdownAfterJobFinishes"] is True and template["ttlSecondsAfterFinished"] > 0
    check_autoscaling_a100_cluster(template["rayClusterSpec"])
    # A fixed run id would make each scheduled run resume (skip everything of) the first one.
    run_id = flag_value(argv_of(template["entrypoint"]), "--run-id")
    assert "$(date" in run_id and "/" not in run_id.replace("$(date", "")


def test_cluster_launcher_autoscales_a100_workers_from_zero():
    config = load("cluster-launcher.yaml")
    assert config["provider"]["type"] == "aws" and config["provider"]["region"]
    types = config["available_node_types"]
    head = types[config["head_node_type"]]
    assert head.get("resources", {}).get("GPU", 0) == 0
    assert not re.match(r"^(p|g)\d", head["node_config"]["InstanceType"]), "the head must not be a GPU instance"
    a100 = types["a100"]
    assert a100["resources"]["GPU"] >= 1
    assert a100["min_workers"] == 0
    assert 0 < a100["max_workers"] <= config["max_workers"]
    assert a100["node_config"]["InstanceType"].startswith(("p4d.", "p4de."))
    # The wheel, not the source tree, goes to the nodes and is installed there (not editable).
    assert "." not in config["file_mounts"].values()
    (wheel,) = [
        remote
        for remote, local in config["file_mounts"].items()
        if local.startswith("dist/") and local.endswith(".whl")
    ]
    assert any("pip install" in c and " -e " not in c and f"{wheel}'[gpu]'" in c for c in config["setup_commands"])


def test_no_recipe_needs_the_source_tree():
    """Images install the wheel; `ray job submit` needs no --working-dir once they have it."""
    for path in sorted(CLUSTER.glob("*.yaml")):
        text = path.read_text()
        assert "--working-dir" not in text and "pip install -e" not in text and "--no-cache-dir -e" not in text, (
            path.name
        )


def test_the_configs_run_or_document_at_least_the_rayjob_cronjob_and_submit_commands():
    sources = " ".join(ENTRYPOINTS)
    for name in ("rayjob.yaml", "raycronjob.yaml", "raycluster.yaml", "cluster-launcher.yaml", "clusters.md"):
        assert name in sources, f"no `ngrammys generate` command found in {name}"


@pytest.mark.parametrize("where", sorted(ENTRYPOINTS))
def test_entrypoint_runs_generate_with_output_and_run_id_not_the_demo_config(where):
    argv = argv_of(ENTRYPOINTS[where])
    assert "--config" not in argv, "configs/default.yaml is the demo's; a job runs on the defaults and its --set"
    assert flag_value(argv, "--output")
    assert flag_value(argv, "--run-id")
    assert flag_value(argv, "--input")
    # GPU runs: one A100 per actor, bfloat16 weights.
    overrides = set_overrides(argv)
    assert "ray.num_gpus_per_actor=1" in overrides and "model.dtype=bfloat16" in overrides


@pytest.mark.parametrize("where", sorted(ENTRYPOINTS))
def test_entrypoint_flags_are_accepted_by_jobs_generate(where):
    from jobs.generate import parse_args

    args = parse_args(argv_of(ENTRYPOINTS[where]))
    assert args.output and args.run_id and args.input


@pytest.mark.parametrize("where", sorted(ENTRYPOINTS))
def test_every_set_key_exists_in_the_config(where):
    overrides = set_overrides(argv_of(ENTRYPOINTS[where]))
    assert overrides, "no --set in the entrypoint"
    # Raises pipeline.config.ConfigError naming the key on an unknown key or a bad value.
    load_config(None, overrides)  # the defaults, as the entrypoint runs them
