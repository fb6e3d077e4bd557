"""The package as users install it: the wheel `pip wheel .` builds, installed outside the checkout.

An editable install (what `make` does for development) resolves imports to the source tree and so
hides a module, a data file or an entry point the wheel leaves out; these tests never import from
the checkout. The environments they make are new virtual environments that hold the wheel and
nothing of the checkout; the wheel's dependencies (torch, vLLM, Ray, ...) are found by a path to
the suite's own environment's site-packages (a plain path: that environment's editable install of
this project is not processed), so no dependency is downloaded again. Each process runs from a
directory with no source in it.

`make test` runs the check that the wheel holds every module; `make test-wheel` (CI runs it) the
job, a processor program and `ray job submit` on a Ray head, from the installed wheel.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import zipfile
from pathlib import Path

import pytest

from tests.outputs import read_run
from tests.processes import environment, scrape_counters, start_ray_head, stop_ray_head

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("pipeline", "drafters", "jobs")


def source_files() -> list[Path]:
    """The checkout's files as git has them (tracked, and new ones not ignored): no build output."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split("\0")
    return [Path(name) for name in listed if name and (REPO / name).is_file()]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel of a copy of the checkout's files (a stale build/ directory cannot leak into it)."""
    tree, out = tmp_path_factory.mktemp("tree"), tmp_path_factory.mktemp("wheel")
    for name in source_files():
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, tree / name)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(tree)],
        check=True,
        capture_output=True,
        text=True,
    )
    (built,) = out.glob("ngrammys_batch-*.whl")
    return built


