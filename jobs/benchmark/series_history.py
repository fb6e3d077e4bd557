"""series-history: what a series' rerun costs to plan after a long history, without a model.

    python -m jobs.benchmark series-history --documents 1000000 --runs 30 --edited 10000 \
        --answer-tokens 128 --work-dir /tmp/history --out series_history.json

It writes a synthetic history in the job's own output format (<work-dir>/series=history/run=<n>/:
the first run every document in --files-per-run files, each later run --edited documents of them,
chosen at random, in one file; answers of --answer-tokens tokens), keeps the series' index of last
outputs as each night's run would (pipeline/job/series_index.py, untimed), then times the rerun's
parts that grow with the corpus or the history, in one process:
- `planning`: listing the series' output files and bringing the kept index up to the rerun's
  outputs (the next night's start), then the last outputs of the edited ids (their texts, read from
  the row groups that hold them);
- `index_rebuild`: the same index built from every file, as before the index was kept (what each run
  paid);
- the process's peak memory (the driver's, where the job plans).
- with --store, the series' store (pipeline/job/series_store.py, at most --store-tokens tokens): its
  update with the rerun's outputs (the store kept from the history, untimed), against a store built
  from every file (what each run paid before the store kept one output per id).
- with --model, the rerun runs through the job itself instead (jobs/benchmark/series_rerun.py):
  wall time, time to the first batch, the driver's peak, and whether exactly the edited documents
  were generated.
"""

from __future__ import annotations

import resource
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from jobs.benchmark import series_rerun
from jobs.benchmark.arguments import add_job_settings

SERIES = "history"
ROW_GROUP = 64  # rows per row group as the job writes its outputs: a group per batch (ray.batch_size: 64 here)


def add_cli_args(parser) -> None:
    parser.add_argument("--documents", type=int, default=100_000, help="documents in the corpus")
    parser.add_argument("--runs", type=int, default=3, help="runs of history before the rerun")
    parser.add_argument("--edited", type=int, default=10_000, help="documents edited each run, and in the rerun")
    parser.add_argument("--answer-tokens", type=int, default=128, help="tokens per answer")
    parser.add_argument("--files-per-run", type=int, default=16, help="files of the first run (a run's many writers)")
    parser.add_argument(
        "--work-dir",
        default="",
        help="where the history is written (removed first; default: a temporary one, removed after)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--store", action="store_true", help="time the series' store's update too")
    parser.add_argument("--store-tokens", type=int, default=1 << 26, help="job.store_tokens")
    parser.add_argument(
        "--model", default="", help="rerun through the job with this model (jobs/benchmark/series_rerun.py)"
    )
    parser.add_argument("--engine", default="vllm", help="the rerun's engine.name")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="the rerun's sampling.max_new_tokens")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds the rerun may take")
    parser.add_argument(
        "--keep-runs", type=int, default=0, help="with --model: retire all but the newest K runs before the rerun"
    )
    add_job_settings(parser)


