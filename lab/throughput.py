"""throughput: generated tokens/s of batched generation on the transformers engine.

    python -m lab throughput --batch 1,4,8 --spec context_ngram:auto:auto ...

per --batch size B: transformers' generate over left-padded batches of B (hf_greedy, and
hf_greedy_gqa on our engine's attention call), and the transformers engine plain and with each
--spec method, B requests per forward call, each engine built as a job builds it. Every output is
checked against the engine's plain greedy decoding one request at a time.
"""

from __future__ import annotations

import time

from jobs.benchmark.arguments import add_prompt_args
from jobs.benchmark.datasets import encode_prompt, load_prompts
from lab.hf import hf_generate_batch
from lab.quality import our_config
from jobs.benchmark.report import markdown_table
from pipeline.config import ModelConfig
from pipeline.engines.base import Request
from pipeline.engines.build import build_engine
from pipeline.engines.transformers import GQA_ATTENTION, use_gqa_attention
from pipeline.loading.model import eos_token_ids, load_model


def add_cli_args(parser) -> None:
    add_prompt_args(parser)
    parser.add_argument("--batch", default="1,4,8", help="batch sizes: requests per forward call")
    parser.add_argument(
        "--spec",
        default="batch_suffix:1:auto",
        help="our speculative methods, comma-separated (quality's DRAFTER:k:w[:tree])",
    )
    parser.add_argument("--max-batch-tokens", type=int, default=0, help="tokens fed per call, at most (0: no cap)")
    parser.add_argument("--datastore", default="", help="a datastore directory for rest:k:w")


def run(args) -> dict:
    loaded = load_model(ModelConfig(name=args.model))
    use_gqa_attention(loaded.model)  # the model as the transformers engine runs it; hf_greedy switches back
    return {"dataset": args.dataset, "model": args.model, **throughput_comparison(args, loaded)}


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
            outputs += hf_generate_batch(loaded.model, prompts[start : start + size], n, pad, eos, attention)
        return outputs, []

    started = time.perf_counter()
    reference, _ = ours("plain", 1)  # single-request greedy
    reference_seconds = time.perf_counter() - started
    rows = [
        {
            "batch": 1,
            "method": "plain (one request at a time)",
            "seconds": round(reference_seconds, 2),
            "tokens_per_second": round(sum(map(len, reference)) / reference_seconds, 3),
            "identical_fraction": 1.0,
        }
    ]
    # hf_greedy: generate as its users get it; hf_greedy_gqa: generate on our engine's attention call.
    methods = {
        "hf_greedy": hf,
        "hf_greedy_gqa": lambda size: hf(size, GQA_ATTENTION),
        "plain": lambda size: ours("plain", size),
    }
    methods.update({name: lambda size, name=name: ours(name, size) for name in args.spec.split(",")})
    for index, size in enumerate(int(b) for b in args.batch.split(",")):
        names = list(methods)
        shift = index % len(names)
        for name in names[shift:] + names[:shift]:  # rotated per batch size
            started = time.perf_counter()
            outputs, stats = methods[name](size)
            seconds = time.perf_counter() - started
            rows.append(throughput_row(size, name, seconds, outputs, stats, reference))
    for row in rows:
        same = {r["method"]: r["tokens_per_second"] for r in rows if r["batch"] == row["batch"]}
        if "hf_greedy" in same:
            row["vs_hf_greedy_same_batch"] = round(row["tokens_per_second"] / same["hf_greedy"], 3)
        if "plain" in same:
            row["vs_plain_same_batch"] = round(row["tokens_per_second"] / same["plain"], 3)
    return {"prompts": len(prompts), "max_new_tokens": n, "spec": args.spec, "runs": rows}


def throughput_row(size: int, name: str, seconds: float, outputs: list[list[int]], stats: list, reference) -> dict:
    calls = sum(s.num_target_calls for s in stats)
    return {
        "batch": size,
        "method": name,
        "seconds": round(seconds, 2),
        "tokens_per_second": round(sum(map(len, outputs)) / seconds, 3),
        "identical_fraction": round(sum(a == b for a, b in zip(outputs, reference)) / len(reference), 4),
        "tokens_per_call": round(sum(map(len, outputs)) / calls, 3) if calls else None,
        "fed_per_call": round(sum(s.num_verified_tokens for s in stats) / calls, 2) if calls else None,
    }


def markdown(report: dict) -> str:
    return markdown_table(
        report["runs"],
        {
            "batch": "batch",
            "method": "method",
            "tokens_per_second": "tokens/s",
            "tokens_per_call": "tokens/call",
            "fed_per_call": "fed/call",
            "identical_fraction": "identical",
            "vs_hf_greedy_same_batch": "vs hf_greedy (same B)",
            "vs_plain_same_batch": "vs plain (same B)",
        },
    )
