"""speculation: the job in drafting.speculation auto, on and off (or vLLM's own methods), side by side on the same rows.

    python -m jobs.benchmark speculation --dataset sharegpt.jsonl --limit 1600 --max-new-tokens 128 --batch 32 \
        --rounds 2 --set sampling.temperature=1.0
    python -m jobs.benchmark speculation --dataset humaneval --limit 40 --batch 16 --methods on,off,vllm_suffix \
        --set sampling.n=8 --set sampling.temperature=0.8

Each run is `python -m jobs.generate` in a process of its own, with a Ray of its own, over the same
JSONL input (id, prompt) at vllm.max_num_seqs B, one actor. The methods (METHODS): `auto` (the
default: it chooses the mode, and measures where its rule leaves the answer open and the work pays
for it), `on` (our drafter throughout), `off` (plain throughout), `vllm_suffix` and `vllm_ngram`
(vLLM's own, throughout). They take turns, in an order reversed each round (auto, on, off, then
off, on, auto), so that the machine's drift falls on each alike. Reported: each run's tokens/s
after start-up and what auto did (each actor's drafter, how it was decided, its switches and their
restart seconds); per method the median over rounds; the first method against each other, per round
and of the medians; and the rows identical across every run (generated_tokens by id and sample).
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path

from jobs.benchmark.arguments import add_job_settings, add_prompt_args
from jobs.benchmark.job_runs import generated_by_id, job_command, run_job, write_jsonl
from jobs.benchmark.report import markdown_table

# method -> its settings
METHODS = {
    "auto": ["drafting.speculation=auto"],
    "on": ["drafting.speculation=on"],
    "off": ["drafting.speculation=off"],
    "vllm_suffix": ["drafting.drafter=vllm_suffix", "drafting.speculation=on"],
    "vllm_ngram": ["drafting.drafter=vllm_ngram", "drafting.w=5", "drafting.speculation=on"],
}


def methods(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in METHODS]
    if unknown or len(names) < 2:
        raise ValueError(f"{text!r}: two or more of {', '.join(METHODS)}")
    return names


def add_cli_args(parser) -> None:
    add_prompt_args(parser, limit=64, max_new_tokens=128)
    parser.add_argument("--batch", type=int, default=16, help="vllm.max_num_seqs of every run")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each method, taking turns")
    parser.add_argument(
        "--methods",
        type=methods,
        default=["auto", "on", "off"],
        help=f"comma-separated, the first compared with each other: {', '.join(METHODS)}",
    )
    add_job_settings(parser)
    parser.add_argument(
        "--workdir", default="", help="where the input, outputs and logs go (default: a new temporary directory)"
    )
    parser.add_argument("--timeout", type=float, default=7200, help="seconds one job run may take")


def run_row(mode: str, number: int, summary: dict) -> dict:
    """A run's line: its speed, and what its actors ran and why."""
    actors = list((summary.get("speculation") or {}).get("actors", {}).values())
    return {
        "round": number,
        "mode": mode,
        "tokens_per_second": summary["tokens_per_second_after_startup"],
        "tokens_per_call": summary["tokens_per_call"],
        "rows": summary["rows"],
        "errored_rows": summary["errored_rows"],
        "wall_seconds": summary["wall_seconds"],
        "drafter": ",".join(a["drafter"] for a in actors),
        "decided_by": ",".join(a["decided_by"] for a in actors),
        "switches": sum(len(a["switches"]) for a in actors),
        "restart_seconds": round(sum(s.get("restart_seconds", 0) for a in actors for s in a["switches"]), 2),
        "windows": "; ".join(f"{w['drafter']} {w['tokens_per_second']}" for a in actors for w in a["windows"][:8]),
    }


def run(args) -> dict:
    from jobs.benchmark.datasets import load_prompts

    work = Path(args.workdir or tempfile.mkdtemp(prefix="speculation-"))
    prompts = load_prompts(args.dataset, args.limit)
    source = write_jsonl(work / "input.jsonl", [{"id": p.request_id, "prompt": p.prompt} for p in prompts])
    base = [
        "engine.name=vllm",
        f"model.name={json.dumps(args.model)}",
        f"sampling.max_new_tokens={args.max_new_tokens}",
        f"vllm.max_num_seqs={args.batch}",
        *args.overrides,
    ]
    runs, tokens, started = [], {method: [] for method in args.methods}, time.time()
    for number in range(1, args.rounds + 1):
        for method in args.methods if number % 2 else args.methods[::-1]:
            print(f"[round {number}] {method}", flush=True)
            name = f"{method}-{number}"
            summary = run_job(
                job_command(source, work / name, "r", [*base, *METHODS[method]]), work / "logs" / name, args.timeout
            )
            runs.append(run_row(method, number, summary))
            tokens[method].append(generated_by_id(summary["run_dir"]))
            (work / "runs.json").write_text(
                json.dumps(runs, indent=1) + "\n"
            )  # the runs so far, should a later one fail
    return {
        "dataset": args.dataset,
        "prompts": len(prompts),
        "batch": args.batch,
        "max_new_tokens": args.max_new_tokens,
        "model": args.model,
        "overrides": args.overrides,
        "workdir": str(work),
        "minutes": round((time.time() - started) / 60, 1),
        "runs": runs,
        "methods": method_rows(runs, args.methods),
        "identical_rows": identical(tokens),
    }


def method_rows(runs: list[dict], names: list[str]) -> list[dict]:
    """Per method: the median tokens/s over rounds; the first method's against each other's (per round too)."""
    speed = {name: [r["tokens_per_second"] for r in runs if r["mode"] == name] for name in names}
    median = {name: statistics.median(values) for name, values in speed.items()}
    first, rows = names[0], []
    for name in names:
        row = {"method": name, "tokens_per_second": round(median[name], 2), "rounds": speed[name]}
        if name == first:
            for other in names[1:]:
                row[f"vs_{other}"] = round(median[first] / median[other], 3)
                row[f"vs_{other}_by_round"] = [round(a / b, 3) for a, b in zip(speed[first], speed[other])]
        rows.append(row)
    return rows


def identical(tokens: dict[str, list[dict]]) -> str:
    """Rows (by id and sample) whose generated tokens are the same in every run, of those in the last method's first
    run."""
    reference = list(tokens.values())[-1][0]
    runs = [run for method_runs in tokens.values() for run in method_runs]
    same = sum(all(list(run.get(key) or []) == list(ids or []) for run in runs) for key, ids in reference.items())
    return f"{same}/{len(reference)}"


def markdown(report: dict) -> str:
    return (
        markdown_table(report["runs"])
        + "\n\n"
        + markdown_table(report["methods"])
        + f"\n\nrows identical across every run: {report['identical_rows']}"
    )
