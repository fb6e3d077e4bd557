"""series-edits: a series' edited rerun through the job, against fresh runs of vLLM's suffix and plain vLLM.

    python -m jobs.benchmark series-edits --dataset corpus-rewrite-code --limit 16 --max-new-tokens 128 \\
        --cells line:1,line:16,field:1,field:16,paragraph:1,paragraph:16

Measured as users run it: every run is `python -m jobs.generate` in a process of its own, which
starts its own Ray (a new temporary directory each, so it never joins another Ray on the machine),
reads a JSONL input (id + prompt) and writes Parquet and summary.json. For each cell (an edit kind
of `edit`, and B):

1. the corpus is written and a series (`job.series`, the default drafter) generates it: its first
   run, at the largest B of the cells (B changes no greedy text; these are the rows' last outputs);
2. every document edited, the series runs again at B: each row changed, drafted from its last
   output (its `prediction`) and the series' store (method `ours`);
3. fresh runs (no series, output directories of their own) of plain vLLM (`drafting.drafter=none`)
   and vLLM's suffix decoding (`drafting.drafter=vllm_suffix`, arctic-inference) on the edited corpus at B.

`--ours NAME:SECTION.KEY=VALUE[,...]` adds a run of ours with other settings (method `ours:NAME`),
on a copy of the series as its first run left it: settings of ours compared side by side, each
drafting from the same last outputs and store.

The runs of steps 2-3 are sequential, in an order rotated by one from each cell to the
next, so that the machine's drift falls on each method alike. B is `vllm.max_num_seqs`, one
actor (ray.*'s defaults: 1 actor of 0.5 CPUs, batches of ray.batch_size rows). Each run's
summary.json gives tokens/s after start-up, mean tokens per call, generated tokens and the
predictions' accepted and rejected tokens; rows identical to plain's compare generated_tokens by id.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path

from jobs.benchmark.arguments import add_job_settings, add_prompt_args
from jobs.benchmark.job_runs import generated_by_id, job_command, run_job, write_jsonl
from jobs.benchmark.report import markdown_table

# method -> the overrides of its runs (ours: the series' default drafter, drafting from predictions)
# (each drafts throughout, drafting.speculation on: the comparison is of methods, not of modes)
METHODS = {
    "ours": ["drafting.speculation=on"],
    "vllm_suffix": ["drafting.drafter=vllm_suffix", "drafting.speculation=on"],
    "plain": ["drafting.drafter=none"],
}
KINDS = ("line", "field", "paragraph")
# Issue 64's goals for edited rows through the job on this CPU: at B = 1, ours/vllm_suffix of
# tokens per call and of tokens/s at least these; at B > 1, tokens/s not below either other method.
GOAL_CALLS_B1, GOAL_SPEED_B1 = 2.5, 1.4
SUMMARY_FIELDS = (
    "tokens_per_second_after_startup",
    "tokens_per_call",
    "generated_tokens",
    "accepted_prediction_tokens",
    "rejected_prediction_tokens",
    "rows",
    "errored_rows",
    "changed_rows",
    "seconds_to_first_batch",
    "wall_seconds",
    "engine_step_cost",
)


def cells(text: str) -> list[tuple[str, int]]:
    """`line:1,field:16` -> [("line", 1), ("field", 16)]: the edit kinds and batch sizes measured."""
    found = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        kind, _, batch = part.partition(":")
        if kind not in KINDS or not batch.isdigit() or int(batch) < 1:
            raise ValueError(f"{part!r}: a cell is EDIT:B, EDIT one of {', '.join(KINDS)} and B an integer >= 1")
        found.append((kind, int(batch)))
    return found


def add_cli_args(parser) -> None:
    add_prompt_args(parser, limit=16, max_new_tokens=128)
    parser.set_defaults(dataset="corpus-rewrite-code")
    parser.add_argument(
        "--cells",
        type=cells,
        default=cells("line:1,line:16,field:1,field:16,paragraph:1,paragraph:16"),
        help="EDIT:B pairs, comma-separated: the edit kind (line, field, paragraph) and "
        "vllm.max_num_seqs of each measurement",
    )
    add_job_settings(parser)
    parser.add_argument(
        "--ours",
        dest="variants",
        type=variant,
        action="append",
        default=[],
        metavar="NAME:SECTION.KEY=VALUE[,...]",
        help="another run of ours with these settings (method ours:NAME), on a copy of the series "
        "after its first run; repeatable",
    )
    parser.add_argument(
        "--workdir", default="", help="where the inputs, outputs and logs go (default: a new temporary directory)"
    )
    parser.add_argument("--timeout", type=float, default=1800, help="seconds one job run may take")


def variant(text: str) -> tuple[str, list[str]]:
    """`long:drafting.prediction_w=128` -> ("ours:long", ["drafting.prediction_w=128"])."""
    name, _, settings = text.partition(":")
    overrides = [part.strip() for part in settings.split(",") if part.strip()]
    if not name.isidentifier() or not overrides or not all("=" in part for part in overrides):
        raise ValueError(f"{text!r}: an ours variant is NAME:SECTION.KEY=VALUE[,SECTION.KEY=VALUE...]")
    return f"ours:{name}", overrides


def corpus_rows(prompts, kind: str | None = None) -> list[dict]:
    """The job's input rows (id, prompt): the prompts as they are, or each edited by `kind`."""
    from jobs.benchmark.document_edits import edit

    return [{"id": p.request_id, "prompt": edit(p.prompt, kind) if kind else p.prompt} for p in prompts]


