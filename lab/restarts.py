"""restarts: an engine that fails mid-run is closed and built again in place (pipeline/llm/stage.py).

    python -m lab restarts --limit 64 --max-new-tokens 32 --failures 3

The job's stage on the vLLM engine, in this process, generates the prompts once as they are, then
`--failures` times more with its engine's step raising part-way (at half the clean pass's steps):
each pass's wall time against the clean pass's and against one engine start, the process's
resident memory after it (a failed engine's weights and KV cache given back, none leaked per
restart), and whether its rows are the clean pass's, token for token.
"""

from __future__ import annotations

import time
from pathlib import Path

from jobs.benchmark.arguments import add_prompt_args
from jobs.benchmark.report import markdown_table

INJECTED = "restarts benchmark: an engine step failed"


def add_cli_args(parser) -> None:
    add_prompt_args(parser, limit=64, max_new_tokens=32)
    parser.add_argument("--failures", type=int, default=3, help="passes whose engine fails once")


def resident_mb() -> float:
    """The process's resident memory now (Linux's /proc; the peak would hide a leak's growth)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    raise RuntimeError("no VmRSS in /proc/self/status")


def fail_at(steps: dict) -> None:
    """Makes vLLM's engine step raise once, at the `steps["at"]`-th step from now."""
    from vllm.v1.engine.llm_engine import LLMEngine

    original = LLMEngine.step

    def step(self):
        steps["count"] += 1
        if steps["count"] == steps["at"]:
            raise RuntimeError(INJECTED)
        return original(self)

    LLMEngine.step = step


def run(args) -> dict:
    from jobs.benchmark.datasets import load_prompts
    from pipeline.job import rows as job_rows
    from pipeline.config import load_config
    from pipeline.llm.row_values import rows_table
    from pipeline.llm.stage import GenerationStage

    config = load_config(
        overrides=[
            "engine.name=vllm",
            f"model.name={args.model}",
            "vllm.cpu_kv_cache_gib=1",
            f"sampling.max_new_tokens={args.max_new_tokens}",
            "drafting.speculation=on",
        ]
    )
    steps = {"count": 0, "at": 0}
    fail_at(steps)
    started = time.perf_counter()
    stage = GenerationStage(config, job_rows.stage_settings(config))
    engine_start = time.perf_counter() - started
    convert = job_rows.request_row(config)
    rows = [{"id": p.request_id, "prompt": p.prompt} for p in load_prompts(args.dataset, args.limit)]
    batch = rows_table([{**row, **convert(row)} for row in rows])
    passes, clean, clean_steps = [], None, 0
    for number in range(args.failures + 1):
        steps.update(count=0, at=0 if number == 0 else clean_steps // 2)
        began = time.perf_counter()
        out = job_rows.output_table(stage(batch)).to_pylist()
        seconds = time.perf_counter() - began
        tokens = [row["generated_tokens"] for row in out]
        if number == 0:
            clean, clean_steps = tokens, steps["count"]
        passes.append(
            {
                "pass": "clean" if number == 0 else f"failure {number}",
                "seconds": round(seconds, 2),
                "extra_seconds": round(seconds - passes[0]["seconds"], 2) if passes else 0.0,
                "restarts": stage.restarts.total,
                "resident_mb": resident_mb(),
                "rows_as_clean": sum(a == b for a, b in zip(tokens, clean)),
                "errors": sum(row["error"] is not None for row in out),
            }
        )
    stage.engine.close()
    first = passes[1]["resident_mb"] if len(passes) > 1 else None
    return {
        "model": args.model,
        "dataset": args.dataset,
        "rows": len(rows),
        "max_new_tokens": args.max_new_tokens,
        "engine_start_seconds": round(engine_start, 2),
        "clean_steps": clean_steps,
        "passes": passes,
        "resident_growth_after_first_restart": round(passes[-1]["resident_mb"] / first - 1, 4) if first else None,
    }


def markdown(report: dict) -> str:
    growth = report["resident_growth_after_first_restart"]
    return (
        f"engine start {report['engine_start_seconds']} s; resident memory after the last restart against "
        f"after the first: {'n/a' if growth is None else f'{growth:+.2%}'}\n\n"
        + markdown_table(
            report["passes"],
            {
                "pass": "pass",
                "seconds": "seconds",
                "extra_seconds": "over clean",
                "restarts": "restarts so far",
                "resident_mb": "resident MB",
                "rows_as_clean": "rows = clean's",
                "errors": "error rows",
            },
        )
    )
