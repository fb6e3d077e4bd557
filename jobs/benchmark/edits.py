"""edits: a scheduled corpus run over an edited corpus, its changed rows drafted from their last output.

    python -m jobs.benchmark edits --dataset corpus-rewrite-code --limit 32 --max-new-tokens 128 --batch 1,16

The corpus is run once (plain vLLM, greedy): those are the rows' last outputs. Then every document
is edited (its most frequent word of four or more letters renamed everywhere, one line in its
middle deleted) and the edited corpus is generated again, as a series regenerates its changed rows
(pipeline/series.py), by: vLLM plain; vLLM's `suffix` (arctic-inference, where installed: its
cache starts empty, as in a new process, and learns from the rows as they finish); ours (the
default drafter) without the last outputs; and ours with each row's last output as its
`prediction` (drafters/prediction.py). The methods take turns call by call (B requests per call)
so that drift falls on all alike; every method's tokens are compared with plain's.
"""
from __future__ import annotations

import json
import re
import time
from collections import Counter

from jobs.benchmark.arguments import add_prompt_args, integers
from jobs.benchmark.report import markdown_table
from pipeline.engines.base import Request

PREDICTED = "batch_suffix+prediction"


def add_cli_args(parser) -> None:
    add_prompt_args(parser, limit=32, max_new_tokens=128)
    parser.set_defaults(dataset="corpus-rewrite-code")
    parser.add_argument("--batch", type=integers, default=[1, 16], help="requests per call, comma-separated")
    parser.add_argument("--dtype", default="float32", choices=("auto", "float32", "bfloat16"))


def edit(prompt: str) -> str:
    """The prompt with its document edited: its most frequent word of 4+ letters renamed (every
    occurrence) and the line in the middle of the document deleted."""
    lines = prompt.splitlines(keepends=True)
    start = next((i + 1 for i, line in enumerate(lines) if not line.strip()), 0)  # after the instruction
    document = "".join(lines[start:])
    words = Counter(re.findall(r"\b[A-Za-z_]{4,}\b", document))
    if words:
        word = words.most_common(1)[0][0]
        document = re.sub(rf"\b{re.escape(word)}\b", word + "_v2", document)
    body = document.splitlines(keepends=True)
    if len(body) > 4:
        del body[len(body) // 2]
    return "".join(lines[:start]) + "".join(body)


def run(args) -> dict:
    import importlib.util

    from jobs.benchmark.datasets import encode_prompt, load_prompts
    from jobs.benchmark.engines import build_engines, parse_methods

    names = ["plain", "batch_suffix"] + (["vllm_suffix"] if importlib.util.find_spec("arctic_inference") else [])
    methods = {method.name: method for method in parse_methods(",".join(names), "vllm")}
    base = [f"model.name={json.dumps(args.model)}", f"model.dtype={args.dtype}", "engine.cpu_kv_cache_gib=1",
            f"decoder.max_new_tokens={args.max_new_tokens}"]
    engines = {name: engine for (method, _), engine in build_engines(base, list(methods.values()), args.batch).items()
               for name in [method.name]}
    engines[PREDICTED] = engines["batch_suffix"]
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
    rows = [row for batch in args.batch for row in compare(engines, requests, batch)]
    return {"dataset": args.dataset, "model": args.model, "prompts": len(prompts), "max_new_tokens": args.max_new_tokens,
            "changed_from_last_output": sum(a != b for a, b in zip(last, rows[0]["outputs"])), "runs": [
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
