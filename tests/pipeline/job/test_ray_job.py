"""The Ray Data job on a local Ray, with the tiny model: formats, bad rows, shared tables.
(Resume, clusters, S3 and lost actors: test_scale_out.py.)"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray

from pipeline.loading.drafters import build_tables
from pipeline.config import load_config
from pipeline.loading.model import load_model
from pipeline.job.inputs import check_columns, input_names, read_input
from pipeline.job import ray_job
from pipeline.job.ray_job import JobFailed, make_plan, prepare_output, read_plan, run_job
from pipeline.llm.stage import GenerationStage
from tests import outputs
from tests.config_follow import ConfigFollower

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False)
    yield
    ray.shutdown()


def job_config(tiny_model_dir, tmp_path, *overrides):
    return load_config(
        REPO / "configs/default.yaml",
        [
            "engine.name=transformers",
            f"model.name={tiny_model_dir}",
            "sampling.max_new_tokens=6",
            f"job.output={tmp_path / 'out'}",
            "input.limit=0",
            *overrides,
        ],
    )


def read_run(tmp_path, run_id) -> list[dict]:
    return outputs.read_run(tmp_path / "out" / f"run={run_id}")


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture(scope="module")
def mixed_rows(local_ray, tiny_model_dir, tmp_path_factory):
    """A job over good rows, bad ones and a torn line, run once for this module's tests, with the
    functions its driver hands the whole config to followed (config_follow.py)."""
    tmp_path = tmp_path_factory.mktemp("mixed")
    rows = [
        {"id": "ok", "prompt": "def add(a, b):"},
        {"id": "empty", "prompt": ""},
        {"id": "number", "prompt": 7},
        {"id": "long", "prompt": "word " * 2000},
        {"id": "short", "prompt": "Hi", "max_new_tokens": 2},
        {"id": "hot", "prompt": "Hi", "temperature": 0.7},
        {"id": "none"},
    ]
    path = write_jsonl(tmp_path / "in.jsonl", rows)
    with open(path, "a") as corpus:  # a line another system cut short, then a good one
        corpus.write('{"id": "torn", "prompt": "an unterminated\n{"id": "after", "prompt": "Hi"}\n')
    rows.append({"id": "after"})
    config = job_config(tiny_model_dir, tmp_path, f"input.path={path}")
    with ConfigFollower() as follower:
        summary = run_job(config, "r1")
    return tmp_path, path, rows, config, summary, follower


def test_every_input_row_yields_one_output_row(mixed_rows):
    tmp_path, path, rows, config, summary, _ = mixed_rows
    out = {row["id"]: row for row in read_run(tmp_path, "r1")}
    bad_line = f"{path}:8"  # the torn line: its id names its file and line
    assert sorted(out) == sorted([r["id"] for r in rows] + [bad_line])
    assert out[bad_line]["error"] == (
        f"row {bad_line!r}: input.path: {path} line 8: not valid JSON: Unterminated string starting at: column 26"
    )
    assert out["after"]["error"] is None
    assert out["ok"]["error"] is None and len(out["ok"]["generated_tokens"]) == 6
    assert out["short"]["error"] is None and len(out["short"]["generated_tokens"]) == 2
    assert "the prompt is empty" in out["empty"]["error"]
    assert "must be text" in out["number"]["error"]
    assert "no room to generate" in out["long"]["error"]
    assert (
        out["hot"]["error"] is None
        and out["hot"]["temperature"] == pytest.approx(0.7)
        and out["hot"]["seed"] is not None
    )
    assert "row 'none': the row has no messages, prompt or tokenized_prompt" in out["none"]["error"]
    assert summary["rows"] == 9 and summary["errored_rows"] == 5
    generated = sum(len(row["generated_tokens"] or []) for row in out.values())
    assert json.loads((tmp_path / "out" / "run=r1" / "summary.json").read_text())["generated_tokens"] == generated
    checked = sum(row["num_checked_draft_tokens"] or 0 for row in out.values())
    accepted = sum(row["sum_acceptance_probability"] or 0 for row in out.values())
    assert summary["acceptance_rate"] == (pytest.approx(accepted / checked, abs=1e-4) if checked else None)
    assert summary["seconds_to_first_batch"] > 0 and summary["series"] is None and len(summary["fingerprint"]) == 16
    # drafting.speculation auto: 9 rows are too few to measure; the actor ran the rule's mode and never restarted.
    actors = list(summary["speculation"]["actors"].values())
    assert summary["speculation"]["setting"] == "auto" and len(actors) == 1
    assert (actors[0]["mode"], actors[0]["decided_by"], actors[0]["switches"]) == ("batch_suffix", "rule", [])
    assert actors[0]["modes"] == ["batch_suffix", "none"] and actors[0]["restart_seconds"] > 0

    # Run again, it is finished: the checkpoint has every id (the error rows' too), nothing is written twice.
    again = run_job(config, "r1")
    assert sorted(row["id"] for row in read_run(tmp_path, "r1")) == sorted(out)
    assert (summary["rows_this_invocation"], again["rows_this_invocation"]) == (9, 0)
    assert again["rows_skipped_already_done"] == 9 and again["rows"] == 9 and again["errored_rows"] == 5


def test_the_driver_hands_the_whole_config_to_few_functions(mixed_rows):
    """A reader following the config from the job's entry meets at most 20 functions, no module
    more than 3 times; the rest take the section or value they read."""
    follower = mixed_rows[-1]
    stops = [f"{module}:{name}" for module, name in follower.stops]
    assert stops[:2] == ["pipeline/job/ray_job.py:run_job", "pipeline/job/ray_job.py:generate_and_write"], stops
    assert len(stops) <= 20 and max(follower.per_module().values()) <= 3, stops


def test_rest_actors_map_the_datastore_the_driver_checked(local_ray, tiny_model_dir, tmp_path, monkeypatch):
    from drafters.datastore import build_datastore

    rows = [{"id": str(i), "prompt": "def add(a, b):\n    return a + b"} for i in range(3)]
    tokenizer = load_model(load_config(overrides=[f"model.name={tiny_model_dir}"]).model).tokenizer
    build_datastore([tokenizer(rows[0]["prompt"] * 3, add_special_tokens=False)["input_ids"]], tmp_path / "ds", {})
    overrides = [
        f"input.path={write_jsonl(tmp_path / 'in.jsonl', rows)}",
        "drafting.drafter=rest",
        "transformers.k=2",
        "drafting.w=3",
        "transformers.verify=tree",
    ]
    with pytest.raises(FileNotFoundError, match="does not exist; build one with: python -m jobs.build_datastore"):
        run_job(job_config(tiny_model_dir, tmp_path, *overrides, f"drafting.datastore={tmp_path / 'nowhere'}"), "r")
    monkeypatch.chdir(tmp_path)  # a relative datastore path is resolved on the driver for every actor
    run_job(job_config(tiny_model_dir, tmp_path, *overrides, "drafting.datastore=ds"), "r")
    out = read_run(tmp_path, "r")
    assert len(out) == 3 and all(row["error"] is None and row["verify"] == "tree" for row in out)
    assert all(row["median_draft_seconds"] is not None for row in out)


@pytest.mark.parametrize("kind", ["parquet", "csv", "hf_dataset", "glob", "directory", "messages"])
def test_input_formats(local_ray, tiny_model_dir, tmp_path, kind):
    table = pa.table({"qid": ["a", "b", "c"], "text": ["one", "two", "three"]})
    overrides = ["input.id_column=qid", "input.prompt_column=text"]
    if kind == "parquet":
        pq.write_table(table, tmp_path / "in.parquet")
        path = tmp_path / "in.parquet"
    elif kind == "csv":
        import pyarrow.csv

        pyarrow.csv.write_csv(table, tmp_path / "in.csv")
        path = tmp_path / "in.csv"
    elif kind == "hf_dataset":
        datasets.Dataset.from_dict(table.to_pydict()).save_to_disk(tmp_path / "hf")
        path = tmp_path / "hf"
    elif kind in ("glob", "directory"):
        (tmp_path / "shards").mkdir()
        pq.write_table(table.slice(0, 2), tmp_path / "shards" / "0.parquet")
        pq.write_table(table.slice(2), tmp_path / "shards" / "1.parquet")
        path = tmp_path / "shards" / "*.parquet" if kind == "glob" else tmp_path / "shards"
    else:
        rows = [{"qid": q, "chat": [{"role": "user", "content": t}]} for q, t in zip(["a", "b", "c"], ["x", "y", "z"])]
        path = write_jsonl(tmp_path / "chat.jsonl", rows)
        overrides = ["input.id_column=qid", "input.prompt_column=''", "input.messages_column=chat"]
    # Reading is what differs between formats (the stage and the writer are the same for all):
    # the rows as the job's actors receive them.
    source = job_config(tiny_model_dir, tmp_path, f"input.path={path}", *overrides).input
    dataset = read_input(source, cpus=0.25)
    names = input_names(dataset, source)  # a JSON Lines file's first block read on the driver
    assert names == dataset.schema().names
    check_columns(names, source)
    rows = dataset.take_all()
    assert sorted(row["qid"] for row in rows) == ["a", "b", "c"]
    prompts = sorted(str(row["text"] if kind != "messages" else row["chat"][0]["content"]) for row in rows)
    assert prompts == (["one", "three", "two"] if kind != "messages" else ["x", "y", "z"])


def test_input_limit_takes_the_inputs_first_rows(local_ray, tiny_model_dir, tmp_path):
    """Ray splits a small read into blocks whose tasks finish in any order: input.limit still takes
    the input's first rows, every time."""
    path = write_jsonl(tmp_path / "in.jsonl", [{"id": f"p{i:03d}", "prompt": "x"} for i in range(200)])
    config = job_config(tiny_model_dir, tmp_path, f"input.path={path}", "input.limit=100")
    for attempt in range(8):
        plan = make_plan(config, f"r{attempt}")
        dataset, reading = read_plan(plan, prepare_output(plan))
        assert (reading.input_rows, reading.rows_read) == (200, 100)
        assert dataset.context.execution_options.preserve_order  # the stages after it keep the order too
        assert not ray.data.DataContext.get_current().execution_options.preserve_order  # the job's own only
        assert sorted(row["id"] for row in dataset.take_all()) == [f"p{i:03d}" for i in range(100)], attempt


