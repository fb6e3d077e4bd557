"""gpu-check: our speculator end to end on a GPU with vLLM >= 0.34, against vLLM's `suffix` and plain
decoding, in one process (it needs a CUDA GPU and vLLM 0.34; nothing here runs on a CPU).

    VLLM_GPU_SYNC_CHECK=error python -m jobs.benchmark.gpu_check --model MODEL --dataset humaneval \
        --limit 64 --max-new-tokens 128 --k 8 --out gpu_check.json

Ours runs with its draft length by running requests (H100_DRAFT_LENGTHS); suffix at its fixed k.
Each method generates the same prompts greedily, twice (the first pass warms the engine and, for the
corpus-keeping methods, fills their corpus as a long job would; the second is timed); methods take
turns, each in a fresh engine. Reported: tokens/s of each method's timed pass, its ratio to plain's,
and whether its rows are plain's token for token (they must be: greedy verification never changes a
row). VLLM_GPU_SYNC_CHECK=error makes any host synchronization in a step an error.

With --temperature T > 0 the rows are sampled, each with its own seed, as the job's vLLM 0.34 engine
runs them (pipeline/engines/vllm/v2/keyed_draws.py): every method's rows must be plain's token for
token again, and a last row, plain decoding with vLLM's own seeded sampling, gives the mean log
probability per token of plain sampling (vLLM's raw log probabilities) to set each method's against.
"""

from __future__ import annotations

import gc
import time

METHODS = ("plain", "suffix", "ngrammys")


def add_cli_args(parser) -> None:
    from jobs.benchmark.arguments import add_prompt_args

    add_prompt_args(parser, limit=64, max_new_tokens=128)
    parser.add_argument("--k", type=int, default=8, help="num_speculative_tokens of suffix and ours")
    parser.add_argument("--max-num-seqs", type=int, default=64, help="the engine's running requests")
    parser.add_argument("--bigram-table", default="", help="the model's bigram table (.npy), for ours")
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy; else sampled rows, seeded")


def speculative_arguments(method: str, k: int, bigram_table: str, keyed: bool) -> dict:
    """The engine arguments that run `method` (`keyed`: with the keyed-draw processor, as the job does)."""
    from pipeline.engines.vllm import H100_DRAFT_LENGTHS, speculator_arguments, with_keyed_draws

    arguments = {}
    if method == "suffix":
        arguments = {"speculative_config": {"method": "suffix", "num_speculative_tokens": k}}
    elif method == "ngrammys":
        options = {"bigram_table": bigram_table} if bigram_table else {}
        arguments = speculator_arguments(k, options, [(a, b, min(length, k)) for a, b, length in H100_DRAFT_LENGTHS])
    return with_keyed_draws(arguments) if keyed else arguments


def sampling(args, index: int, keyed: bool):
    """Row `index`'s SamplingParams: greedy, or sampled with seed `index` (keyed: as the job runs it)."""
    from vllm import SamplingParams

    from pipeline.engines.vllm import KEYED_KEY

    common = dict(max_tokens=args.max_new_tokens, logprobs=0 if args.temperature else None)
    if not args.temperature:
        return SamplingParams(temperature=0.0, **common)
    if not keyed:
        return SamplingParams(temperature=args.temperature, seed=index, **common)
    settings = {"temperature": args.temperature, "top_k": 0, "top_p": 1.0, "seed": index}
    return SamplingParams(temperature=0.0, extra_args={KEYED_KEY: settings}, **common)


def generate(args, method: str, prompts: list[list[int]], keyed: bool = True) -> tuple[list, float, float | None]:
    """Each row's tokens, the timed pass's seconds, and the mean log probability per sampled token."""
    import torch
    from vllm import LLM

    llm = LLM(
        model=args.model,
        max_num_seqs=args.max_num_seqs,
        seed=0,
        **speculative_arguments(method, args.k, args.bigram_table, keyed and args.temperature > 0),
    )
    params = [sampling(args, index, keyed) for index in range(len(prompts))]
    inputs = [{"prompt_token_ids": p} for p in prompts]  # a TokensPrompt, by its public form
    llm.generate(inputs, params, use_tqdm=False)  # warm-up, and the corpus a long job would have
    started = time.perf_counter()
    outputs = llm.generate(inputs, params, use_tqdm=False)
    seconds = time.perf_counter() - started
    del llm
    gc.collect()
    torch.cuda.empty_cache()
    tokens = [list(o.outputs[0].token_ids) for o in outputs]
    logprobs = [
        step[token].logprob for o, row in zip(outputs, tokens) for step, token in zip(o.outputs[0].logprobs or [], row)
    ]
    return tokens, seconds, (sum(logprobs) / len(logprobs) if logprobs else None)


def run(args) -> dict:
    from transformers import AutoTokenizer

    from jobs.benchmark.datasets import encode_prompt, load_prompts

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    prompts = [encode_prompt(tokenizer, p.prompt, p.request_id) for p in load_prompts(args.dataset, args.limit)]
    rows, plain = [], None
    runs = [(method, True) for method in METHODS] + ([("plain", False)] if args.temperature else [])
    for method, keyed in runs:
        tokens, seconds, logprob = generate(args, method, prompts, keyed)
        generated = sum(len(t) for t in tokens)
        plain = plain or (tokens, generated / seconds)
        same = sum(a == b for a, b in zip(tokens, plain[0]))
        rows.append(
            dict(
                method=method if keyed else "plain, vLLM's own sampling",
                tokens_per_second=round(generated / seconds, 1),
                vs_plain=round(generated / seconds / plain[1], 3),
                rows_identical_to_plain=f"{same}/{len(prompts)}",
                mean_logprob=None if logprob is None else round(logprob, 4),
            )
        )
    return dict(model=args.model, dataset=args.dataset, k=args.k, temperature=args.temperature, rows=rows)


def markdown(report: dict) -> str:
    from jobs.benchmark.report import markdown_table

    return markdown_table(report["rows"])
