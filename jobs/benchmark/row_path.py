"""rows: the job's own cost per row, N short rows on vLLM against vLLM's LLM.generate.

    python -m jobs.benchmark rows --model .cache/test/test-models/tiny-llama-<hash> --rows 200000

Both are given the same raw prompts. The job: `python -m jobs.generate` in a process of its own,
plain decoding (drafting.speculation off), greedy; its rows/s after start-up (the first batch's start
to the last one's end), its seconds to the first batch, its driver's and largest actor's peak memory
and the files it wrote. The baseline: vLLM's LLM.generate in this process, on the engine the job
builds (the same config), every prompt in one call, the chat template applied inside its timer. On a
tiny model the model costs almost nothing: what shows is a row's own cost (reading, templating,
tokenizing, the stage, the statistics, writing).
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

from jobs.benchmark.arguments import add_job_settings, integers
from jobs.benchmark.datasets import encode_prompt
from jobs.benchmark.job_runs import job_command, run_job, write_jsonl
from jobs.benchmark.report import markdown_table
from pipeline.config import ModelConfig, load_config


def add_cli_args(parser) -> None:
    parser.add_argument("--model", default=ModelConfig().name, help="the model (a tiny one shows the job's own cost)")
    parser.add_argument("--rows", type=integers, default=[200_000], help="row counts, comma-separated")
    parser.add_argument("--max-new-tokens", type=int, default=2)
    parser.add_argument("--max-num-seqs", type=int, default=0, help="engine slots in both (0: the default)")
    add_job_settings(parser)
    parser.add_argument("--workdir", default="", help="inputs, outputs and logs (default: a new temporary directory)")
    parser.add_argument("--timeout", type=float, default=7200, help="seconds one job run may take")


def prompts(count: int) -> list[str]:
    return [f"Is item {i} of batch {i % 97} red or blue? Answer in one word." for i in range(count)]


def settings(args) -> list[str]:
    return [
        "engine.name=vllm",
        "drafting.speculation=off",
        f"vllm.max_num_seqs={args.max_num_seqs}",
        f"model.name={json.dumps(args.model)}",
        f"sampling.max_new_tokens={args.max_new_tokens}",
        "sampling.temperature=0",
        "input.limit=0",
        *args.overrides,
    ]


def llm_generate(args, texts: list[str]) -> dict:
    """LLM.generate over every prompt at once on the engine the job builds; rows/s with templating
    and tokenizing inside the timer."""
    from vllm import SamplingParams

    from pipeline.engines import speculation
    from pipeline.engines.build import build_engine, checked_config

    config = checked_config(load_config(None, settings(args)))  # plain: drafting.speculation off
    engine = build_engine(speculation.mode_config(config, speculation.modes(config)[0]))
    llm, params = engine.feeder.llm, SamplingParams(max_tokens=args.max_new_tokens, temperature=0.0)
    started = time.perf_counter()
    requests = [{"prompt_token_ids": encode_prompt(engine.tokenizer, text, str(i))} for i, text in enumerate(texts)]
    outputs = engine.feeder.call(lambda: llm.generate(requests, params, use_tqdm=False))
    seconds = time.perf_counter() - started
    engine.close()
    assert len(outputs) == len(texts)
    return {"rows_per_second": round(len(texts) / seconds, 1), "seconds": round(seconds, 1)}


def job_row(count: int, summary: dict) -> dict:
    run_dir = Path(summary["run_dir"])
    return {
        "rows": count,
        "job_rows_per_second": summary["rows_per_second_after_startup"],
        "rows_written": summary["rows"],
        "errored_rows": summary["errored_rows"],
        "wall_seconds": summary["wall_seconds"],
        "seconds_to_first_batch": summary["seconds_to_first_batch"],
        "driver_peak_rss_mb": summary["driver_peak_rss_mb"],
        "actor_peak_rss_mb": summary["actor_peak_rss_mb"],
        "files_written": len(list(run_dir.rglob("*.parquet"))),
    }


def run(args) -> dict:
    work = Path(args.workdir or tempfile.mkdtemp(prefix="rows-"))
    rows, started = [], time.time()
    for count in args.rows:
        texts = prompts(count)
        source = write_jsonl(work / f"{count}.jsonl", [{"id": i, "prompt": text} for i, text in enumerate(texts)])
        command = job_command(source, work / f"out-{count}", "rows", settings(args))
        row = job_row(count, run_job(command, work / "logs" / f"{count}", args.timeout))
        baseline = llm_generate(args, texts)
        row.update(
            llm_generate_rows_per_second=baseline["rows_per_second"],
            job_over_llm_generate=round(row["job_rows_per_second"] / baseline["rows_per_second"], 3),
        )
        rows.append(row)
        print(json.dumps(row), flush=True)
    return {
        "model": args.model,
        "max_new_tokens": args.max_new_tokens,
        "max_num_seqs": args.max_num_seqs,
        "workdir": str(work),
        "minutes": round((time.time() - started) / 60, 1),
        "runs": rows,
    }


def markdown(report: dict) -> str:
    return markdown_table(report["runs"]) + "\n"
