"""Side-by-side benchmark of our decoder against transformers' generate, on real prompts.

    python -m jobs.benchmark --dataset humaneval|gsm8k|PATH.jsonl --limit N --max-new-tokens M \
        --out results.json [--model M] [--methods hf_greedy,plain,mixed:4:4,...]

Every method runs on every prompt; the order of methods is rotated per prompt so slow drifts of
this machine's speed fall on all methods alike. Speed-ups are ratios within this one run.
"""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from drafters.registry import build_tables, make_drafter
from pipeline.config import DecoderConfig, ModelConfig
from pipeline.decoder import SpeculativeDecoder
from pipeline.model_loading import cache_root, load_model
from pipeline.prompts import encode_prompt, load_prompts

DEFAULT_METHODS = ("hf_greedy,hf_prompt_lookup:3,plain,context_ngram:1:3,bigram:1:1,"
                   "mixed:1:3,mixed:2:3,mixed:4:4,mixed:10:10")


@dataclass
class MethodRun:
    name: str  # "hf_greedy", "hf_prompt_lookup:N", "plain" or "DRAFTER:k:w"
    outputs: list[list[int]] = field(default_factory=list)
    seconds: float = 0.0
    target_calls: int = 0

    @property
    def drafter_k_w(self) -> tuple[str, int, int]:
        parts = self.name.split(":")
        if parts[0] == "plain":
            return "none", 1, 0
        if parts[0].startswith("hf_"):
            return parts[0], 1, int(parts[1]) if len(parts) > 1 else 0
        return parts[0], int(parts[1]), int(parts[2])


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="humaneval")
    parser.add_argument("--limit", type=int, default=40)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--out", default="results.json")
    parser.add_argument("--model", default=ModelConfig().name)
    parser.add_argument("--methods", default=DEFAULT_METHODS,
                        help="comma-separated: hf_greedy, hf_prompt_lookup:N, plain, DRAFTER:k:w")
    parser.add_argument("--pipeline", action="store_true",
                        help="instead: the same prompts through the Ray job and in-process, with the "
                             "decoder of --config, compared in tokens/s after start-up")
    parser.add_argument("--config", default="configs/default.yaml", help="decoder settings for --pipeline")
    return parser.parse_args(argv)


def build_runners(names: list[str], loaded, max_new_tokens: int) -> dict:
    """One callable per method: prompt ids -> (generated ids, target calls or None)."""
    model, tokenizer = loaded.model, loaded.tokenizer
    runners = {}
    for name in names:
        run = MethodRun(name)
        drafter_name, k, w = run.drafter_k_w
        if drafter_name == "hf_greedy":
            runners[name] = lambda ids: (hf_generate(model, ids, max_new_tokens), None)
        elif drafter_name == "hf_prompt_lookup":
            runners[name] = lambda ids, w=w: (hf_generate(model, ids, max_new_tokens, prompt_lookup_num_tokens=w), None)
        else:
            config = DecoderConfig(drafter=drafter_name, k=k, w=w, max_new_tokens=max_new_tokens)
            tables = build_tables(model, tokenizer, loaded.fingerprint, config, cache_root(ModelConfig()))
            decoder = SpeculativeDecoder(model, tokenizer, make_drafter(config, tables, 0), k, w, config.ngram_max_q)
            runners[name] = lambda ids, decoder=decoder: _ours(decoder, ids, max_new_tokens)
    return runners


def _ours(decoder: SpeculativeDecoder, ids: list[int], max_new_tokens: int):
    result = decoder.generate(ids, max_new_tokens)
    return result.token_ids, result.stats.num_target_calls


@torch.no_grad()
def hf_generate(model, ids: list[int], max_new_tokens: int, **kwargs) -> list[int]:
    inputs = torch.tensor([ids])
    output = model.generate(inputs, attention_mask=torch.ones_like(inputs), do_sample=False,
                            max_new_tokens=max_new_tokens, **kwargs)
    return output[0, len(ids):].tolist()


