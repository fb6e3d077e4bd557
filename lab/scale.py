"""scale: a series over a corpus of N documents, run once, then again with a few documents edited.

    python -m lab scale --model .cache/test/test-models/tiny-llama-<hash> --documents 2000,20000 \
        --edited 20 --max-new-tokens 4

Each run is `python -m jobs.generate` in a process of its own, with a Ray of its own (job_runs.py),
on the transformers engine (by default: on a tiny model the model costs almost nothing, so the job's
own cost shows). Per corpus size: the first run's and the rerun's wall seconds, seconds before the
first batch, rows generated and the driver's peak memory; the rerun must generate exactly the edited
documents. What a nightly run costs should grow with what changed, not with the corpus.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

from jobs.benchmark.arguments import add_job_settings, integers
from jobs.benchmark.job_runs import job_command, run_job, write_jsonl
from jobs.benchmark.report import markdown_table
from pipeline.config import ModelConfig


def add_cli_args(parser) -> None:
    parser.add_argument("--model", default=ModelConfig().name, help="the model (a tiny one shows the job's own cost)")
    parser.add_argument("--documents", type=integers, default=[2000, 20000], help="corpus sizes, comma-separated")
    parser.add_argument(
        "--edited", type=edited_count, default=20, help="documents edited before the rerun: a count, or a share (1%%)"
    )
    parser.add_argument("--max-new-tokens", type=int, default=4)
    parser.add_argument("--engine", default="transformers")
    add_job_settings(parser)
    parser.add_argument(
        "--workdir", default="", help="where corpora, outputs and logs go (default: a new temporary one)"
    )
    parser.add_argument("--timeout", type=float, default=3600, help="seconds one job run may take")


def edited_count(text: str):
    """`--edited`: a count of documents (20), or a share of each corpus (1%)."""
    if text.endswith("%"):
        share = float(text[:-1]) / 100
        if not 0 < share <= 1:
            raise ValueError(f"--edited {text}: a share between 0 and 100 %")
        return share
    return int(text)


def edited_documents(documents: int, edited: int | float) -> set[int]:
    """Which documents the rerun edits: `edited` of them (a count, or a share of the corpus), spread
    evenly over it."""
    count = round(documents * edited) if isinstance(edited, float) else edited
    return set(sorted(range(0, documents, max(1, documents // max(count, 1))))[:count])


def corpus(documents: int, edited: set[int]) -> list[dict]:
    return [
        {"id": i, "prompt": f"Document {i}: the quarterly note of team {i % 97}." + " (edited)" * (i in edited)}
        for i in range(documents)
    ]


def run_row(documents: int, run: str, summary: dict) -> dict:
    return {
        "documents": documents,
        "run": run,
        "rows_generated": summary["rows_this_invocation"],
        "changed_rows": summary.get("changed_rows", 0),
        "wall_seconds": summary["wall_seconds"],
        "seconds_to_first_batch": summary["seconds_to_first_batch"],
        "driver_peak_rss_mb": summary["driver_peak_rss_mb"],
    }


def run(args) -> dict:
    work = Path(args.workdir or tempfile.mkdtemp(prefix="scale-"))
    settings = [
        f"engine.name={args.engine}",
        f"model.name={json.dumps(args.model)}",
        f"sampling.max_new_tokens={args.max_new_tokens}",
        "input.limit=0",
        "job.series=scale",
        *args.overrides,
    ]
    rows, started = [], time.time()
    for documents in args.documents:
        edited = edited_documents(documents, args.edited)
        for run_id, changed in (("first", set()), ("rerun", edited)):
            source = write_jsonl(work / f"{documents}" / f"{run_id}.jsonl", corpus(documents, changed))
            output = work / f"{documents}" / "out"
            summary = run_job(
                job_command(source, output, run_id, settings), work / "logs" / f"{documents}-{run_id}", args.timeout
            )
            rows.append(run_row(documents, run_id, summary))
            print(json.dumps(rows[-1]), flush=True)
    reruns = [row for row in rows if row["run"] == "rerun"]
    return {
        "model": args.model,
        "engine": args.engine,
        "edited": args.edited,
        "max_new_tokens": args.max_new_tokens,
        "workdir": str(work),
        "minutes": round((time.time() - started) / 60, 1),
        "runs": rows,
        "rerun_wall_ratio_largest_to_smallest": round(reruns[-1]["wall_seconds"] / reruns[0]["wall_seconds"], 3),
        "reruns_generated_exactly_the_edited": all(
            row["rows_generated"] == len(edited_documents(row["documents"], args.edited)) for row in reruns
        ),
    }


def markdown(report: dict) -> str:
    return markdown_table(report["runs"]) + (
        f"\n\nRerun wall time, largest corpus over smallest: {report['rerun_wall_ratio_largest_to_smallest']}x; "
        f"reruns generated exactly the edited documents: {report['reruns_generated_exactly_the_edited']}\n"
    )