def test_unreadable_input_is_named_by_file_and_line(local_ray, tiny_model_dir, tmp_path):
    """A CSV row that does not parse and a Parquet file cut short become rows naming them (the
    job writes them as error rows: test_every_input_row_yields_one_output_row); with
    input.on_bad_line fail the job stops before any actor starts, naming the file and line."""
    from pipeline.llm.schema import BAD_INPUT

    csv_path = tmp_path / "in.csv"
    csv_path.write_text("id,prompt\na,one\nb,two,extra\nc,three\n")
    shards = tmp_path / "shards"
    shards.mkdir()
    pq.write_table(pa.table({"id": ["p"], "prompt": ["x"]}), shards / "0.parquet")
    (shards / "1.parquet").write_bytes((shards / "0.parquet").read_bytes()[:40])  # a file cut short
    read = {}
    for path in (csv_path, shards):
        for row in read_input(job_config(tiny_model_dir, tmp_path, f"input.path={path}").input, cpus=0.25).take_all():
            read[str(row["id"])] = row.get(BAD_INPUT)
    assert sorted(read) == sorted(["a", "c", f"{csv_path}:3", "p", str(shards / "1.parquet")])
    assert read["a"] is None and read["p"] is None
    assert read[f"{csv_path}:3"] == f"input.path: {csv_path} line 3: 3 fields where the header has 2: 'b,two,extra'"
    assert read[str(shards / "1.parquet")].startswith(
        f"input.path: {shards / '1.parquet'}: not a readable Parquet file"
    )
    with pytest.raises(JobFailed, match=rf"^input.path: {csv_path} line 3: 3 fields where the header has 2"):
        run_job(job_config(tiny_model_dir, tmp_path, f"input.path={csv_path}", "input.on_bad_line=fail"), "r")


