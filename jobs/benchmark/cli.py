"""The benchmark's command line (python -m jobs.benchmark): its options, and the mode they pick
(jobs/benchmark/__init__.py lists the modes)."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import jobs.benchmark
from jobs.benchmark.comparison import engine_comparison
from jobs.benchmark.comparison import markdown as comparison_markdown
from jobs.benchmark.feeding import feeding_comparison, feeding_markdown
from jobs.benchmark.grid import grid_plots, method_names
from jobs.benchmark.occupancy import occupancy_comparison
from jobs.benchmark.pipeline_overhead import pipeline_comparison
from jobs.benchmark.quality import DEFAULT_METHODS, build_runners, run_dataset
from jobs.benchmark.replay import replay_comparison
from jobs.benchmark.sampling import sampling_comparison, sampling_markdown
from jobs.benchmark.throughput import throughput_comparison, throughput_markdown
from pipeline.config import ModelConfig
from pipeline.engines.transformers import use_gqa_attention
from pipeline.model_loading import load_model


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m jobs.benchmark", description=jobs.benchmark.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="humaneval",
                        help="humaneval, gsm8k, sharegpt, a corpus task (corpus-extract-json, corpus-rewrite-code, "
                             "corpus-edit-text, corpus-summarize) or a JSONL file with a 'prompt' per line")
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
    parser.add_argument("--plots", default="", help="directory for the --grid plots (default: next to --out) and --replay's calibration plot (default: none)")
    parser.add_argument("--throughput", action="store_true",
                        help="instead: generated tokens/s of batched generation per --batch size, for hf_greedy "
                             "(generate with left padding), plain and --spec, all with the same batch size")
    parser.add_argument("--batch", default="1,4,8", help="--throughput and --replay: batch sizes (requests per call; running requests)")
    parser.add_argument("--spec", default="batch_suffix:1:auto",
                        help="--throughput: our speculative method(s), comma-separated (the default drafter; runs on either engine)")
    parser.add_argument("--json-schema", action="store_true",
                        help="--throughput --engine vllm: every request carries its corpus task's JSON schema as "
                             "structured_outputs, for every method (corpus-extract-json)")
    parser.add_argument("--max-batch-tokens", type=int, default=0, help="--throughput: tokens per call cap (0: none)")
    parser.add_argument("--engine", choices=("transformers", "vllm"), default="transformers",
                        help="--throughput on vllm: vLLM plain, vllm_ngram (and vllm_suffix where arctic-inference is "
                             "installed) and --spec on vLLM, beside --reference on the transformers engine")
    parser.add_argument("--reference", default="context_ngram:auto:auto",
                        help="--throughput --engine vllm: our transformers engine's method(s) run beside (\"\": none)")
    parser.add_argument("--dtype", default="float32", choices=("auto", "float32", "bfloat16"),
                        help="--engine vllm and --feeding: model dtype")
    parser.add_argument("--rounds", type=int, default=1,
                        help="--engine vllm: runs per batch size, each on --limit prompts no earlier run used; tokens/s is the median")
    parser.add_argument("--per-call", type=int, default=0,
                        help="--engine vllm: requests per generate call (0: the batch size, each call draining from B "
                             "running requests to 1; a multiple of B keeps B running for most of the call, as a job does)")
    parser.add_argument("--pipeline", action="store_true",
                        help="instead: the same prompts through the Ray job and in-process, with the "
                             "decoder of --config, compared in tokens/s after start-up")
    parser.add_argument("--config", default="configs/default.yaml", help="decoder settings for --pipeline")
    parser.add_argument("--feeding", action="store_true",
                        help="instead: the same prompts through vLLM's LLM.generate at once, our job and ray.data.llm, "
                             "for --spec (plain is always run); engine slots --max-num-seqs, Ray batches --batch-size")
    parser.add_argument("--max-num-seqs", type=int, default=16, help="--feeding: the engine's slots")
    parser.add_argument("--batch-size", type=int, default=16, help="--feeding: rows per Ray batch")
    parser.add_argument("--ways", default="llm_generate,job,ray_data_llm",
                        help="--feeding: which of llm_generate, feeder, job, ray_data_llm, processor to run (llm_generate always runs: "
                             "it is the reference)")
    parser.add_argument("--sampling", action="store_true",
                        help="instead: sampled rows (--temperature, --top-k, --top-p, seeds from --seed) of vLLM plain, "
                             "vllm_ngram and --spec checked against the model's distribution (engine slots --batch-size)")
    parser.add_argument("--occupancy", default="", metavar="RUN_DIR[,RUN_DIR]",
                        help="instead: simulate the feeding designs' occupancy with these runs' output lengths")
    parser.add_argument("--slots", type=int, default=256, help="--occupancy: the engine's slots (max_num_seqs)")
    parser.add_argument("--requests", type=int, default=20000, help="--occupancy: requests drawn from the lengths")
    parser.add_argument("--replay", default="", metavar="RUN_DIR[,RUN_DIR]",
                        help="instead: replay these greedy runs' outputs through drafters, no model (jobs/benchmark/replay.py)")
    parser.add_argument("--store", default="", help="--replay: an earlier runs' datastore (jobs.build_datastore)")
    parser.add_argument("--max-draft", type=int, default=16, help="--replay: draft tokens per request-step, at most")
    parser.add_argument("--ngram-min", type=int, default=2, help="--replay: vllm_ngram's shortest n-gram")
    parser.add_argument("--ngram-max", type=int, default=4, help="--replay: vllm_ngram's longest n-gram")
    parser.add_argument("--project", default="a100-8b", help="--replay: GPU-model for the roofline projection "
                        "(a100|h100 - 8b|70b; empty: none), or `cpu`: this CPU's vLLM engine as --host-step "
                        "measured it; adds ours with that step budget")
    parser.add_argument("--step-costs", default="", metavar="GPU_STEP_JSON",
                        help="--replay: step costs measured on that GPU (python -m jobs.benchmark.gpu_step) "
                             "for the projection and the budget, instead of the roofline")
    parser.add_argument("--host-step", default="", metavar="HOST_STEP_JSON",
                        help="--replay: the host's time per step (python -m jobs.benchmark.host_step), which "
                             "async scheduling hides: the projection compares with plain vLLM with and without it "
                             "(with --project cpu: the CPU's whole step, host and device)")
    return parser.parse_args(argv)


def write(report: dict, out: str) -> dict:
    Path(out).write_text(json.dumps(report, indent=2) + "\n")
    return report


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.throughput and args.engine == "vllm":
        report = write(engine_comparison(args), args.out)
        print(comparison_markdown(report))
        return report
    if args.sampling:
        report = write(sampling_comparison(args), args.out)
        print(sampling_markdown(report))
        return report
    if args.replay:
        report = write(replay_comparison(args), args.out)
        print(json.dumps(report, indent=2))
        return report
    if args.occupancy:
        report = write(occupancy_comparison(args), args.out)
        print(json.dumps(report, indent=2))
        return report
    if args.feeding:
        report = write(feeding_comparison(args), args.out)
        print(feeding_markdown(report))
        return report
    if args.pipeline:
        report = write({"dataset": args.dataset, "model": args.model, "pipeline": pipeline_comparison(args)}, args.out)
        print(json.dumps(report, indent=2))
        return report
    loaded = load_model(ModelConfig(name=args.model))
    use_gqa_attention(loaded.model)  # the model as the transformers engine runs it; baselines switch back
    if args.throughput:
        report = write({"dataset": args.dataset, "model": args.model,
                        "throughput": throughput_comparison(args, loaded)}, args.out)
        print(throughput_markdown(report["throughput"]))
        return report
    names = method_names(args)
    runners = build_runners(names, loaded, args)
    reports = [run_dataset(dataset, names, runners, loaded, args) for dataset in args.dataset.split(",")]
    if args.grid:
        plots = Path(args.plots) if args.plots else Path(args.out).parent / "plots"
        plots.mkdir(parents=True, exist_ok=True)
        for report in reports:
            report["grid"] = grid_plots(report, args.grid_drafter, plots)
            print(f"{report['dataset']}: {json.dumps(report['grid'])}")
    return write(reports[0] if len(reports) == 1 else {"datasets": reports}, args.out)
