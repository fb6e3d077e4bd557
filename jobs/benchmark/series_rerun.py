"""series-history --model: a series' rerun through the job itself, after a synthetic history.

    python -m jobs.benchmark series-history --documents 1000000 --runs 30 --edited 10000 \\
        --model .cache/test/test-models/tiny-llama-<hash> --out series_rerun_1m.json

The history (series_history.write_history) is written as the job would have left it: each row
carries the fingerprint the job gives its document's text (a document's text names the run that
last edited it), the series' checkpoint records those fingerprints as each run's writes did, and
the series' store is brought up to the last night (untimed). The rerun then edits --edited
documents at random and runs `python -m jobs.generate` over the whole corpus (Parquet: id, prompt),
in a process of its own with a Ray of its own (job_runs.py). Its wall time holds what a night
costs: planning over the corpus and the history, the actors' start and the store's copy, generating
the edited rows (--max-new-tokens) and the store's update at its end. The rerun must generate
exactly the edited documents.

With --keep-runs K the history's older runs are retired first (`ngrammys retire --keep-runs K`),
and after the rerun every id's latest output is read back: the edited ids' from the rerun, every
other id's text as its last night wrote it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from jobs.benchmark.job_runs import job_command, run_job

SUMMARY_FIELDS = (
    "wall_seconds",
    "seconds_to_first_batch",
    "rows_this_invocation",
    "changed_rows",
    "rows_skipped_already_done",
    "generated_tokens_this_invocation",
    "tokens_per_second_after_startup",
    "driver_peak_rss_mb",
    "actor_peak_rss_mb",
)


def prompt(document: int, version: int) -> str:
    """A document's text as edited last by run `version`."""
    return f"Document {document}, version {version}: the quarterly note of team {document % 97}."


def job_settings(args, series: str) -> list[str]:
    return [
        f"engine.name={args.engine}",
        f"model.name={json.dumps(args.model)}",
        f"sampling.max_new_tokens={args.max_new_tokens}",
        "input.limit=0",
        f"job.series={series}",
        f"job.store_tokens={args.store_tokens}",
        *args.overrides,
    ]


class JobHistory:
    """What the job's runs would have recorded: the rows' fingerprints, under the rerun's settings."""

    def __init__(self, args, work: Path, series: str):
        from pipeline.config import load_config
        from pipeline.job.run import RunPaths
        from pipeline.job.series import settings_fingerprint

        self.config = load_config(overrides=[*job_settings(args, series), f"job.output={work}"])
        self.settings = settings_fingerprint(self.config)
        self.paths = RunPaths.of(self.config, "rerun")
        self.versions = None

    def at(self, versions: np.ndarray) -> JobHistory:
        """The history with the documents' texts at `versions` (each document's last edit)."""
        self.versions = versions
        return self

    def fingerprints(self, ids: np.ndarray) -> list[str]:
        from pipeline.job.series import row_fingerprint

        texts = (prompt(int(i), int(self.versions[i])) for i in ids)
        return [row_fingerprint(self.config, self.settings, {"id": int(i), "prompt": t}) for i, t in zip(ids, texts)]

    def record(self, fingerprints: pa.ChunkedArray, name: str) -> None:
        """A run's write, as Ray Data's checkpoint records it (a Parquet file of the written keys)."""
        path = Path(self.paths.checkpoints) / f"{name}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({"fingerprint": fingerprints}), path)


def timed(args, work: Path, series: str, write_history) -> dict:
    """The history written by `write_history` (series_history's, for the job), then the rerun."""
    from pipeline.job.series_store import extend_store

    job = JobHistory(args, work, series)
    started = time.perf_counter()
    history, versions = write_history(args, Path(job.paths.runs_root), job)
    store = extend_store._function(job.config, job.paths)  # as the last night left it
    retired = retire(job.paths, args.keep_runs).as_dict() if args.keep_runs else None
    setup_seconds = time.perf_counter() - started
    edited = np.sort(np.random.default_rng(args.seed + 2).choice(args.documents, size=args.edited, replace=False))
    versions[edited] = args.runs
    corpus = work / "corpus.parquet"
    texts = [prompt(i, int(version)) for i, version in enumerate(versions)]
    pq.write_table(pa.table({"id": np.arange(args.documents), "prompt": texts}), corpus, row_group_size=65536)
    command = job_command(corpus, work, "rerun", job_settings(args, series))
    summary = run_job(command, work / "logs" / "rerun", args.timeout)
    files = sorted(Path(job.paths.run_dir).glob("*.parquet"))
    generated = [key for path in files for key in pq.read_table(path, columns=["id"])["id"].to_pylist()]
    latest = latest_outputs(args, job, versions, edited) if args.keep_runs else None
    return {
        "documents": args.documents,
        "runs": args.runs,
        "edited": args.edited,
        "answer_tokens": args.answer_tokens,
        "model": args.model,
        "engine": args.engine,
        "max_new_tokens": args.max_new_tokens,
        "setup_seconds": round(setup_seconds, 1),
        "store_before": {key: store[key] for key in ("documents", "live_tokens", "tokens", "segments")},
        "rerun": {key: summary.get(key) for key in SUMMARY_FIELDS},
        "store_after": {key: (summary["series_store"] or {}).get(key) for key in ("documents", "tokens", "segments")},
        "generated_exactly_the_edited": sorted(int(i) for i in generated) == edited.tolist(),
        "retired": retired and {key: len(value) for key, value in retired.items() if isinstance(value, list)},
        "latest_outputs": latest,
        "history": [{**h, "seconds": round(h["seconds"], 2)} for h in history],
    }


def retire(paths, keep_runs: int):
    from pipeline.job.series_retire import retire as retire_runs

    return retire_runs(paths, keep_runs)


def latest_outputs(args, job: JobHistory, versions: np.ndarray, edited: np.ndarray) -> dict:
    """Every id's latest output read back after the rerun: an edited id's is the rerun's, every other
    id's text the one its last night wrote (series_history.answers)."""
    from pipeline.job.series import kept_latest, last_texts, output_files

    root = job.paths.runs_root
    index = kept_latest(root, job.paths.outputs_index, output_files(root))
    texts = last_texts([str(i) for i in range(args.documents)], index, root)
    rerun = set(edited.tolist())
    return {
        "ids": len(index),
        "readable": all(text is not None for text in texts),
        "unedited_as_written": all(
            f"answer {i} of run {versions[i]} " in texts[i] for i in range(args.documents) if i not in rerun
        ),
    }


def markdown(report: dict) -> str:
    r = report["rerun"]
    return (
        "| documents | runs | edited | rerun wall (s) | to first batch (s) | rows generated | changed rows "
        "| driver peak (MB) | exactly the edited |\n|---|---|---|---|---|---|---|---|---|\n"
        f"| {report['documents']:,} | {report['runs']} | {report['edited']:,} | {r['wall_seconds']:.1f} | "
        f"{r['seconds_to_first_batch']} | {r['rows_this_invocation']:,} | {r['changed_rows']:,} | "
        f"{r['driver_peak_rss_mb']:,.0f} | {report['generated_exactly_the_edited']} |\n"
    )
