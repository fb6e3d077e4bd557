"""pipeline: what the Ray job costs over running its stage in-process.

    python -m lab pipeline [--config FILE] --dataset humaneval --limit N

runs the same prompts through the Ray job and through the job's stage in this process, with the
decoder of --config, and compares tokens/s after start-up.
"""

from __future__ import annotations

import json
import tempfile
import time

from jobs.benchmark.arguments import add_prompt_args
from jobs.benchmark.datasets import load_prompts
from jobs.benchmark.report import markdown_table
from pipeline.config import load_config
from pipeline.engines.build import checked_config, engine_kind


def add_cli_args(parser) -> None:
    add_prompt_args(parser, limit=16)
    parser.add_argument(
        "--config", default=None, help="the job's config file: its decoder and engine (default: the defaults)"
    )


def markdown(report: dict) -> str:
    return markdown_table([{key: value for key, value in report.items() if key != "drafting"}])


def run(args) -> dict:
    """Tokens/s of the Ray job (after its actors have started) and of the same stage in-process."""
    import ray

    from pipeline.job import rows as job_rows
    from pipeline.job.ray_job import run_job  # here, as the stage: the replay runs on a GPU machine's host without Ray
    from pipeline.llm.row_values import rows_table
    from pipeline.llm.stage import GenerationStage

    output = tempfile.mkdtemp(prefix="pipeline-benchmark-")
    config = checked_config(
        load_config(
            args.config,
            [  # as the job starts it
                f"model.name={json.dumps(args.model)}",
                f"input.path={json.dumps(args.dataset)}",
                f"input.limit={args.limit}",
                f"sampling.max_new_tokens={args.max_new_tokens}",
                f"job.output={json.dumps(output)}",
                "drafting.speculation=on",
            ],
        )
    )  # the same mode in both
    prompts = load_prompts(args.dataset, args.limit)
    stage = GenerationStage(config, job_rows.stage_settings(config))
    preprocess = job_rows.request_row(config)
    size = engine_kind(config.engine.name).batch_size(config)  # the same batches as the job's actor gets
    started = time.perf_counter()
    tables = []
    for i in range(0, len(prompts), size):  # the job's three steps, in this process
        rows = [preprocess({"id": p.request_id, "prompt": p.prompt}) for p in prompts[i : i + size]]
        tables.append(job_rows.output_table(stage(rows_table(rows))))
    in_process_seconds = time.perf_counter() - started
    in_process_tokens = sum(sum(table.column("num_generated_tokens").to_pylist()) for table in tables)
    del stage
    ray.init()
    summary = run_job(config, "benchmark")
    ray.shutdown()
    in_process = in_process_tokens / in_process_seconds
    pipeline = summary["tokens_per_second_after_startup"]
    return {
        "prompts": len(prompts),
        "drafting": summary["settings"]["drafting"],
        "in_process_tokens_per_second": round(in_process, 3),
        "pipeline_tokens_per_second_after_startup": pipeline,
        "pipeline_tokens_per_second_with_startup": summary["tokens_per_second"],
        "pipeline_overhead": round(in_process / pipeline - 1, 4),
    }