def test_missing_column_fails_at_start_naming_it(local_ray, tiny_model_dir, tmp_path):
    path = write_jsonl(tmp_path / "in.jsonl", [{"id": "a", "question": "q"}])
    with pytest.raises(JobFailed, match=r"input.prompt_column: the input has no column 'prompt'; its columns are"):
        run_job(job_config(tiny_model_dir, tmp_path, f"input.path={path}"), "r")


def test_an_empty_input_ends_the_run_saying_it_read_nothing_and_an_empty_directory_is_named(
    local_ray, tiny_model_dir, tmp_path
):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    summary = run_job(job_config(tiny_model_dir, tmp_path, f"input.path={empty}"), "r")
    assert (summary["input_rows"], summary["rows_read"], summary["rows_this_invocation"]) == (0, 0, 0), summary
    (tmp_path / "shards").mkdir()
    with pytest.raises(JobFailed, match=r"input.path: the directory '.*shards' holds no file to read"):
        run_job(job_config(tiny_model_dir, tmp_path, f"input.path={tmp_path / 'shards'}"), "r2")


def test_a_model_the_engine_cannot_run_fails_the_job_at_start(local_ray, tiny_gemma3_dir, tmp_path):
    # Two rows, not HumanEval's 164 (one block each: counting them took most of the test's time).
    path = write_jsonl(tmp_path / "in.jsonl", [{"id": str(i), "prompt": "Hi"} for i in range(2)])
    config = load_config(
        REPO / "configs/default.yaml",
        [
            "engine.name=transformers",
            f"model.name={tiny_gemma3_dir}",
            f"job.output={tmp_path / 'out'}",
            f"input.path={path}",
        ],
    )
    with pytest.raises(JobFailed, match="sliding-window attention"):
        run_job(config, "never")  # refused by the task that prepares the model, before any actor starts
    assert not outputs.run_files(tmp_path / "out" / "run=never")


