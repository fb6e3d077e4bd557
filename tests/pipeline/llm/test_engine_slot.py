"""An engine that fails never fails the run: the stage closes it, builds a new one and runs its
batches again (pipeline/llm/stage.py). Faults are injected into the vLLM engine's step (tests/faults.py):
here in the stage's own process, and in a running job's actors and a running processor's through
Ray's worker setup hook. Every id comes back once, with no error row and the text of a run without
the failure; a crash loop stops the run naming its cause."""

from __future__ import annotations

import gc
import json
import os
import threading
import weakref
from pathlib import Path

import pytest
import ray

from pipeline.job import rows as job_rows
from pipeline.llm.errors import JobFailed
from pipeline.config import load_config
from pipeline.engines.vllm import feeder
from pipeline.llm.progress import EngineCrashLoop, RestartWindow
from pipeline.job.ray_job import run_job
from pipeline.llm.stage import GenerationStage
from tests import faults, outputs
from tests.job_in_process import generate

REPO = Path(__file__).resolve().parents[3]
ROWS = 64


def vllm_config(tiny_model_dir, *overrides):
    return load_config(
        REPO / "configs/default.yaml",
        [
            "engine.name=vllm",
            f"model.name={tiny_model_dir}",
            "vllm.execution=eager",
            "vllm.cpu_kv_cache_gib=1",
            "vllm.max_model_len=256",
            "vllm.max_num_seqs=4",
            "sampling.max_new_tokens=8",
            "input.limit=0",
            *overrides,
        ],
    )


@pytest.fixture(scope="module")
def fault_dir(tmp_path_factory, monkeypatch_module):
    directory = tmp_path_factory.mktemp("faults")
    monkeypatch_module.setenv("NGRAMMYS_TEST_FAULTS", str(directory))
    faults.inject(directory, None)
    return directory


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


@pytest.fixture(scope="module")
def patched_feeder(fault_dir, monkeypatch_module):
    monkeypatch_module.setattr(feeder.EngineFeeder, "_step", feeder.EngineFeeder._step)  # restored after the module
    faults.patch(feeder)


def batch(count: int) -> dict[str, list]:
    """Greedy rows and (every other one) rows sampled with their own seed."""
    return {
        "id": [str(i) for i in range(count)],
        "prompt": [f"Count from {i}: {i} {i + 1}" for i in range(count)],
        "temperature": [0.8 * (i % 2) for i in range(count)],
        "seed": list(range(count)),
    }


def test_more_failures_than_the_limit_within_the_window_is_a_crash_loop():
    window = RestartWindow(limit=2, window=60)
    assert window.record("a", now=0) is None and window.record("b", now=30) is None
    assert window.record("c", now=100) is None  # the first two are out of the window
    stop = window.record("d", now=110)
    assert stop is None and window.total == 4
    assert (
        "the engine failed 3 times within engine.restart_window_s (60 s), more than engine.max_restarts (2); "
        "the last failure: e" == window.record("e", now=120)
    )
    assert RestartWindow(limit=0, window=60).record("x", now=0).startswith("the engine failed 1 times")


@pytest.mark.slow  # three vLLM engines built in this process: make test-slow
def test_a_failed_engine_is_replaced_its_batches_run_again_and_its_memory_let_go(
    tiny_model_dir, fault_dir, patched_feeder
):
    stage = GenerationStage(vllm_config(tiny_model_dir), job_rows.stage_settings(vllm_config(tiny_model_dir)))
    rows = batch(12)
    clean = generate(stage, rows).to_pylist()
    first = weakref.ref(stage.engine.feeder.llm)  # vLLM's LLM: the model's weights and KV cache
    faults.inject(fault_dir, "raise", at=3)
    # Two batches at once, as Ray Data runs them on one actor: the engine fails under both.
    results = {}
    threads = [
        threading.Thread(
            target=lambda half=half: results.__setitem__(
                half, generate(stage, {name: values[half::2] for name, values in rows.items()}).to_pylist()
            )
        )
        for half in (0, 1)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    again = sorted(results[0] + results[1], key=lambda row: int(row["id"]))
    assert stage.current[1] == 1 and stage.restarts.total == 1  # one new engine, whichever batch met it
    assert [row["error"] for row in again] == [None] * 12
    # Greedy rows and seeded sampled rows alike: the texts of the run without the failure.
    assert [row["generated_tokens"] for row in again] == [row["generated_tokens"] for row in clean]
    assert [row["temperature"] for row in again[:2]] == [0.0, pytest.approx(0.8)]
    gc.collect()
    assert first() is None, "the failed engine's model and KV cache are still referenced"
    # A crash loop (every engine's third step fails) stops after engine.max_restarts, naming the cause.
    faults.inject(fault_dir, "always", at=3)
    with pytest.raises(
        EngineCrashLoop, match=r"failed 2 times .* more than engine.max_restarts \(1\).*" + faults.INJECTED
    ):
        stage.restarts.limit = 1
        generate(stage, rows)
    faults.inject(fault_dir, None)
    stage.engine.close()


# --- In a running job and a running processor: faults reach the actors through Ray's setup hook ---


@pytest.fixture(scope="module")
def fault_ray(fault_dir):
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        runtime_env={
            "worker_process_setup_hook": "tests.faults.install",
            # Workers import the hook from the repository (tests/ is not installed).
            "env_vars": {
                "NGRAMMYS_TEST_FAULTS": str(fault_dir),
                "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
            },
        },
    )
    yield
    ray.shutdown()


