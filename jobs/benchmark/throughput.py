"""Throughput mode on the transformers engine: generated tokens/s of batched generation.

    python -m jobs.benchmark --throughput --batch 1,4,8 --spec context_ngram:auto:auto ...

per --batch size B: transformers' generate over left-padded batches of B (hf_greedy, and
hf_greedy_gqa on our engine's attention call), and the transformers engine plain and with each
--spec method, B requests per forward call, each engine built as a job builds it. Every output is
checked against the engine's plain greedy decoding one request at a time.
"""
from __future__ import annotations

import json
import time

from jobs.benchmark.hf import hf_generate_batch
from jobs.benchmark.quality import our_config
from pipeline.engines.base import Request
from pipeline.engines.build import build_engine
from pipeline.engines.transformers import GQA_ATTENTION
from pipeline.model_loading import eos_token_ids
from pipeline.prompts import encode_prompt, load_prompts


def throughput_comparison(args, loaded) -> dict:
    """Generated tokens/s per batch size for hf_greedy batched, ours plain and ours speculative,
    each checked token-identical to single-request greedy (ours, plain, one request at a time)."""
    prompts = [encode_prompt(loaded.tokenizer, p.prompt, p.request_id) for p in load_prompts(args.dataset, args.limit)]
    n = args.max_new_tokens
    requests = [Request(str(i), ids, n) for i, ids in enumerate(prompts)]
    eos = eos_token_ids(loaded.model, loaded.tokenizer)
    pad = loaded.tokenizer.pad_token_id if loaded.tokenizer.pad_token_id is not None else min(eos)

    def ours(name, size):
        engine = build_engine(our_config(name, args, size), loaded=loaded)
        results = engine.generate(requests)
        return [result.token_ids for result in results], [result.stats for result in results]

    def hf(size, attention="sdpa"):
        outputs = []
        for start in range(0, len(prompts), size):
            outputs += hf_generate_batch(loaded.model, prompts[start:start + size], n, pad, eos, attention)
        return outputs, []

    started = time.perf_counter()
    reference, _ = ours("plain", 1)  # single-request greedy
    reference_seconds = time.perf_counter() - started
    rows = [{"batch": 1, "method": "plain (one request at a time)", "seconds": round(reference_seconds, 2),
             "tokens_per_second": round(sum(map(len, reference)) / reference_seconds, 3), "identical_fraction": 1.0}]
    # hf_greedy: generate as its users get it; hf_greedy_gqa: generate on our engine's attention call.
    methods = {"hf_greedy": hf, "hf_greedy_gqa": lambda size: hf(size, GQA_ATTENTION),
               "plain": lambda size: ours("plain", size)}
    methods.update({name: lambda size, name=name: ours(name, size) for name in args.spec.split(",")})
    for index, size in enumerate(int(b) for b in args.batch.split(",")):
        names = list(methods)
        shift = index % len(names)
        for name in names[shift:] + names[:shift]:  # rotated per batch size
            started = time.perf_counter()
            outputs, stats = methods[name](size)
            seconds = time.perf_counter() - started
            rows.append(throughput_row(size, name, seconds, outputs, stats, reference))
            print(json.dumps(rows[-1]), flush=True)
    for row in rows:
        same = {r["method"]: r["tokens_per_second"] for r in rows if r["batch"] == row["batch"]}
        if "hf_greedy" in same:
            row["vs_hf_greedy_same_batch"] = round(row["tokens_per_second"] / same["hf_greedy"], 3)
        if "plain" in same:
            row["vs_plain_same_batch"] = round(row["tokens_per_second"] / same["plain"], 3)
    return {"prompts": len(prompts), "max_new_tokens": n, "spec": args.spec, "runs": rows}


def throughput_row(size: int, name: str, seconds: float, outputs: list[list[int]], stats: list, reference) -> dict:
    calls = sum(s.num_target_calls for s in stats)
    return {"batch": size, "method": name, "seconds": round(seconds, 2),
            "tokens_per_second": round(sum(map(len, outputs)) / seconds, 3),
            "identical_fraction": round(sum(a == b for a, b in zip(outputs, reference)) / len(reference), 4),
            "tokens_per_call": round(sum(map(len, outputs)) / calls, 3) if calls else None,
            "fed_per_call": round(sum(s.num_verified_tokens for s in stats) / calls, 2) if calls else None}


def throughput_markdown(report: dict) -> str:
    lines = ["| batch | method | tokens/s | tokens/call | fed/call | identical | vs hf_greedy (same B) | vs plain (same B) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in report["runs"]:
        lines.append(f"| {r['batch']} | {r['method']} | {r['tokens_per_second']:.2f} | {r.get('tokens_per_call') or '-'} | "
                     f"{r.get('fed_per_call') or '-'} | {r['identical_fraction']:.2f} | "
                     f"{r.get('vs_hf_greedy_same_batch', '-')} | {r.get('vs_plain_same_batch', '-')} |")
    return "\n".join(lines)