@pytest.mark.slow  # a job stopped part-way (about 35 s): make test-slow
def test_too_many_errored_rows_fail_the_job(local_ray, tiny_model_dir, tmp_path):
    path = write_jsonl(tmp_path / "in.jsonl", [{"id": str(i), "prompt": ""} for i in range(4)])
    config = job_config(
        tiny_model_dir,
        tmp_path,
        f"input.path={path}",
        "job.max_errored_rows=1",
        "ray.batch_size=2",
        "transformers.max_batch_requests=2",
    )
    with pytest.raises(JobFailed, match=r"rows failed, more than job.max_errored_rows \(1\)"):
        run_job(config, "r")


def shared_memory_location(array) -> tuple[str, str, int] | None:
    """(device, inode, offset in the file) of the shared file mapping that holds the array's first
    byte in this process (Linux: /proc/self/maps), or None if no shared mapping of a file holds it.
    Two processes reporting the same location read one copy of the bytes."""
    address = array.__array_interface__["data"][0]
    for line in Path("/proc/self/maps").read_text().splitlines():
        span, permissions, offset, device, inode = line.split()[:5]
        low, high = (int(end, 16) for end in span.split("-"))
        if low <= address < high:
            shared_file = permissions.endswith("s") and inode != "0"
            return (device, inode, address - low + int(offset, 16)) if shared_file else None
    return None


@ray.remote(num_cpus=0.5, max_calls=1)  # a process of its own for each call (Ray may reuse a worker otherwise)
def tables_in_an_actor_process(config, refs):
    stage = GenerationStage(config, tables=refs[0])  # an ObjectRef, as map_batches hands it to each actor
    chained = stage.engine.decoder.drafter.fill.table  # what the actor's mixed drafter drafts from
    return {"writeable": chained.flags.writeable, "where": [shared_memory_location(chained)], "pid": os.getpid()}


def test_the_processor_takes_the_preparation_started_for_its_config_and_no_other(local_ray, tmp_path, monkeypatch):
    """The job starts preparing the model before it counts its input; the processor waits on that
    preparation where it was started for the config it runs, and starts its own otherwise."""
    from pipeline.llm import actor_pool

    config = load_config(None, [f"job.output={tmp_path}"])
    other = dataclasses.replace(config, ray=dataclasses.replace(config.ray, max_actors=2))
    started = actor_pool.Preparation(config, ray.put({}), "the started tables", "its tokenizer")
    monkeypatch.setattr(
        actor_pool, "start_preparing", lambda c, env=None: actor_pool.Preparation(c, ray.put({}), "new", "its own")
    )
    assert actor_pool.prepared(config, None, started).tables == "the started tables"
    assert actor_pool.prepared(other, None, started).tables == "new"
    assert actor_pool.prepared(config).tables == "new"


@pytest.mark.slow  # two actor processes that each load torch and build an engine (about 50 s): make test-slow
def test_drafter_tables_reach_actors_as_read_only_shared_memory(local_ray, tiny_model_dir, tmp_path):
    config = job_config(tiny_model_dir, tmp_path, "drafting.drafter=mixed", "transformers.k=2", "drafting.w=3")
    loaded = load_model(config.model)
    tables = build_tables(loaded.model, loaded.tokenizer, loaded.fingerprint, config.drafting, tmp_path / "cache")
    ref = ray.put(tables.as_plain_arrays())
    # Wrapped in a list so Ray passes the reference itself rather than resolving it first.
    seen = ray.get([tables_in_an_actor_process.remote(config, [ref]) for _ in range(2)])
    # Zero-copy reads from the object store come back read-only, and both processes read the
    # tables at the same place of the object store's shared memory: one copy.
    assert all(actor["writeable"] is False for actor in seen)
    assert None not in seen[0]["where"] and seen[0]["where"] == seen[1]["where"]
    assert len({actor["pid"] for actor in seen} | {os.getpid()}) == 3