def measure_cell(args, work: Path, prompts, kind: str, batch: int, order: list[str]) -> dict[str, dict]:
    """One cell: the series' first run, then `order`'s runs on the edited corpus (ours and each
    variant of ours on a series of its own, copied from the first run's); each method's summary
    (with `tokens`: its rows' generated tokens by id)."""
    base = [
        "engine.name=vllm",
        f"model.name={json.dumps(args.model)}",
        f"sampling.max_new_tokens={args.max_new_tokens}",
        *args.overrides,
    ]
    name = f"{kind}-b{batch}"
    original = write_jsonl(work / "inputs" / "original.jsonl", corpus_rows(prompts))
    edited = write_jsonl(work / "inputs" / f"edited-{kind}.jsonl", corpus_rows(prompts, kind))
    series = [f"job.series={name}"]
    largest = max(b for _, b in args.cells)
    print(f"[{name}] the series' first run (B = {largest})", flush=True)
    first = run_job(
        job_command(original, work / "series", "first", [*base, *series, f"vllm.max_num_seqs={largest}"]),
        work / "logs" / f"{name}-first",
        args.timeout,
    )
    variants = dict(args.variants)
    for method in variants:
        shutil.copytree(work / "series", work / series_directory(method))
    results = {}
    for method in order:
        print(f"[{name}] {method}", flush=True)
        at_b = [*base, *METHODS.get(method, variants.get(method, [])), f"vllm.max_num_seqs={batch}"]
        if method.startswith("ours"):
            command = job_command(edited, work / series_directory(method), "edited", [*at_b, *series])
        else:
            command = job_command(edited, work / f"fresh-{method}-{name}", "edited", at_b)
        summary = run_job(command, work / "logs" / f"{name}-{method}", args.timeout)
        results[method] = {**summary, "tokens": generated_by_id(summary["run_dir"])}
    results["ours"]["first_run"] = {key: first.get(key) for key in SUMMARY_FIELDS}
    return results


def series_directory(method: str) -> str:
    return "series" if method == "ours" else f"series-{method.split(':', 1)[1]}"


def cell_rows(kind: str, batch: int, results: dict[str, dict]) -> list[dict]:
    """A table row per method of one cell: its summary's figures, its rows identical to plain's (by
    id) and ours/vllm_suffix, ours/plain of tokens/s and of tokens per call (on ours' row)."""
    plain = results["plain"]["tokens"]
    rows = []
    for method, summary in results.items():
        tokens = summary["tokens"]
        same = sum(1 for key, ids in tokens.items() if key in plain and list(ids or []) == list(plain[key] or []))
        rows.append(
            {
                "edit": kind,
                "batch": batch,
                "method": method,
                **{key: summary.get(key) for key in SUMMARY_FIELDS},
                "fed_token_share": (summary.get("engine_step_cost") or {}).get("fed_token_share"),
                "identical_to_plain": f"{same}/{len(plain)}",
            }
        )
    next(row for row in rows if row["method"] == "ours")["first_run"] = results["ours"].get("first_run")
    for ours in (row for row in rows if row["method"].startswith("ours")):
        for other in ("vllm_suffix", "plain"):
            row = next(row for row in rows if row["method"] == other)
            for key, short in (("tokens_per_second_after_startup", "speed"), ("tokens_per_call", "calls")):
                ours[f"{short}_vs_{other}"] = ratio(ours[key], row[key])
    return rows