def answers(ids: np.ndarray, tokens: int, run: int, rng: np.random.Generator, job=None) -> pa.Table:
    """The job's output rows for `ids` (the columns a series reads, and answers of `tokens` tokens);
    with `job` (series_rerun.JobHistory) its model's, and the fingerprints it gives them."""
    count = len(ids)
    flat = rng.integers(0, 49152, size=count * tokens, dtype=np.int32)
    offsets = np.arange(0, count * tokens + 1, tokens, dtype=np.int32)
    texts = pa.array([f"answer {i} of run {run} " * (tokens // 6) for i in ids])
    return pa.table(
        {
            "id": pa.array(ids.astype(str)),
            "fingerprint": pa.array(job.fingerprints(ids) if job else [f"{i}:{run}" for i in ids]),
            "generated_text": texts,
            "generated_tokens": pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat)),
            "error": pa.nulls(count, pa.string()),
            "model": pa.array([job.config.model.name if job else "synthetic"] * count),
        }
    )


def write_history(args, root: Path, job=None) -> tuple[list[dict], np.ndarray]:
    """The first run and args.runs - 1 nightly runs; the kept index brought up to each, as each
    night's run does. With `job` (series_rerun.JobHistory), the rows carry the job's fingerprints of
    the documents' texts and the series' checkpoint records them. Returns each run's write time, and
    each document's version (the run that last edited it)."""
    from pipeline.job.series import kept_latest, output_files

    rng = np.random.default_rng(args.seed)
    written, versions = [], np.zeros(args.documents, dtype=np.int32)
    for run in range(args.runs):
        started = time.perf_counter()
        if run == 0:
            parts = np.array_split(np.arange(args.documents), args.files_per_run)
        else:
            parts = [np.sort(rng.choice(args.documents, size=args.edited, replace=False))]
        for part, ids in enumerate(parts):
            versions[ids] = run
            path = root / f"run={run:04d}" / f"part-{part:04d}.parquet"
            path.parent.mkdir(parents=True, exist_ok=True)
            table = answers(ids, args.answer_tokens, run, rng, job and job.at(versions))
            pq.write_table(table, path, row_group_size=ROW_GROUP)
            if job:
                job.record(table["fingerprint"], f"run-{run:04d}-{part:04d}")
        kept_latest(str(root), index_path(root), output_files(str(root)))
        written.append({"run": run, "rows": int(sum(len(p) for p in parts)), "seconds": time.perf_counter() - started})
    return written, versions


def index_path(root: Path) -> str:
    return str(root.parent / "_checkpoints" / f"series={SERIES}" / "outputs" / "index.parquet")


def run(args) -> dict:
    measure = (
        (lambda work: series_rerun.timed(args, work, SERIES, write_history))
        if args.model
        else (lambda work: timed(args, work))
    )
    if args.work_dir:
        shutil.rmtree(args.work_dir, ignore_errors=True)
        return measure(Path(args.work_dir))
    with tempfile.TemporaryDirectory(prefix="series-history-") as work:
        return measure(Path(work))


def timed(args, work: Path) -> dict:
    from pipeline.job.series import kept_latest, last_texts, output_files

    root = work / f"series={SERIES}"
    started = time.perf_counter()
    history, _ = write_history(args, root)
    write_seconds = time.perf_counter() - started
    rng = np.random.default_rng(args.seed + 1)
    edited = np.sort(rng.choice(args.documents, size=args.edited, replace=False))
    keys = [str(i) for i in edited]
    # The rerun: its outputs written, the next night's start brings the kept index up to them.
    rerun = root / f"run={args.runs:04d}" / "part-0000.parquet"
    rerun.parent.mkdir(parents=True)
    pq.write_table(answers(edited, args.answer_tokens, args.runs, rng), rerun, row_group_size=ROW_GROUP)
    timings = {}
    started = time.perf_counter()
    written = output_files(str(root))
    timings["list_files"] = time.perf_counter() - started
    latest = kept_latest(str(root), index_path(root), written)
    timings["index_update"] = time.perf_counter() - started - timings["list_files"]
    texts = last_texts(keys, latest, str(root))
    timings["planning"] = time.perf_counter() - started
    timings["last_texts"] = timings["planning"] - timings["index_update"] - timings["list_files"]
    started = time.perf_counter()
    rebuilt = kept_latest(str(root), str(work / "rebuilt-index.parquet"), written)
    timings["index_rebuild"] = time.perf_counter() - started
    assert last_texts(keys, rebuilt, str(root)) == texts  # the kept index says what a rebuilt one does
    assert all(text is not None and f"of run {args.runs} " in text for text in texts)
    store = timed_store(args, work, rerun) if args.store else None
    return {
        "store": store,
        "documents": args.documents,
        "runs": args.runs,
        "edited": args.edited,
        "answer_tokens": args.answer_tokens,
        "files": len(written),
        "history_write_seconds": round(write_seconds, 1),
        "seconds": {name: round(value, 3) for name, value in timings.items()},
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "history": [{**h, "seconds": round(h["seconds"], 2)} for h in history],
    }


def timed_store(args, work: Path, rerun: Path) -> dict:
    """The store kept from the history (the rerun's file set aside meanwhile), then its update with the
    rerun's outputs, and a store built from every file, timed."""
    from pipeline.config import load_config
    from pipeline.job.run import RunPaths
    from pipeline.job.series_store import extend_store

    extend = extend_store._function  # the Ray task's body, in this process
    config = load_config(
        overrides=[
            "model.name=synthetic",
            f"job.output={work}",
            f"job.series={SERIES}",
            f"job.store_tokens={args.store_tokens}",
        ]
    )
    paths = RunPaths.of(config, "rerun")
    aside = work / "rerun.parquet"
    rerun.rename(aside)
    kept = extend(config, paths)
    aside.rename(rerun)
    started = time.perf_counter()
    updated = extend(config, paths)
    update_seconds = time.perf_counter() - started
    fresh = RunPaths(paths.output, "rerun", f"{SERIES}-fresh", "synthetic")
    (work / f"series={SERIES}-fresh").symlink_to(work / f"series={SERIES}")
    started = time.perf_counter()
    built = extend(config, fresh)
    build_seconds = time.perf_counter() - started
    if not (kept.get("dropped_documents") or updated.get("dropped_documents") or built.get("dropped_documents")):
        assert built["documents"] == updated["documents"]  # one live output per id either way
    sizes = ("documents", "live_tokens", "tokens", "segments")
    return {
        "store_tokens": args.store_tokens,
        "kept_from_history": {key: kept[key] for key in sizes},
        "updated": {key: value for key, value in updated.items() if key not in ("path", "runs")},
        "built_from_every_file": {key: value for key, value in built.items() if key not in ("path", "runs")},
        "update_seconds": round(update_seconds, 2),
        "full_build_seconds": round(build_seconds, 2),
    }


def markdown(report: dict) -> str:
    if "rerun" in report:
        return series_rerun.markdown(report)
    s = report["seconds"]
    return (
        "| documents | runs | edited | files | planning (s) | of it: list | index update | last texts "
        "| index rebuilt from every file (s) | peak RSS (MB) |\n|---|---|---|---|---|---|---|---|---|---|\n"
        f"| {report['documents']:,} | {report['runs']} | {report['edited']:,} | {report['files']} | "
        f"{s['planning']:.2f} | {s['list_files']:.2f} | {s['index_update']:.2f} | {s['last_texts']:.2f} | "
        f"{s['index_rebuild']:.2f} | {report['peak_rss_mb']:,.0f} |\n"
    )
