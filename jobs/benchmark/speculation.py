"""speculation: the job in engine.speculation auto, on and off, side by side on the same rows.

    python -m jobs.benchmark speculation --dataset gsm8k --limit 600 --max-new-tokens 128 --batch 16 --rounds 2

Each run is `python -m jobs.generate` in a process of its own, with a Ray of its own, over the same
JSONL input (id, prompt) at engine.max_num_seqs B, one actor: `auto` (the default: it chooses the
mode, and measures where its rule leaves the answer open and the work pays for it), `on` (the
drafter throughout: ours forced on) and `off` (plain throughout). The modes take turns, in an order
reversed each round (auto, on, off, then off, on, auto), so that the machine's drift falls on each
alike. Reported: each run's tokens/s after start-up and what auto did (each actor's drafter, how
it was decided, its switches and their restart seconds); per mode the median over rounds; auto
against off and against on, per round and of the medians; and the rows identical across the
three modes (generated_tokens by id).
"""
from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path

from jobs.benchmark.arguments import add_prompt_args
from jobs.benchmark.job_runs import generated_by_id, job_command, run_job, write_jsonl
from jobs.benchmark.report import markdown_table

MODES = ("auto", "on", "off")


def add_cli_args(parser) -> None:
    add_prompt_args(parser, limit=64, max_new_tokens=128)
    parser.add_argument("--batch", type=int, default=16, help="engine.max_num_seqs of every run")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each mode, taking turns")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="a job setting for every run (as python -m jobs.generate --set)")
    parser.add_argument("--workdir", default="", help="where the input, outputs and logs go (default: a new temporary directory)")
    parser.add_argument("--timeout", type=float, default=7200, help="seconds one job run may take")


def run_row(mode: str, number: int, summary: dict) -> dict:
    """A run's line: its speed, and what its actors ran and why."""
    actors = list((summary.get("speculation") or {}).get("actors", {}).values())
    return {"round": number, "mode": mode, "tokens_per_second": summary["tokens_per_second_after_startup"],
            "tokens_per_call": summary["mean_tokens_per_call"], "rows": summary["rows"],
            "errored_rows": summary["errored_rows"], "wall_seconds": summary["wall_seconds"],
            "drafter": ",".join(a["drafter"] for a in actors), "decided_by": ",".join(a["decided_by"] for a in actors),
            "switches": sum(len(a["switches"]) for a in actors),
            "restart_seconds": round(sum(s.get("restart_seconds", 0) for a in actors for s in a["switches"]), 2),
            "windows": "; ".join(f"{w['drafter']} {w['tokens_per_second']}" for a in actors for w in a["windows"][:8])}


def run(args) -> dict:
    from jobs.benchmark.datasets import load_prompts

    work = Path(args.workdir or tempfile.mkdtemp(prefix="speculation-"))
    prompts = load_prompts(args.dataset, args.limit)
    source = write_jsonl(work / "input.jsonl", [{"id": p.request_id, "prompt": p.prompt} for p in prompts])
    base = ["engine.name=vllm", f"model.name={json.dumps(args.model)}", f"decoder.max_new_tokens={args.max_new_tokens}",
            f"engine.max_num_seqs={args.batch}", *args.overrides]
    runs, tokens, started = [], {mode: [] for mode in MODES}, time.time()
    for number in range(1, args.rounds + 1):
        for mode in MODES if number % 2 else MODES[::-1]:
            print(f"[round {number}] {mode}", flush=True)
            name = f"{mode}-{number}"
            summary = run_job(job_command(source, work / name, "r", [*base, f"engine.speculation={mode}"]),
                              work / "logs" / name, args.timeout)
            runs.append(run_row(mode, number, summary))
            tokens[mode].append(generated_by_id(summary["run_dir"]))
            (work / "runs.json").write_text(json.dumps(runs, indent=1) + "\n")  # the runs so far, should a later one fail
    return {"dataset": args.dataset, "prompts": len(prompts), "batch": args.batch, "max_new_tokens": args.max_new_tokens,
            "model": args.model, "overrides": args.overrides, "workdir": str(work),
            "minutes": round((time.time() - started) / 60, 1), "runs": runs, "modes": mode_rows(runs),
            "identical_rows": identical(tokens)}


def mode_rows(runs: list[dict]) -> list[dict]:
    """Per mode: the median tokens/s over rounds, and auto's against off's and on's (per round, in brackets)."""
    speed = {mode: [r["tokens_per_second"] for r in runs if r["mode"] == mode] for mode in MODES}
    median = {mode: statistics.median(values) for mode, values in speed.items()}
    rows = []
    for mode in MODES:
        row = {"mode": mode, "tokens_per_second": round(median[mode], 2), "rounds": speed[mode]}
        if mode == "auto":
            for other in ("off", "on"):
                row[f"vs_{other}"] = round(median["auto"] / median[other], 3)
                row[f"vs_{other}_by_round"] = [round(a / b, 3) for a, b in zip(speed["auto"], speed[other])]
        rows.append(row)
    return rows


def identical(tokens: dict[str, list[dict]]) -> str:
    """Rows whose generated tokens are the same in every run of every mode, of the ids in off's first run."""
    reference = tokens["off"][0]
    runs = [run for mode in MODES for run in tokens[mode]]
    same = sum(all(list(run.get(key) or []) == list(ids or []) for run in runs) for key, ids in reference.items())
    return f"{same}/{len(reference)}"


def markdown(report: dict) -> str:
    return (markdown_table(report["runs"]) + "\n\n" + markdown_table(report["modes"])
            + f"\n\nrows identical across every run: {report['identical_rows']}")