def corpus(tmp_path) -> Path:
    path = tmp_path / "in.jsonl"
    path.write_text(
        "".join(json.dumps({"id": f"q{i:02d}", "prompt": f"Count from {i}: {i} {i + 1}"}) + "\n" for i in range(ROWS))
    )
    return path


def job(tiny_model_dir, tmp_path, *overrides):
    return vllm_config(
        tiny_model_dir,
        f"job.output={tmp_path / 'out'}",
        f"input.path={corpus(tmp_path)}",
        "ray.batch_size=4",
        "drafting.drafter=context_ngram",
        *overrides,
    )


def texts(tmp_path, run_id) -> dict[str, list[int]]:
    rows = outputs.read_run(tmp_path / "out" / f"run={run_id}")
    assert len(rows) == len({row["id"] for row in rows}) == ROWS, "every id once"
    assert [row["error"] for row in rows] == [None] * ROWS
    return {row["id"]: row["generated_tokens"] for row in rows}


@pytest.mark.slow  # three vLLM jobs in Ray actors: make test-slow
def test_a_job_whose_engine_fails_writes_every_id_once_with_a_clean_runs_texts(
    fault_ray, fault_dir, tiny_model_dir, tmp_path
):
    faults.inject(fault_dir, None)
    clean = run_job(job(tiny_model_dir, tmp_path), "clean")
    faults.inject(fault_dir, "raise", at=20)  # an error out of the 20th step of the actor's engine
    failed = run_job(job(tiny_model_dir, tmp_path), "failed")
    assert texts(tmp_path, "failed") == texts(tmp_path, "clean")
    assert failed["engine_restarts"]["total"] == 1 and faults.INJECTED in failed["engine_restarts"]["causes"][0]
    assert clean["engine_restarts"]["total"] == 0
    print(f"wall: {clean['wall_seconds']} s clean, {failed['wall_seconds']} s with the failure")
    # A step that never returns: the actor's process ends, Ray starts it again and retries its batches.
    faults.inject(fault_dir, "hang", at=10)
    hung = run_job(job(tiny_model_dir, tmp_path, "engine.hang_timeout_s=10"), "hung")
    assert texts(tmp_path, "hung") == texts(tmp_path, "clean")
    assert hung["engine_restarts"]["total"] == 1 and "made no progress" in hung["engine_restarts"]["causes"][0]


@pytest.mark.slow  # a vLLM job in Ray actors: make test-slow
def test_a_crash_loop_stops_the_job_naming_its_cause(fault_ray, fault_dir, tiny_model_dir, tmp_path):
    faults.inject(fault_dir, "always", at=5)  # every engine's 5th step fails
    with pytest.raises(
        JobFailed,
        match=r"failed 2 times within engine.restart_window_s \(3600 s\), more than "
        r"engine.max_restarts \(1\); the last failure: .*" + faults.INJECTED,
    ):
        run_job(job(tiny_model_dir, tmp_path, "engine.max_restarts=1"), "loop")
    faults.inject(fault_dir, None)


@pytest.mark.slow  # a vLLM processor in Ray actors: make test-slow
def test_a_processor_whose_engine_fails_returns_every_row(fault_ray, fault_dir, tiny_model_dir):
    from pipeline import llm

    faults.inject(fault_dir, "raise", at=10)
    processor = llm.build_processor(
        llm.vLLMEngineProcessorConfig(
            model_source=str(tiny_model_dir),
            batch_size=4,
            max_concurrent_batches=2,
            placement_group_config={"bundles": [{"CPU": 0.5}]},
            engine_kwargs={"max_num_seqs": 4, "max_model_len": 256, "enforce_eager": True, "max_restarts": 2},
        ),
        preprocess=lambda row: {
            "prompt": f"Count from {row['id']}:",
            "sampling_params": {"temperature": 0, "max_tokens": 8},
        },
    )
    rows = processor(ray.data.range(24)).take_all()
    assert sorted(row["id"] for row in rows) == list(range(24))
    assert all(row["__inference_error__"] == "" and row["num_generated_tokens"] == 8 for row in rows)
    assert (fault_dir / "claimed").exists(), "the fault was met"
    faults.inject(fault_dir, None)