@ray.remote(num_cpus=0.5, max_calls=1)
def datastore_in_an_actor_process(config, refs):
    stage = GenerationStage(config, tables=refs[0])
    drafter = stage.engine.decoder.drafter  # what the actor's suffix drafter drafts from
    tokens, suffix_array = drafter.store_tokens.base, drafter.suffix_array.base  # (the drafter keeps read-only views)
    return {
        "tokens": tokens.tolist(),
        "writeable": tokens.flags.writeable or suffix_array.flags.writeable,
        "where": [shared_memory_location(tokens), shared_memory_location(suffix_array)],
        "pid": os.getpid(),
    }


@pytest.mark.slow  # a job with a datastore (about 33 s): make test-slow
def test_actors_draft_from_one_copy_of_the_datastore_in_the_object_store(local_ray, tiny_model_dir, tmp_path):
    """The task that prepares the model puts the datastore beside the tables; the actors map that
    one copy (read-only, at the same place of the object store's shared memory) and never open
    the files, which are gone by the time they start."""
    import shutil

    from drafters.datastore import Datastore, build_datastore
    from pipeline.llm.actor_pool import prepared

    # Past Ray's 100 KiB for objects it inlines in the owner's memory instead of the object store.
    build_datastore([list(range(5, 105))] * 400, tmp_path / "ds", {})
    expected = Datastore.open(tmp_path / "ds").tokens.tolist()
    config = job_config(
        tiny_model_dir,
        tmp_path,
        "drafting.drafter=batch_suffix",
        "drafting.w=3",
        f"drafting.datastore={tmp_path / 'ds'}",
    )
    ref = prepared(config).tables
    shutil.rmtree(tmp_path / "ds")
    seen = ray.get([datastore_in_an_actor_process.remote(config, [ref]) for _ in range(2)])
    assert all(actor["tokens"] == expected and actor["writeable"] is False for actor in seen)
    assert None not in seen[0]["where"] and seen[0]["where"] == seen[1]["where"]
    assert len({actor["pid"] for actor in seen} | {os.getpid()}) == 3


def corpus(tmp_path, size: int) -> Path:
    return write_jsonl(tmp_path / f"corpus-{size}.jsonl", [{"id": i, "prompt": f"question {i}"} for i in range(size)])


def series_ids(tmp_path, *run_ids) -> list[str]:
    return [
        row["id"]
        for run_id in run_ids
        for row in outputs.read_run(tmp_path / "out" / "series=nightly" / f"run={run_id}")
    ]