def summarize(runs: list[MethodRun], reference: MethodRun) -> list[dict]:
    results = []
    for run in runs:
        drafter_name, k, w = run.drafter_k_w
        generated = sum(len(o) for o in run.outputs)
        identical = sum(a == b for a, b in zip(run.outputs, reference.outputs)) / len(run.outputs)
        results.append({
            "method": run.name, "k": k, "w": w, "prompts": len(run.outputs), "generated_tokens": generated,
            "tokens_per_second": round(generated / run.seconds, 3),
            "tokens_per_call": round(generated / run.target_calls, 3) if run.target_calls else None,
            "identical_fraction": round(identical, 4),
            "speedup_vs_hf_greedy": round((generated / run.seconds) / (sum(map(len, reference.outputs)) / reference.seconds), 3),
        })
    return results


def markdown(results: list[dict]) -> str:
    lines = ["| method | k | w | tokens/s | tokens/call | identical | speed-up vs hf_greedy |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['method']} | {r['k']} | {r['w']} | {r['tokens_per_second']:.2f} | "
                     f"{r['tokens_per_call'] if r['tokens_per_call'] is not None else '-'} | "
                     f"{r['identical_fraction']:.2f} | {r['speedup_vs_hf_greedy']:.3f} |")
    return "\n".join(lines)


def pipeline_comparison(args) -> dict:
    """Tokens/s of the Ray job (after its actors have started) and of the same stage in-process."""
    import tempfile

    import ray

    from pipeline.config import load_config
    from pipeline.ray_job import run_job
    from pipeline.stage import GenerationStage

    output = tempfile.mkdtemp(prefix="pipeline-benchmark-")
    config = load_config(args.config, [f"model.name={json.dumps(args.model)}", f"input.path={json.dumps(args.dataset)}",
                                       f"input.limit={args.limit}", f"decoder.max_new_tokens={args.max_new_tokens}",
                                       f"job.output={json.dumps(output)}"])
    prompts = load_prompts(args.dataset, args.limit)
    stage = GenerationStage(config)
    started = time.perf_counter()
    table = stage({"id": [p.request_id for p in prompts], "prompt": [p.prompt for p in prompts]})
    in_process_seconds = time.perf_counter() - started
    in_process_tokens = sum(table.column("num_generated_tokens").to_pylist())
    del stage
    ray.init()
    summary = run_job(config, "benchmark")
    ray.shutdown()
    in_process = in_process_tokens / in_process_seconds
    pipeline = summary["tokens_per_second_after_startup"]
    return {"prompts": len(prompts), "decoder": summary["settings"]["decoder"],
            "in_process_tokens_per_second": round(in_process, 3),
            "pipeline_tokens_per_second_after_startup": pipeline,
            "pipeline_tokens_per_second_with_startup": summary["tokens_per_second"],
            "pipeline_overhead": round(in_process / pipeline - 1, 4)}


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.pipeline:
        report = {"dataset": args.dataset, "model": args.model, "pipeline": pipeline_comparison(args)}
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
        print(json.dumps(report, indent=2))
        return report
    loaded = load_model(ModelConfig(name=args.model))
    prompts = load_prompts(args.dataset, args.limit)
    names = [n.strip() for n in args.methods.split(",") if n.strip()]
    if "hf_greedy" not in names:
        names.insert(0, "hf_greedy")  # the reference for identity and speed-up
    runners = build_runners(names, loaded, args.max_new_tokens)
    runs = {name: MethodRun(name) for name in names}
    for index, prompt in enumerate(prompts):
        ids = encode_prompt(loaded.tokenizer, prompt.prompt, prompt.request_id)
        rotation = index % len(names)
        for name in names[rotation:] + names[:rotation]:
            started = time.perf_counter()
            output, calls = runners[name](ids)
            runs[name].seconds += time.perf_counter() - started
            runs[name].outputs.append(output)
            runs[name].target_calls += calls or 0
        print(f"prompt {index + 1}/{len(prompts)} done", flush=True)
    results = summarize(list(runs.values()), runs["hf_greedy"])
    report = {"dataset": args.dataset, "limit": args.limit, "max_new_tokens": args.max_new_tokens,
              "model": args.model, "runs": results}
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(markdown(results))
    return report


if __name__ == "__main__":
    main()
