"""Side-by-side benchmark of our decoder against transformers' generate, on real prompts.

    python -m jobs.benchmark --dataset humaneval|gsm8k|sharegpt|PATH.jsonl --limit N --max-new-tokens M \
        --out results.json [--model M] [--methods hf_greedy,plain,mixed:4:4,...] \
        [--temperature T --top-p P --top-k K --seed S]

Methods: hf_greedy (hf_sample when --temperature > 0), hf_prompt_lookup:N, hf_assisted:L:G
(transformers' assisted generation with the self-draft of L layers, G tokens per draft), plain
(ours without drafts), self_draft:L:G (ours, draft-model speculative sampling with the same
self-draft), DRAFTER:k:w[:tree] (any decoder.drafter; k and/or w may be `auto`; `:tree` verifies with tree attention;
`rest` reads --datastore, and so does `mixed+rest`: the mixed drafter with retrieved rows). Every method runs on every prompt; the order of
methods is rotated per prompt so slow drifts of this machine's speed fall on all methods alike.
Speed-ups are ratios within this one run. When sampling, request i samples with the same seed
in every method. --dataset takes a comma-separated list; each dataset is a run of its own.

    python -m jobs.benchmark --grid [--grid-drafter mixed] --dataset humaneval,gsm8k --plots DIR ...

sweeps DRAFTER:k:w over k in {1, 2, 4, 8, 16} and w in {1, 2, 4, 8} next to hf_greedy,
hf_prompt_lookup:10, plain and DRAFTER:auto:auto, and draws per dataset the paper's Figure 3
(tokens per call) and Figure 5 (wall-time speed-up) as k x w heatmaps, and Figure 4's ablations
(accepted-length distribution, rank of the winning row, rows and wins per strategy) for the best
fixed (k, w), auto and the largest (k, w).

    python -m jobs.benchmark --throughput --engine vllm --batch 1,16 --spec suffix:1:auto --rounds 3 --limit 16 ...

runs vLLM plain, vllm_ngram, vllm_suffix (when arctic-inference is installed) and our --spec
methods on vLLM, and the --reference methods on our transformers engine, side by side (see
pipeline/comparison.py): per round and batch size a chunk of --limit prompts no earlier run
used, so --rounds x batch sizes x --limit prompts in all.
"""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from drafters.draft_model import self_draft_model
from drafters.registry import build_tables
from pipeline.attention import NAME as GQA_ATTENTION, attention_implementation
from pipeline.config import AUTO_MAX, DecoderConfig, ModelConfig
from pipeline.decoder import SpeculativeDecoder
from pipeline.model_loading import cache_root, load_model
from pipeline.engines.transformers.engine import build_decoder
from pipeline.plots import AcceptanceCounts, save_acceptance_plots, save_heatmap
from pipeline.prompts import encode_prompt, load_prompts
from pipeline.sampling import GREEDY, SamplingParams, request_seed
from pipeline.stats import RequestStats

DEFAULT_METHODS = ("hf_greedy,hf_prompt_lookup:3,plain,context_ngram:1:3,bigram:1:1,"
                   "mixed:1:3,mixed:2:3,mixed:4:4,mixed:10:10")
GRID_K, GRID_W = (1, 2, 4, 8, 16), (1, 2, 4, 8)