@pytest.mark.slow  # two job runs: make test-slow
def test_a_torn_output_file_is_set_aside_and_its_ids_generated_again(local_ray, tiny_model_dir, tmp_path):
    """A series' output file cut to half its bytes (a node killed while writing it on a file
    system) never stops the next run: the run sets it aside, names it, and generates the edited row
    and every id whose only output was in that file."""
    settings = ["job.series=nightly", "sampling.max_new_tokens=2", "ray.batch_size=4"]
    run_job(job_config(tiny_model_dir, tmp_path, f"input.path={corpus(tmp_path, 12)}", *settings), "r1")
    files = outputs.run_files(tmp_path / "out" / "series=nightly" / "run=r1")
    torn = files[0]
    lost = {str(row["id"]) for row in pq.read_table(torn, columns=["id"]).to_pylist()}
    assert len(files) > 1 and 0 < len(lost) < 12
    torn.write_bytes(torn.read_bytes()[: torn.stat().st_size // 2])
    edited = write_jsonl(
        tmp_path / "edited.jsonl", [{"id": i, "prompt": f"question {i}" + " (edited)" * (i == 11)} for i in range(12)]
    )
    second = run_job(job_config(tiny_model_dir, tmp_path, f"input.path={edited}", *settings), "r2")
    kept = tmp_path / "out" / "_set_aside" / "series=nightly" / "run=r1" / torn.name
    assert [entry["file"] for entry in second["set_aside"]] == [str(torn)] and kept.is_file() and not torn.exists()
    assert (
        second["set_aside"][0]["moved_to"] == str(kept)
        and "not a readable Parquet file" in second["set_aside"][0]["error"]
    )
    assert sorted(series_ids(tmp_path, "r2"), key=int) == sorted(lost | {"11"}, key=int)
    assert sorted(set(series_ids(tmp_path, "r1", "r2")), key=int) == [str(i) for i in range(12)]
    assert (
        second["errored_rows"] == 0
        and json.loads((tmp_path / "out" / "series=nightly" / "run=r2" / "summary.json").read_text())["set_aside"]
        == second["set_aside"]
    )


@pytest.mark.slow  # several job runs: make test-slow
def test_a_series_generates_only_what_no_earlier_run_generated(local_ray, tiny_model_dir, tmp_path, monkeypatch):
    import pipeline.llm.processor as llm  # the job's processor prepares the model

    settings = ["job.series=nightly", "sampling.max_new_tokens=2", "ray.batch_size=4"]
    first = run_job(job_config(tiny_model_dir, tmp_path, f"input.path={corpus(tmp_path, 30)}", *settings), "r1")
    assert first["rows_this_invocation"] == 30 and first["series"] == "nightly"
    grown = corpus(tmp_path, 33)
    second = run_job(job_config(tiny_model_dir, tmp_path, f"input.path={grown}", *settings), "r2")
    assert second["rows_this_invocation"] == 3 and second["rows_skipped_already_done"] == 30
    # The second run drafted from the store the first one left (pipeline/job/series_store.py), and
    # the store changed no fingerprint.
    assert first["series_store"]["documents"] == 30 and second["series_store"]["runs"] == 2
    assert second["settings"]["drafting"]["datastore"] == first["series_store"]["path"]
    assert second["fingerprint"] == first["fingerprint"]
    assert sorted(series_ids(tmp_path, "r2"), key=int) == [str(i) for i in range(30, 33)]

    def no_actors(*args):
        raise AssertionError("a run with nothing new prepared the model for actors")

    monkeypatch.setattr(llm, "prepared", no_actors)
    third = run_job(job_config(tiny_model_dir, tmp_path, f"input.path={grown}", *settings), "r3")
    assert third["rows_this_invocation"] == 0 and third["rows_skipped_already_done"] == 33
    monkeypatch.undo()
    # Two rows edited: those two are generated again, drafted from their last output.
    edited = write_jsonl(
        tmp_path / "edited.jsonl",
        [{"id": i, "prompt": f"question {i}" + " (edited)" * (i in (4, 31))} for i in range(33)],
    )
    carried = []  # whether a run generated from the rows its count carried back (its input read once)
    original = ray_job.generated_from
    monkeypatch.setattr(ray_job, "generated_from", lambda counted: carried.append(original(counted)) or carried[-1])
    fourth = run_job(job_config(tiny_model_dir, tmp_path, f"input.path={edited}", *settings), "r4")
    assert fourth["rows_this_invocation"] == 2 and (fourth["changed_rows"], fourth["new_rows"]) == (2, 0)
    regenerated = outputs.read_run(tmp_path / "out" / "series=nightly" / "run=r4")
    assert sorted(row["id"] for row in regenerated) == ["31", "4"]
    # On the transformers engine no prediction is drafted from (predicted_from says so).
    assert all(
        row["changed"] and row["predicted_from"] is None and len(row["fingerprint"]) == 16 for row in regenerated
    )
    # Another output setting changes every row's fingerprint: everything is generated again, once.
    fifth = run_job(
        job_config(tiny_model_dir, tmp_path, f"input.path={edited}", *settings, "sampling.max_new_tokens=3"), "r5"
    )
    assert fifth["rows_this_invocation"] == 33 and fifth["fingerprint"] != first["fingerprint"]
    assert [dataset is not None for dataset in carried] == [True, False]  # 2 of 33 rows are few; 33 are not
    for runs in (("r1", "r2", "r3"), ("r5",)):  # every id once per fingerprint
        ids = series_ids(tmp_path, *runs)
        assert len(ids) == len(set(ids)) == 33
    from jobs import report

    history = report.main([str(tmp_path / "out" / "series=nightly"), "--out", str(tmp_path / "report")])
    assert [run["rows_this_invocation"] for run in history["runs"]] == [30, 3, 0, 2, 33]
    assert (tmp_path / "report" / "series.png").stat().st_size > 0


def test_actors_asking_for_an_accelerator_the_cluster_lacks_fail_within_the_wait(local_ray, tiny_model_dir, tmp_path):
    # Without the wait this would hang forever; the message can only come from the wait running out.
    # Two rows of a file, not HumanEval's 164 (one block each: counting them took most of the test's time).
    path = write_jsonl(tmp_path / "in.jsonl", [{"id": str(i), "prompt": "Hi"} for i in range(2)])
    config = job_config(
        tiny_model_dir, tmp_path, f"input.path={path}", "ray.accelerator_type=A100", "ray.wait_for_actors_s=5"
    )
    with pytest.raises(JobFailed, match=r"'accelerator_type': 'A100'.*within ray.wait_for_actors_s \(5 s\)"):
        run_job(config, "nowhere")


@ray.remote
class CpuHolder:
    """Other work on the node: holds the CPUs it was given."""

    def ready(self) -> bool:
        return True


@pytest.mark.slow  # a job run beside other work (about 45 s): make test-slow
def test_a_job_runs_on_a_node_with_no_whole_cpu_free(local_ray, tiny_model_dir, tmp_path):
    """Other work holds 1 of the 2 CPUs and the actor 0.5: every task that runs beside the actor
    (read, column selection, preprocess, write) must fit in the 0.5 left. One asking Ray Data's
    default whole CPU would wait for ever, as on two nodes of 1 CPU with an actor of 0.5 on each."""
    holder = CpuHolder.options(num_cpus=1).remote()
    ray.get(holder.ready.remote())
    rows = [{"id": f"r{i}", "prompt": f"Question {i}", "extra": i} for i in range(3)]
    config = job_config(
        tiny_model_dir, tmp_path, f"input.path={write_jsonl(tmp_path / 'in.jsonl', rows)}", "ray.num_cpus_per_actor=0.5"
    )
    finished: dict = {}
    job = threading.Thread(target=lambda: finished.update(summary=run_job(config, "r")), daemon=True)
    job.start()
    job.join(timeout=180)
    hung = job.is_alive()
    ray.kill(holder)  # frees the CPUs: a waiting job goes on, and later tests have them
    job.join(timeout=180)
    assert not hung, "the job waited for a CPU that no node had free"
    assert finished["summary"]["rows"] == len(rows)
    assert sorted(row["id"] for row in read_run(tmp_path, "r")) == [row["id"] for row in rows]


@pytest.mark.slow  # several job runs: make test-slow
def test_a_run_drafts_from_an_earlier_runs_outputs_and_refuses_a_store_of_another_tokenizer(
    local_ray, tiny_model_dir, tmp_path
):
    from drafters.datastore import build_datastore
    from jobs import build_datastore as build_command

    path = write_jsonl(tmp_path / "in.jsonl", [{"id": i, "prompt": f"Count to {i % 3}"} for i in range(6)])
    common = [
        f"input.path={path}",
        "sampling.max_new_tokens=24",
        "transformers.max_batch_requests=1",
        "ray.batch_size=2",
    ]
    run_job(job_config(tiny_model_dir, tmp_path, *common, "drafting.drafter=none", "drafting.w=0"), "first")
    store = tmp_path / "store"
    build_command.main(
        ["--corpus", str(tmp_path / "out" / "run=first"), "--out", str(store), "--model", str(tiny_model_dir)]
    )
    seeded = job_config(
        tiny_model_dir, tmp_path, *common, "drafting.drafter=batch_suffix", f"drafting.datastore={store}"
    )
    run_job(seeded, "second")
    first, second = read_run(tmp_path, "first"), read_run(tmp_path, "second")
    assert {row["id"]: row["generated_tokens"] for row in second} == {
        row["id"]: row["generated_tokens"] for row in first
    }
    from_store = sum(dict(row["strategy_accepted_tokens"] or []).get("suffix_store", 0) for row in second)
    assert from_store > 0, [row["strategy_accepted_tokens"] for row in second]
    foreign = tmp_path / "foreign"
    build_datastore([[1, 2, 3, 4]], foreign, {"vocab_size": 1000, "model": "another"})
    with pytest.raises(JobFailed, match="drafting.datastore: built with a tokenizer of 1000 tokens"):
        run_job(
            job_config(
                tiny_model_dir, tmp_path, *common, "drafting.drafter=batch_suffix", f"drafting.datastore={foreign}"
            ),
            "foreign",
        )


@pytest.mark.slow  # the job and the processor on the same rows (about 1 minute): make test-slow
def test_the_job_and_the_processor_write_the_same_rows(local_ray, tiny_model_dir, tmp_path):
    """The CLI job is a pipeline.llm Processor (its preprocess and postprocess around the one stage
    class, request parser and engine): the same prompts and settings give the same Parquet, column for column,
    wherever both have the column (timings, and the shares of calls that depend on how Ray Data cut
    the batches, aside). The drafter drafts from each request and the model's tables alone, at a
    fixed k and w, so its statistics do not depend on the batches either (batch_suffix's would:
    it drafts from the other requests' outputs)."""
    from pipeline import llm
    from pipeline.llm.schema import INFERENCE_ERROR

    rows = [{"id": f"p{i}", "prompt": f"Count from {i} to {i + 9}:"} for i in range(5)] + [
        {"id": "long", "prompt": "word " * 2000}
    ]
    config = job_config(
        tiny_model_dir,
        tmp_path,
        f"input.path={write_jsonl(tmp_path / 'in.jsonl', rows)}",
        "drafting.drafter=mixed",
        "transformers.k=3",
        "drafting.w=2",
        "ray.batch_size=4",
    )
    run_job(config, "cli")
    job = {row["id"]: row for row in read_run(tmp_path, "cli")}

    processor = llm.build_processor(
        llm.vLLMEngineProcessorConfig(
            model_source=str(tiny_model_dir),
            engine="transformers",
            batch_size=4,
            placement_group_config={"bundles": [{"CPU": 1}]},
            should_continue_on_error=True,
            drafting={"drafter": "mixed", "w": 2},  # as the job's config sets them
            transformers={"k": 3},
        ),
        # As a ray.data.llm user writes it: a text prompt as one user message, greedy, 6 tokens.
        preprocess=lambda row: {
            "messages": [{"role": "user", "content": row["prompt"]}],
            "sampling_params": {"temperature": 0, "max_tokens": 6},
        },
    )
    processor(ray.data.from_items(rows)).write_parquet(str(tmp_path / "api"))
    api = {row["id"]: row for row in outputs.read_run(tmp_path / "api")}

    assert sorted(api) == sorted(job)
    # Timings; how Ray Data cut the batches (each batch's uuid, the actor's request count, the calls'
    # shares); seed: the job derives one from sampling.seed, the processor here has none (greedy rows
    # sample nothing).
    varying = {
        "draft_seconds",
        "median_draft_seconds",
        "verify_seconds",
        "time_taken_llm",
        "draft_cost_ratio",
        "batch_uuid",
        "request_id",
        "forward_call_share",
        "seed",
        "id",
    }
    shared = sorted(set(job["p0"]) & set(api["p0"]) - varying)
    assert {
        "generated_text",
        "generated_tokens",
        "prompt_token_ids",
        "finish_reason",
        "num_target_calls",
        "accepted_length_histogram",
        "drafter",
        "engine",
    } <= set(shared)
    for request_id in job:
        if request_id == "long":  # an error row either way, each naming the row its own way
            assert "no room to generate" in job["long"]["error"]
            assert "no room to generate" in api["long"][INFERENCE_ERROR]
            continue
        assert job[request_id]["generated_text"] == api[request_id]["generated_text"]
        assert {name: job[request_id][name] for name in shared} == {name: api[request_id][name] for name in shared}


@pytest.mark.slow  # two processor runs, the second resumed (about 45 s): make test-slow
def test_the_processor_resumes_with_its_id_column_and_checkpoint_path(local_ray, tiny_model_dir, tmp_path):
    """id_column and checkpoint_path turn on Ray Data's checkpointing for the input's pipeline: a rerun
    over a grown corpus writes only the ids no earlier run wrote."""
    from pipeline import llm

    inputs = write_jsonl(tmp_path / "in.jsonl", [{"id": f"p{i}", "prompt": f"Count to {i}"} for i in range(4)])
    processor = llm.build_processor(
        llm.vLLMEngineProcessorConfig(
            model_source=str(tiny_model_dir),
            engine="transformers",
            batch_size=2,
            placement_group_config={"bundles": [{"CPU": 0.5}]},
            id_column="id",
            checkpoint_path=str(tmp_path / "checkpoints"),
        ),
        preprocess=lambda row: {"sampling_params": {"temperature": 0, "max_tokens": 3}},
    )
    # Ray's checkpoint filter actor holds a whole CPU: on 2 CPUs the rest must be fractional.
    read = lambda: ray.data.read_json(str(inputs), num_cpus=0.25)  # noqa: E731
    write = lambda dataset, name: dataset.write_parquet(str(tmp_path / name), ray_remote_args={"num_cpus": 0.25})  # noqa: E731
    write(processor(read()), "first")
    write_jsonl(inputs, [{"id": f"p{i}", "prompt": f"Count to {i}"} for i in range(6)])  # the corpus grew
    write(processor(read()), "second")
    assert ray.data.DataContext.get_current().checkpoint_config is None  # the global context untouched
    first, second = outputs.read_run(tmp_path / "first"), outputs.read_run(tmp_path / "second")
    assert sorted(row["id"] for row in first) == ["p0", "p1", "p2", "p3"]
    assert sorted(row["id"] for row in second) == ["p4", "p5"]
    assert all(row["num_generated_tokens"] == 3 for row in first + second)
