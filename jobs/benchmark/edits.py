"""edits: a scheduled corpus run over an edited corpus, its changed rows drafted from their last output.

    python -m jobs.benchmark edits --dataset corpus-rewrite-code --limit 32 --max-new-tokens 128 --batch 1,16

The corpus is run once (plain vLLM, greedy): those are the rows' last outputs. Then every document
is edited (a line a third of the way in extended, a line two thirds of the way in deleted) and the edited corpus is generated again, as a series regenerates its changed rows
(pipeline/series.py), by: vLLM plain; vLLM's `suffix` (arctic-inference, where installed: its
cache starts empty, as in a new process, and learns from the rows as they finish); ours (the
default drafter) without the last outputs; and ours with each row's last output as its
`prediction` (drafters/prediction.py). The methods take turns call by call (B requests per call)
so that drift falls on all alike; every method's tokens are compared with plain's.
"""
from __future__ import annotations

import json
import time

from jobs.benchmark.arguments import add_prompt_args, integers
from jobs.benchmark.report import markdown_table
from pipeline.engines.base import Request

OURS = "batch_suffix:1:auto"  # the default drafter, as the engines subcommand names it
PREDICTED = "batch_suffix:1:auto+prediction"


def add_cli_args(parser) -> None:
    add_prompt_args(parser, limit=32, max_new_tokens=128)
    parser.set_defaults(dataset="corpus-rewrite-code")
    parser.add_argument("--batch", type=integers, default=[1, 16], help="requests per call, comma-separated")
    parser.add_argument("--dtype", default="float32", choices=("auto", "float32", "bfloat16"))


def edit(prompt: str) -> str:
    """The prompt with a few lines of its document edited: " (updated)" appended to the line a
    third of the way in, and the line two thirds of the way in deleted."""
    lines = prompt.splitlines(keepends=True)
    start = next((i + 1 for i, line in enumerate(lines) if not line.strip()), 0)  # after the instruction
    body = lines[start:]
    if len(body) >= 6:
        third = len(body) // 3
        body[third] = body[third].rstrip("\n") + " (updated)\n"
        del body[2 * third]
    return "".join(lines[:start] + body)


def run(args) -> dict:
    import importlib.util

    from jobs.benchmark.datasets import encode_prompt, load_prompts
    from jobs.benchmark.engines import build_engines, parse_methods

    names = ["plain", OURS] + (["vllm_suffix"] if importlib.util.find_spec("arctic_inference") else [])
    methods = {method.name: method for method in parse_methods(",".join(names), "vllm")}
    base = [f"model.name={json.dumps(args.model)}", f"model.dtype={args.dtype}", "engine.cpu_kv_cache_gib=1",
            f"decoder.max_new_tokens={args.max_new_tokens}"]
    engines = {name: engine for (method, _), engine in build_engines(base, list(methods.values()), args.batch).items()
               for name in [method.name]}
    engines[PREDICTED] = engines[OURS]
    prompts = load_prompts(args.dataset, args.limit)
    tokenizer = engines["plain"].tokenizer
    original = [Request(p.request_id, encode_prompt(tokenizer, p.prompt, p.request_id), args.max_new_tokens)
                for p in prompts]
    last = [r.token_ids for r in engines["plain"].generate(original)]  # the series' earlier run
    edited = [Request(p.request_id, encode_prompt(tokenizer, edit(p.prompt), p.request_id), args.max_new_tokens)
              for p in prompts]
    requests = {name: edited for name in engines}
    requests[PREDICTED] = [Request(r.request_id, r.prompt_ids, r.max_new_tokens, prediction=tuple(ids))
                           for r, ids in zip(edited, last)]
    # Each batch size on its own prompts: the suffix methods remember what they have generated.
    share = len(prompts) // len(args.batch)
    rows = [row for i, batch in enumerate(args.batch) for row in compare(
        engines, {name: rs[i * share:(i + 1) * share] for name, rs in requests.items()}, batch)]
    return {"dataset": args.dataset, "model": args.model, "prompts": len(prompts), "max_new_tokens": args.max_new_tokens,
            "prompts_per_batch_size": share, "runs": [
                {key: value for key, value in row.items() if key != "outputs"} for row in rows]}


def compare(engines: dict, requests: dict, batch: int) -> list[dict]:
    """Every method on its requests, `batch` per call, the methods taking turns call by call."""
    names = list(engines)
    seconds, results = dict.fromkeys(names, 0.0), {name: [] for name in names}
    for call, start in enumerate(range(0, len(requests[names[0]]), batch)):
        for name in names[call % len(names):] + names[:call % len(names)]:
            began = time.perf_counter()
            results[name] += engines[name].generate(requests[name][start:start + batch])
            seconds[name] += time.perf_counter() - began
    plain = [r.token_ids for r in results["plain"]]
    rows = []
    for name in names:
        tokens = sum(len(r.token_ids) for r in results[name])
        calls = sum(r.stats.num_target_calls for r in results[name])
        predicted = sum(r.stats.strategy_accepted_tokens.get("prediction", 0) for r in results[name])
        rows.append({"method": name, "batch": batch, "tokens": tokens, "tokens_per_second": round(tokens / seconds[name], 2),
                     "tokens_per_call": round(tokens / calls, 3), "tokens_from_prediction": predicted,
                     "identical_to_plain": sum(r.token_ids == p for r, p in zip(results[name], plain)),
                     "outputs": [r.token_ids for r in results[name]]})
    for row in rows:
        for reference in ("plain", "vllm_suffix"):
            if reference in engines:
                row[f"vs_{reference}"] = round(row["tokens_per_second"] / next(
                    r["tokens_per_second"] for r in rows if r["method"] == reference), 3)
    return rows


def markdown(report: dict) -> str:
    return markdown_table(report["runs"], {"method": "method", "batch": "B", "tokens_per_second": "tokens/s",
                                           "tokens_per_call": "tokens/call", "tokens_from_prediction": "from prediction",
                                           "identical_to_plain": "rows = plain's", "vs_plain": "vs plain",
                                           "vs_vllm_suffix": "vs vllm_suffix"})