@dataclass
class MethodRun:
    name: str  # see the module docstring
    outputs: list[list[int]] = field(default_factory=list)
    seconds: float = 0.0
    stats: RequestStats = field(default_factory=RequestStats)  # summed over prompts (ours only)
    counts: AcceptanceCounts = field(default_factory=AcceptanceCounts)  # histograms summed over prompts

    @property
    def drafter_k_w(self) -> tuple[str, int, int]:
        """(drafter or method, k, w); for hf_assisted/self_draft k is the draft's layer count L."""
        parts = self.name.split(":")
        if parts[0] == "plain":
            return "none", 1, 0
        if parts[0] in ("hf_greedy", "hf_sample"):
            return parts[0], 1, 0
        if parts[0] == "hf_prompt_lookup":
            return parts[0], 1, int(parts[1])
        k, w = (AUTO_MAX[axis] if value == "auto" else int(value) for axis, value in zip("kw", parts[1:3]))
        return parts[0], k, w

    @property
    def auto(self) -> tuple[bool, bool]:
        """Whether k and w are chosen per step (DRAFTER:auto:auto, DRAFTER:1:auto, ...)."""
        parts = self.name.split(":")
        return len(parts) > 2 and parts[1] == "auto", len(parts) > 2 and parts[2] == "auto"

    @property
    def verify_mode(self) -> str:
        parts = self.name.split(":")
        return parts[3] if len(parts) > 3 else "batch"

    def add(self, stats: RequestStats | None) -> None:
        if stats is None:
            return
        self.counts.add(stats)
        self.stats.draft_step_seconds += stats.draft_step_seconds
        for name in ("num_target_calls", "num_verified_tokens", "num_checked_draft_tokens", "sum_acceptance_probability",
                     "num_draft_model_calls", "draft_seconds", "verify_seconds"):
            setattr(self.stats, name, getattr(self.stats, name) + getattr(stats, name))


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="humaneval")
    parser.add_argument("--limit", type=int, default=40)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--out", default="results.json")
    parser.add_argument("--model", default=ModelConfig().name)
    parser.add_argument("--methods", default=None, help=f"comma-separated; see above (default {DEFAULT_METHODS}; "
                                                       "with --grid: methods to run besides the grid's)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 is greedy")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--datastore", default="", help="datastore directory for rest:k:w and mixed+rest:k:w")
    parser.add_argument("--grid", action="store_true", help="sweep k x w for --grid-drafter and draw the heatmaps")
    parser.add_argument("--grid-drafter", default="mixed")
    parser.add_argument("--plots", default="", help="directory for the --grid plots (default: next to --out)")
    parser.add_argument("--throughput", action="store_true",
                        help="instead: generated tokens/s of batched generation per --batch size, for hf_greedy "
                             "(generate with left padding), plain and --spec, all with the same batch size")
    parser.add_argument("--batch", default="1,4,8", help="--throughput batch sizes (requests per call)")
    parser.add_argument("--spec", default="context_ngram:auto:auto", help="--throughput: our speculative method(s), comma-separated")
    parser.add_argument("--max-batch-tokens", type=int, default=0, help="--throughput: tokens per call cap (0: none)")
    parser.add_argument("--engine", choices=("transformers", "vllm"), default="transformers",
                        help="--throughput on vllm: vLLM plain, vllm_ngram (and vllm_suffix where arctic-inference is "
                             "installed) and --spec on vLLM, beside --reference on the transformers engine")
    parser.add_argument("--reference", default="context_ngram:auto:auto",
                        help="--throughput --engine vllm: our transformers engine's method(s) run beside (\"\": none)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="--engine vllm: model dtype")
    parser.add_argument("--rounds", type=int, default=1,
                        help="--engine vllm: runs per batch size, each on --limit prompts no earlier run used; tokens/s is the median")
    parser.add_argument("--pipeline", action="store_true",
                        help="instead: the same prompts through the Ray job and in-process, with the "
                             "decoder of --config, compared in tokens/s after start-up")
    parser.add_argument("--config", default="configs/default.yaml", help="decoder settings for --pipeline")
    return parser.parse_args(argv)


def build_runners(names: list[str], loaded, args) -> dict:
    """One callable per method: (prompt ids, SamplingParams) -> (generated ids, RequestStats or None)."""
    model, n = loaded.model, args.max_new_tokens
    runners = {}
    for name in names:
        method, k, w = MethodRun(name).drafter_k_w
        if method in ("hf_greedy", "hf_sample"):
            runners[name] = lambda ids, s: (hf_generate(model, ids, n, s), None)
        elif method == "hf_prompt_lookup":
            runners[name] = lambda ids, s, w=w: (hf_generate(model, ids, n, s, prompt_lookup_num_tokens=w), None)
        elif method == "hf_assisted":
            assistant = self_draft_model(model, k)
            assistant.generation_config.num_assistant_tokens = w
            assistant.generation_config.num_assistant_tokens_schedule = "constant"
            runners[name] = lambda ids, s, a=assistant: (hf_generate(model, ids, n, s, assistant_model=a), None)
        else:
            decoder = make_decoder(name, loaded, args)
            runners[name] = lambda ids, s, decoder=decoder: _ours(decoder, ids, n, s)
    return runners


def make_decoder(name: str, loaded, args) -> SpeculativeDecoder:
    """Our decoder for a method name: plain, self_draft:L:G or DRAFTER:k:w[:tree]."""
    run = MethodRun(name)
    method, k, w = run.drafter_k_w
    auto_k, auto_w = run.auto
    if method == "self_draft":
        config = DecoderConfig(drafter="draft_model", k=1, w=w, draft_layers=k, max_new_tokens=args.max_new_tokens)
    else:
        datastore = args.datastore if method in ("rest", "mixed+rest") else ""
        config = DecoderConfig(drafter=method.removesuffix("+rest"), k=k, w=w, max_new_tokens=args.max_new_tokens,
                               datastore=datastore, verify=run.verify_mode, auto_k=auto_k, auto_w=auto_w)
    model_config = ModelConfig(name=args.model)
    tables = build_tables(loaded.model, loaded.tokenizer, loaded.fingerprint, config, cache_root(model_config))
    return build_decoder(config, model_config, loaded, tables)


def _ours(decoder: SpeculativeDecoder, ids: list[int], max_new_tokens: int, sampling: SamplingParams):
    result = decoder.generate(ids, max_new_tokens, sampling=sampling)
    return result.token_ids, result.stats


@torch.no_grad()
def hf_generate(model, ids: list[int], max_new_tokens: int, sampling: SamplingParams = GREEDY,
                **kwargs) -> list[int]:
    inputs = torch.tensor([ids])
    if not sampling.greedy:
        torch.manual_seed(sampling.seed)
        kwargs.update(do_sample=True, temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k)
    else:
        kwargs.update(do_sample=False)
    with attention_implementation(model, "sdpa"):  # what a user of generate gets
        output = model.generate(inputs, attention_mask=torch.ones_like(inputs), max_new_tokens=max_new_tokens, **kwargs)
    return output[0, len(ids):].tolist()


def predicted_speedup(alpha: float, gamma: int, c: float) -> float:
    """Leviathan et al. 2023, Theorem 3.8: expected walltime improvement over plain decoding, with
    c = draft-call time / plain target-call time, and a verification call priced as a plain one."""
    if alpha >= 1:
        return (gamma + 1) / (gamma * c + 1)
    return (1 - alpha ** (gamma + 1)) / ((1 - alpha) * (gamma * c + 1))


def predicted_with_verify_cost(alpha: float, gamma: int, t_draft: float, t_verify: float, t_plain: float) -> float:
    """The same expectation with the measured price of a (γ+1)-token verification call: on a CPU
    it costs more than a plain call, which the theorem's setting (a memory-bound GPU) ignores."""
    expected_tokens = gamma + 1 if alpha >= 1 else (1 - alpha ** (gamma + 1)) / (1 - alpha)
    return expected_tokens * t_plain / (gamma * t_draft + t_verify)


def draft_model_predictions(stats: RequestStats, gamma: int, plain: MethodRun | None) -> dict:
    if stats.alpha is None or not stats.num_draft_model_calls or plain is None or not plain.stats.num_target_calls:
        return {}
    t_draft = stats.draft_seconds / stats.num_draft_model_calls
    t_verify = stats.verify_seconds / stats.num_target_calls
    t_plain = plain.stats.verify_seconds / plain.stats.num_target_calls
    return {"c_vs_plain_call": round(t_draft / t_plain, 4),
            "verify_call_vs_plain_call": round(t_verify / t_plain, 3),
            "predicted_speedup_vs_plain": round(predicted_speedup(stats.alpha, gamma, t_draft / t_plain), 3),
            "predicted_with_verify_cost_vs_plain": round(
                predicted_with_verify_cost(stats.alpha, gamma, t_draft, t_verify, t_plain), 3)}


def summarize(runs: list[MethodRun], reference: MethodRun, plain: MethodRun | None, greedy: bool) -> list[dict]:
    """Speed-ups against `reference` (hf_greedy or hf_sample). Identity is checked against the
    reference when greedy; when sampling, against our plain sampling with the same seeds."""
    def rate(run):
        return sum(map(len, run.outputs)) / run.seconds

    identity_reference = reference if greedy else plain
    results = []
    for run in runs:
        method, k, w = run.drafter_k_w
        stats = run.stats
        generated = sum(len(o) for o in run.outputs)
        result = {
            "method": run.name, "k": k, "w": w, "prompts": len(run.outputs), "generated_tokens": generated,
            "tokens_per_second": round(rate(run), 3),
            "tokens_per_call": round(generated / stats.num_target_calls, 3) if stats.num_target_calls else None,
            "verified_tokens_per_call": round(stats.num_verified_tokens / stats.num_target_calls, 2)
            if stats.num_target_calls else None,
            "median_draft_ms": None if stats.median_draft_seconds is None else round(1e3 * stats.median_draft_seconds, 3),
            "alpha": None if stats.alpha is None else round(stats.alpha, 4),
            "draft_cost_ratio": None if stats.draft_cost_ratio is None else round(stats.draft_cost_ratio, 4),
            "identical_fraction": None if identity_reference is None else round(
                sum(a == b for a, b in zip(run.outputs, identity_reference.outputs)) / len(run.outputs), 4),
            f"speedup_vs_{reference.name}": round(rate(run) / rate(reference), 3),
            "speedup_vs_plain": None if plain is None else round(rate(run) / rate(plain), 3),
            "predicted_speedup_vs_plain": None,
            **{name: getattr(run.counts, name) for name in ("accepted_length_histogram", "accepted_rank_histogram",
                                                            "strategy_rows", "strategy_wins")},
        }
        if method == "self_draft":
            result.update(draft_model_predictions(stats, w, plain))
        results.append(result)
    return results


def datastore_summary(directory: str) -> dict | None:
    if not directory:
        return None
    from drafters.datastore import Datastore

    meta = Datastore.open(directory).meta
    return {"directory": directory, **{key: meta.get(key) for key in ("num_tokens", "num_documents", "bytes_on_disk")}}


def markdown(results: list[dict], reference: str) -> str:
    def show(value, digits=3):
        return "-" if value is None else f"{value:.{digits}f}"

    lines = [f"| method | k/L | w/γ | tokens/s | tokens/call | fed/call | draft ms | α | c | identical "
             f"| vs {reference} | vs plain | predicted vs plain (theorem; with verify cost) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['method']} | {r['k']} | {r['w']} | {r['tokens_per_second']:.2f} | "
                     f"{show(r['tokens_per_call'], 2)} | {show(r['verified_tokens_per_call'], 1)} | "
                     f"{show(r['median_draft_ms'], 2)} | {show(r['alpha'])} | {show(r.get('c_vs_plain_call'))} | "
                     f"{show(r['identical_fraction'], 2)} | {r[f'speedup_vs_{reference}']:.3f} | "
                     f"{show(r['speedup_vs_plain'])} | {show(r['predicted_speedup_vs_plain'])}; "
                     f"{show(r.get('predicted_with_verify_cost_vs_plain'))} |")
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
    size = config.ray.batch_size  # the same batches as the job's actor gets
    started = time.perf_counter()
    tables = [stage({"id": [p.request_id for p in prompts[i:i + size]], "prompt": [p.prompt for p in prompts[i:i + size]]})
              for i in range(0, len(prompts), size)]
    in_process_seconds = time.perf_counter() - started
    in_process_tokens = sum(sum(table.column("num_generated_tokens").to_pylist()) for table in tables)
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


def method_names(args) -> list[str]:
    names = [n.strip() for n in (args.methods or ("" if args.grid else DEFAULT_METHODS)).split(",") if n.strip()]
    if args.grid:
        drafter = args.grid_drafter
        grid = ["hf_prompt_lookup:10", "plain", f"{drafter}:auto:auto"]
        grid += [f"{drafter}:{k}:{w}" for k in GRID_K for w in GRID_W]
        names = grid + [name for name in names if name not in grid]
    reference = "hf_greedy" if args.temperature == 0 else "hf_sample"
    if reference not in names:
        names.insert(0, reference)  # the reference for speed-up (and identity when greedy)
    return names


def run_dataset(dataset: str, names: list[str], runners: dict, loaded, args) -> dict:
    prompts = load_prompts(dataset, args.limit)
    base = SamplingParams(args.temperature, args.top_k, args.top_p, args.seed)
    reference = names[0] if names[0] in ("hf_greedy", "hf_sample") else ("hf_greedy" if base.greedy else "hf_sample")
    runs = {name: MethodRun(name) for name in names}
    for index, prompt in enumerate(prompts):
        ids = encode_prompt(loaded.tokenizer, prompt.prompt, prompt.request_id)
        sampling = SamplingParams(base.temperature, base.top_k, base.top_p, request_seed(args.seed, prompt.request_id))
        rotation = index % len(names)
        for name in names[rotation:] + names[:rotation]:
            started = time.perf_counter()
            output, stats = runners[name](ids, sampling)
            runs[name].seconds += time.perf_counter() - started
            runs[name].outputs.append(output)
            runs[name].add(stats)
        print(f"{dataset}: prompt {index + 1}/{len(prompts)} done", flush=True)
    results = summarize(list(runs.values()), runs[reference], runs.get("plain"), base.greedy)
    print(markdown(results, reference))
    return {"dataset": dataset, "limit": args.limit, "max_new_tokens": args.max_new_tokens, "model": args.model,
            "datastore": datastore_summary(args.datastore),
            "sampling": {"temperature": args.temperature, "top_p": args.top_p, "top_k": args.top_k, "seed": args.seed},
            "runs": results}


def grid_plots(report: dict, drafter: str, out: Path) -> dict:
    """Figures 3, 5 and 4 for one dataset's grid; returns the best fixed (k, w) and auto's numbers."""
    runs = {run["method"]: run for run in report["runs"]}
    reference = "hf_greedy" if "hf_greedy" in runs else "hf_sample"
    speedup = f"speedup_vs_{reference}"
    def table(key):
        return np.array([[runs[f"{drafter}:{k}:{w}"][key] or np.nan for w in GRID_W] for k in GRID_K])  # [K, W]
    name = report["dataset"].replace("/", "_")
    labels = ([str(k) for k in GRID_K], [str(w) for w in GRID_W])
    auto, plain = runs[f"{drafter}:auto:auto"], runs["plain"]
    save_heatmap(table("tokens_per_call"), *labels, out / f"{name}_tokens_per_call.png",
                 f"{report['dataset']}: tokens per call, {drafter}\n(auto: {auto['tokens_per_call']:.2f})", fmt=".2f")
    save_heatmap(table(speedup), *labels, out / f"{name}_speedup.png",
                 f"{report['dataset']}: speed-up vs {reference}, {drafter}\n"
                 f"(auto {auto[speedup]:.2f}, plain {plain[speedup]:.2f})", fmt=".2f")
    best = max((runs[f"{drafter}:{k}:{w}"] for k in GRID_K for w in GRID_W), key=lambda run: run[speedup])
    largest = runs[f"{drafter}:{GRID_K[-1]}:{GRID_W[-1]}"]
    groups = {f"best fixed {best['k']}:{best['w']}": best, "auto": auto, f"{largest['k']}:{largest['w']}": largest}
    save_acceptance_plots({label: AcceptanceCounts.total([run]) for label, run in groups.items()}, out, f"{name}_")
    return {"best_fixed": best["method"], "best_fixed_speedup": best[speedup], "auto_speedup": auto[speedup],
            "plain_speedup": plain[speedup], "hf_prompt_lookup_speedup": runs["hf_prompt_lookup:10"][speedup],
            "auto_vs_best_fixed": round(auto[speedup] / best[speedup], 3),
            "auto_vs_plain": round(auto[speedup] / plain[speedup], 3),
            "auto_vs_hf_prompt_lookup": round(auto[speedup] / runs["hf_prompt_lookup:10"][speedup], 3)}


@torch.no_grad()
def hf_generate_batch(model, batch: list[list[int]], max_new_tokens: int, pad: int, eos: set[int],
                      attention: str = "sdpa") -> list[list[int]]:
    """transformers' greedy generate over a left-padded batch (on transformers' default attention
    unless told); each output is cut after its EOS."""
    width = max(map(len, batch))
    inputs = torch.tensor([[pad] * (width - len(ids)) + ids for ids in batch])  # [B, width]
    mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in batch])  # [B, width]
    with attention_implementation(model, attention):
        output = model.generate(inputs, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                                pad_token_id=pad)[:, width:].tolist()
    return [row[:next((i + 1 for i, token in enumerate(row) if token in eos), len(row))] for row in output]