def test_the_wheel_holds_every_module_and_the_command(wheel):
    modules = {str(path) for path in source_files() if path.suffix == ".py" and path.parts[0] in PACKAGES}
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        entry_points = archive.read(next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
    missing = sorted(modules - names)
    assert not missing, f"{len(missing)} of {len(modules)} modules are missing from {wheel.name}: {missing[:10]}"
    assert "ngrammys = jobs.cli:main" in entry_points
    assert not {name for name in names if name.startswith("tests/")}, "the tests are not part of the product"
    assert not {name for name in names if name.startswith("lab/")}, "the lab's instruments are not part of the product"


def new_environment(directory: Path, wheel: Path | None) -> Path:
    """A new virtual environment at `directory` that finds the suite's dependencies and, given
    `wheel`, has it installed (with its `ngrammys` command); returns its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(directory)], check=True)
    python = directory / "bin" / "python"
    site = Path(
        subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    (site / "suite-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    # Ray's command (its console script is the suite environment's, bound to that python).
    (directory / "bin" / "ray").write_text(f"#!{python}\nfrom ray.scripts.scripts import main\nmain()\n")
    (directory / "bin" / "ray").chmod(0o755)
    if wheel is not None:
        install(python, wheel)
    return python


def install(python: Path, wheel: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--no-index", str(wheel)],
        check=True,
        capture_output=True,
        text=True,
    )


def env_for(python: Path, home: Path, **changes: str) -> dict[str, str]:
    """The suite's isolated environment with `python`'s bin first on PATH and nothing of the checkout."""
    env = environment(HOME=str(home), RAY_AUTH_MODE="token", **changes)
    env["PATH"] = f"{python.parent}:{env['PATH']}"
    env.pop("PYTHONPATH", None)
    return env


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """The python of a new environment with the wheel installed."""
    python = new_environment(tmp_path_factory.mktemp("venv") / "installed", wheel)
    located = subprocess.run(
        [python, "-c", "import pipeline, drafters, jobs; print(pipeline.__file__)"],
        cwd=tmp_path_factory.mktemp("elsewhere"),
        check=True,
        capture_output=True,
        text=True,
    )
    assert located.stdout.startswith(str(python.parents[1])), located.stdout
    return python


def jsonl(path: Path, count: int) -> Path:
    path.write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"Count to {i}"}) + "\n" for i in range(count)))
    return path


PROCESSOR_PROGRAM = """
    import sys

    import ray
    from pipeline.llm import build_processor, vLLMEngineProcessorConfig

    config = vLLMEngineProcessorConfig(model_source=sys.argv[1], batch_size=4,
                                       engine_kwargs={"max_model_len": 256, "dtype": "float32"},
                                       placement_group_config={"bundles": [{"CPU": 1}]}, log_engine_metrics=False)
    processor = build_processor(config,
        preprocess=lambda row: dict(messages=[{"role": "user", "content": row["question"]}],
                                    sampling_params=dict(temperature=0, max_tokens=6)),
        postprocess=lambda row: dict(question=row["question"], answer=row["generated_text"],
                                     error=row.get("__inference_error__") or None))
    rows = processor(ray.data.from_items([{"question": f"What is {i} + {i}?"} for i in range(3)])).take_all()
    errors, answers = sum(bool(row["error"]) for row in rows), sum(bool(row["answer"]) for row in rows)
    print("ROWS", len(rows), "ERRORS", errors, "ANSWERS", answers)
"""


@pytest.mark.wheel
def test_the_installed_wheel_runs_a_processor_program_and_says_its_versions(
    installed, tiny_model_dir, tmp_path, processes
):
    """A user's build_processor program, in a directory of its own, on the installed package."""
    program = tmp_path / "my_program.py"
    program.write_text(textwrap.dedent(PROCESSOR_PROGRAM))
    env = env_for(installed, tmp_path / "home")
    (tmp_path / "home" / ".ray").mkdir(parents=True)
    shutil.copy(Path.home() / ".ray" / "auth_token", tmp_path / "home" / ".ray" / "auth_token")
    version = processes.run([installed.parent / "ngrammys", "--version"], cwd=tmp_path, env=env, timeout=60)
    assert version.stdout.startswith("ngrammys-batch 0.1.0 (vLLM 0.32.0, Ray 2.60.0"), version.stdout
    ran = processes.run([installed, program, str(tiny_model_dir)], cwd=tmp_path, env=env, timeout=400)
    assert "ROWS 3 ERRORS 0 ANSWERS 3" in ran.stdout


@pytest.mark.wheel
def test_ray_job_submit_runs_the_job_from_the_wheel_without_the_source(wheel, tiny_model_dir, tmp_path, processes):
    """A Ray head whose environment lacks the package: `ray job submit` from a directory that holds
    only the wheel installs it through the job's runtime environment (pip); then, with the wheel
    installed in that environment (a cluster image that has it), the job runs with no working
    directory at all. The job also exports its live metrics to the head's endpoint, and a user who
    joins without the token is told what to run."""
    python = new_environment(tmp_path / "cluster-env", wheel=None)
    home, submit_from = tmp_path / "home", tmp_path / "submit"
    submit_from.mkdir()
    shutil.copy(wheel, submit_from / wheel.name)
    env = env_for(python, home, RAY_metrics_report_interval_ms="1000")
    ray = str(python.parent / "ray")
    processes.run([ray, "get-auth-token", "--generate"], timeout=60, env=env, cwd=submit_from)
    head = start_ray_head(processes, env, ray=Path(ray), cwd=submit_from)
    inputs = jsonl(tmp_path / "in.jsonl", 4)

    def submit(run_id: str, *runtime_env: str) -> subprocess.CompletedProcess:
        return processes.run(
            [
                ray,
                "job",
                "submit",
                "--address",
                head["dashboard"],
                *runtime_env,
                "--",
                "ngrammys",
                "generate",
                "--input",
                str(inputs),
                "--output",
                str(tmp_path / "out"),
                "--run-id",
                run_id,
                "--set",
                f"model.name={tiny_model_dir}",
                "--set",
                "sampling.max_new_tokens=5",
                "--set",
                "input.limit=3",
                # The transformers engine: it starts in seconds (the vLLM engine, and the proposer vLLM
                # loads from the installed package by its dotted path, run in the processor test).
                "--set",
                "engine.name=transformers",
            ],
            cwd=submit_from,
            env=env,
            timeout=400,
        )

    try:
        from_runtime_env = submit(
            "from-runtime-env",
            "--working-dir",
            ".",
            "--runtime-env-json",
            json.dumps({"pip": [f"${{RAY_RUNTIME_ENV_CREATE_WORKING_DIR}}/{wheel.name}"]}),
        )
        install(python, wheel)
        from_image = submit("from-image")
        counters = scrape_counters(head["metrics_port"], "from-image", {"rows": 3, "generation_tokens": 15})
        forgot = {
            key: value
            for key, value in env_for(python, tmp_path / "other-home", RAY_ADDRESS=head["gcs"]).items()
            if key != "RAY_AUTH_MODE"
        }
        refused = processes.run(
            [python.parent / "ngrammys", "generate", "--input", str(inputs)],
            cwd=submit_from,
            env=forgot,
            timeout=120,
            check=False,
        )
    finally:
        stop_ray_head(head)
    for submitted, run_id in ((from_runtime_env, "from-runtime-env"), (from_image, "from-image")):
        assert "succeeded" in submitted.stdout
        assert "Read 3 of the input's 4 rows (input.limit=3: 1 rows NOT read): 3 generated" in submitted.stdout
        rows = read_run(tmp_path / "out" / f"run={run_id}")
        assert sorted(row["id"] for row in rows) == ["p0", "p1", "p2"]
        assert all(row["error"] is None and len(row["generated_tokens"]) == 5 for row in rows)
    assert counters["rows"] == 3 and counters["generation_tokens"] == 15 and counters["target_calls"] >= 1, counters
    assert refused.returncode != 0 and "run `ray get-auth-token --generate`" in refused.stderr