def ratio(numerator, denominator) -> float | None:
    return round(numerator / denominator, 3) if numerator is not None and denominator else None


def goals(rows: list[dict]) -> list[dict]:
    """Issue 64's goals against ours' rows (and each variant's): at B = 1, tokens per call >= 2.5x
    vllm_suffix's and tokens/s >= 1.4x; at B > 1 tokens/s not below vllm_suffix's or plain's."""
    found = []
    for row in (r for r in rows if r["method"].startswith("ours")):
        if row["batch"] == 1:
            wanted = [
                ("tokens/call vs vllm_suffix", row.get("calls_vs_vllm_suffix"), GOAL_CALLS_B1),
                ("tokens/s vs vllm_suffix", row.get("speed_vs_vllm_suffix"), GOAL_SPEED_B1),
            ]
        else:
            wanted = [
                ("tokens/s vs vllm_suffix", row.get("speed_vs_vllm_suffix"), 1.0),
                ("tokens/s vs plain", row.get("speed_vs_plain"), 1.0),
            ]
        found += [
            {
                "edit": row["edit"],
                "batch": row["batch"],
                "method": row["method"],
                "goal": f"{what} >= {target}",
                "measured": value,
                "met": value is not None and value >= target,
            }
            for what, value, target in wanted
        ]
    return found


def run(args) -> dict:
    from jobs.benchmark.datasets import load_prompts

    work = Path(args.workdir or tempfile.mkdtemp(prefix="series-edits-"))
    prompts = load_prompts(args.dataset, args.limit)
    names, rows, started = [*METHODS, *dict(args.variants)], [], time.time()
    for index, (kind, batch) in enumerate(args.cells):
        order = names[index % len(names) :] + names[: index % len(names)]
        results = measure_cell(args, work / f"{kind}-b{batch}", prompts, kind, batch, order)
        rows += [{**row, "order": order.index(row["method"]) + 1} for row in cell_rows(kind, batch, results)]
        (work / "runs.json").write_text(json.dumps(rows, indent=1) + "\n")  # the cells so far, should a later one fail
    return {
        "dataset": args.dataset,
        "prompts": len(prompts),
        "max_new_tokens": args.max_new_tokens,
        "model": args.model,
        "cells": [f"{kind}:{batch}" for kind, batch in args.cells],
        "overrides": args.overrides,
        "variants": dict(args.variants),
        "workdir": str(work),
        "minutes": round((time.time() - started) / 60, 1),
        "runs": rows,
        "goals": goals(rows),
    }


def markdown(report: dict) -> str:
    runs = markdown_table(
        report["runs"],
        {
            "edit": "edit",
            "batch": "B",
            "method": "method",
            "order": "ran",
            "tokens_per_second_after_startup": "tokens/s",
            "tokens_per_call": "tokens/call",
            "generated_tokens": "tokens",
            "accepted_prediction_tokens": "prediction accepted",
            "rejected_prediction_tokens": "rejected",
            "identical_to_plain": "rows = plain's",
            "fed_token_share": "fed token / step",
            "speed_vs_vllm_suffix": "tokens/s vs suffix",
            "speed_vs_plain": "tokens/s vs plain",
            "calls_vs_vllm_suffix": "tokens/call vs suffix",
            "calls_vs_plain": "tokens/call vs plain",
            "seconds_to_first_batch": "start s",
        },
    )
    return runs + "\n\n" + markdown_table(report["goals"], ["edit", "batch", "method", "goal", "measured", "met"])