def throughput_comparison(args, loaded) -> dict:
    """Generated tokens/s per batch size for hf_greedy batched, ours plain and ours speculative,
    each checked token-identical to single-request greedy (ours, plain, one request at a time)."""
    from pipeline.batched_decoder import BatchedDecoder, Request

    prompts = [encode_prompt(loaded.tokenizer, p.prompt, p.request_id) for p in load_prompts(args.dataset, args.limit)]
    n = args.max_new_tokens
    plain = make_decoder("plain", loaded, args)
    specs = {name: make_decoder(name, loaded, args) for name in args.spec.split(",")}
    eos = plain.rules.eos_ids
    pad = loaded.tokenizer.pad_token_id if loaded.tokenizer.pad_token_id is not None else min(eos)

    def ours(decoder, size):
        results = BatchedDecoder(decoder, size, args.max_batch_tokens).generate_many(
            Request(str(i), ids, n) for i, ids in enumerate(prompts))
        ordered = sorted(results, key=lambda pair: int(pair[0].request_id))
        return [result.token_ids for _, result in ordered], [result.stats for _, result in ordered]

    def hf(size, attention="sdpa"):
        outputs = []
        for start in range(0, len(prompts), size):
            outputs += hf_generate_batch(loaded.model, prompts[start:start + size], n, pad, eos, attention)
        return outputs, []

    started = time.perf_counter()
    reference = [plain.generate(ids, n).token_ids for ids in prompts]  # single-request greedy
    reference_seconds = time.perf_counter() - started
    rows = [{"batch": 1, "method": "plain (one request at a time)", "seconds": round(reference_seconds, 2),
             "tokens_per_second": round(sum(map(len, reference)) / reference_seconds, 3), "identical_fraction": 1.0}]
    # hf_greedy: generate as its users get it; hf_greedy_gqa: generate on our engine's attention call.
    methods = {"hf_greedy": hf, "hf_greedy_gqa": lambda size: hf(size, GQA_ATTENTION),
               "plain": lambda size: ours(plain, size)}
    methods.update({name: lambda size, decoder=decoder: ours(decoder, size) for name, decoder in specs.items()})
    for index, size in enumerate(int(b) for b in args.batch.split(",")):
        names = list(methods)
        shift = index % len(names)
        for name in names[shift:] + names[:shift]:  # rotated per batch size
            started = time.perf_counter()
            outputs, stats = methods[name](size)
            seconds = time.perf_counter() - started
            calls = sum(s.num_target_calls for s in stats)
            rows.append({"batch": size, "method": name, "seconds": round(seconds, 2),
                         "tokens_per_second": round(sum(map(len, outputs)) / seconds, 3),
                         "identical_fraction": round(sum(a == b for a, b in zip(outputs, reference)) / len(prompts), 4),
                         "tokens_per_call": round(sum(map(len, outputs)) / calls, 3) if calls else None,
                         "fed_per_call": round(sum(s.num_verified_tokens for s in stats) / calls, 2) if calls else None})
            print(json.dumps(rows[-1]), flush=True)
    for row in rows:
        same = {r["method"]: r["tokens_per_second"] for r in rows if r["batch"] == row["batch"]}
        if "hf_greedy" in same:
            row["vs_hf_greedy_same_batch"] = round(row["tokens_per_second"] / same["hf_greedy"], 3)
        if "plain" in same:
            row["vs_plain_same_batch"] = round(row["tokens_per_second"] / same["plain"], 3)
    return {"prompts": len(prompts), "max_new_tokens": n, "spec": args.spec, "runs": rows}


def throughput_markdown(report: dict) -> str:
    lines = ["| batch | method | tokens/s | tokens/call | fed/call | identical | vs hf_greedy (same B) | vs plain (same B) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in report["runs"]:
        lines.append(f"| {r['batch']} | {r['method']} | {r['tokens_per_second']:.2f} | {r.get('tokens_per_call') or '-'} | "
                     f"{r.get('fed_per_call') or '-'} | {r['identical_fraction']:.2f} | "
                     f"{r.get('vs_hf_greedy_same_batch', '-')} | {r.get('vs_plain_same_batch', '-')} |")
    return "\n".join(lines)


def engine_comparison(args) -> dict:
    """--throughput --engine vllm: every method through the engine a job would build for it."""
    import importlib.util

    from pipeline import comparison

    names = ["plain", "vllm_ngram"] + (["vllm_suffix"] if importlib.util.find_spec("arctic_inference") else [])
    if "vllm_suffix" not in names:
        print("vllm_suffix: not run (arctic-inference is not installed: make install-suffix)", flush=True)
    names += [name for name in args.spec.split(",") if name.strip()]
    names += [f"transformers:{name}" for name in args.reference.split(",") if name.strip()]
    batches = [int(b) for b in args.batch.split(",")]
    needed = args.limit * args.rounds * len(batches)
    prompts = [p.prompt for p in load_prompts(args.dataset, needed)]
    if args.rounds < 1 or len(prompts) < needed:
        raise SystemExit(f"--rounds {args.rounds} x --batch {args.batch} x --limit {args.limit} needs {needed} prompts "
                         f"(every run new ones); {args.dataset} has {len(prompts)}")
    base = [f"model.name={json.dumps(args.model)}", f"model.dtype={args.dtype}", "engine.cpu_kv_cache_gib=1"]
    report = comparison.compare(base, comparison.parse_methods(",".join(names), "vllm"), prompts, batches,
                                args.max_new_tokens, args.rounds)
    return {"dataset": args.dataset, "model": args.model, "dtype": args.dtype, **report}


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.throughput and args.engine == "vllm":
        from pipeline.comparison import markdown as comparison_markdown

        report = engine_comparison(args)
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
        print(comparison_markdown(report))
        return report
    if args.throughput:
        loaded = load_model(ModelConfig(name=args.model))
        report = {"dataset": args.dataset, "model": args.model, "throughput": throughput_comparison(args, loaded)}
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
        print(throughput_markdown(report["throughput"]))
        return report
    if args.pipeline:
        report = {"dataset": args.dataset, "model": args.model, "pipeline": pipeline_comparison(args)}
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
        print(json.dumps(report, indent=2))
        return report
    loaded = load_model(ModelConfig(name=args.model))
    names = method_names(args)
    runners = build_runners(names, loaded, args)
    reports = [run_dataset(dataset, names, runners, loaded, args) for dataset in args.dataset.split(",")]
    if args.grid:
        plots = Path(args.plots) if args.plots else Path(args.out).parent / "plots"
        plots.mkdir(parents=True, exist_ok=True)
        for report in reports:
            report["grid"] = grid_plots(report, args.grid_drafter, plots)
            print(f"{report['dataset']}: {json.dumps(report['grid'])}")
    result = reports[0] if len(reports) == 1 else {"datasets": reports}
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
