"""feeding: how full the engine is kept, our job against vLLM's ideal and ray.data.llm.

    python -m lab feeding --dataset humaneval --limit 96 --max-new-tokens 256 \
        --max-num-seqs 16 --batch-size 16 --spec plain,batch_suffix:1:auto --out feeding.json

The same prompts and engine settings (max_num_seqs, dtype, eager, KV cache) three ways, for each
--spec method:
- `llm_generate`: vLLM's own LLM.generate over all of them at once (continuous batching over the
  whole set: the ideal), on the engine our job builds, in this process;
- `feeder`: our engine's streaming feeder in this process, no Ray: the prompts cut into batches of
  --batch-size, as many handed to VllmEngine.generate at once from threads as a job's actor would
  (concurrent_batches); what feeding costs by itself, apart from Ray's;
- `job`: our Ray job end to end (pipeline/job/ray_job.py), Ray batches of --batch-size;
- `ray_data_llm`: ray.data.llm's processor (build_processor, vLLMEngineProcessorConfig) with the
  same engine settings and Ray batches, fed the same token ids: plain, and vLLM's own methods
  (`vllm_suffix`, `vllm_ngram`) as its users configure them (`engine_kwargs.speculative_config`);
- `processor`: the same program through ours (pipeline.llm), the method as `drafting` (plain and ours).
Tokens/s are over each one's generation span (engine start-up left out): LLM.generate's call;
the job's first batch's start to its last batch's end; for the two processors, from the first
request's start (its finish less its time_taken_llm) to the last request's finish. Occupancy is the job's
measured engine_occupancy (the others do not expose their steps). Outputs are compared with
LLM.generate's plain ones, prompt by prompt.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

from jobs.benchmark.arguments import add_prompt_args
from jobs.benchmark.datasets import encode_prompt, load_prompts
from jobs.benchmark.engines import Method, parse_methods
from jobs.benchmark.report import markdown_table
from pipeline.config import Config, load_config
from pipeline.config.drafter_kinds import VLLM_METHODS
from pipeline.engines.base import Request, engine_summary
from pipeline.engines.build import build_engine, checked_config

WAYS = ("llm_generate", "feeder", "job", "ray_data_llm", "processor")


def add_cli_args(parser) -> None:
    add_prompt_args(parser, limit=48)
    parser.add_argument(
        "--spec", default="batch_suffix:1:auto", help="methods on vLLM, comma-separated (plain runs always)"
    )
    parser.add_argument("--max-num-seqs", type=int, default=16, help="the engine's slots")
    parser.add_argument("--batch-size", type=int, default=16, help="rows per Ray batch")
    parser.add_argument(
        "--ways",
        default="llm_generate,job,ray_data_llm",
        help=f"which of {', '.join(WAYS)} to run (llm_generate always runs: it is the reference)",
    )
    parser.add_argument("--dtype", default="float32", choices=("auto", "float32", "bfloat16"))


def feeding_config(args, method: Method, output: str = "", input_path: str = "") -> Config:
    """The method's config on vLLM, as a job starts it (checked_config)."""
    return checked_config(
        load_config(
            None,
            [
                "engine.name=vllm",
                f"model.name={json.dumps(args.model)}",
                f"model.dtype={args.dtype}",
                "vllm.cpu_kv_cache_gib=2",
                f"vllm.max_num_seqs={args.max_num_seqs}",
                f"sampling.max_new_tokens={args.max_new_tokens}",
                f"ray.batch_size={args.batch_size}",
                "ray.num_cpus_per_actor=1",
                *method.overrides(),
                *(
                    [f"job.output={json.dumps(output)}", f"input.path={json.dumps(input_path)}", "input.limit=0"]
                    if output
                    else []
                ),
            ],
        )
    )


def run(args) -> dict:
    import ray

    ways = set(args.ways.split(","))
    if not ways <= set(WAYS):
        raise SystemExit(f"--ways: {args.ways!r}; choose from {', '.join(WAYS)}")
    # Ray before the in-process engine: Ray's workers (ray.data.llm's engine among them) must not
    # inherit the environment that building our engine sets in this process. (Token authentication
    # is on: jobs/benchmark/__main__.py sets it before anything imports Ray.)
    ray.init(num_cpus=2, include_dashboard=False)
    methods = parse_methods(args.spec, "vllm")
    methods = [Method("vllm", "plain")] + [m for m in methods if m.name != "plain"]  # plain first: the reference
    prompts = load_prompts(args.dataset, args.limit)
    work = Path(tempfile.mkdtemp(prefix="feeding-"))
    input_path = work / "prompts.jsonl"
    input_path.write_text("".join(json.dumps({"id": p.request_id, "prompt": p.prompt}) + "\n" for p in prompts))
    rows, reference = [], {}
    try:
        for method in methods:
            ideal, outputs, prompt_ids = llm_generate_row(args, method, prompts)
            reference = reference or outputs
            ideal["identical_fraction"] = identical(outputs, reference)
            rows.append(ideal)
            if "feeder" in ways:
                rows.append(feeder_row(args, method, prompts, reference))
            if "job" in ways:
                rows.append(
                    job_row(args, method, str(input_path), str(work / method.name.replace(":", "_")), reference)
                )
            vllms_own = method.name.split(":")[0] in VLLM_METHODS
            if "ray_data_llm" in ways and (method.name == "plain" or vllms_own):
                rows.append(ray_data_llm_row(args, method, prompts, prompt_ids, reference))
            if "processor" in ways and not vllms_own:
                rows.append(processor_row(args, method, prompts, prompt_ids, reference))
    finally:
        ray.shutdown()
    for row in rows:
        same = [r for r in rows if r["method"] == row["method"] and r["way"] == "llm_generate"]
        if same:
            row["vs_llm_generate"] = round(row["tokens_per_second"] / same[0]["tokens_per_second"], 3)
        fastest_rdl = max((r["tokens_per_second"] for r in rows if r["way"] == "ray_data_llm"), default=None)
        if fastest_rdl:  # against ray.data.llm's fastest method in this run
            row["vs_ray_data_llm"] = round(row["tokens_per_second"] / fastest_rdl, 3)
    return {
        "dataset": args.dataset,
        "prompts": len(prompts),
        "max_new_tokens": args.max_new_tokens,
        "max_num_seqs": args.max_num_seqs,
        "batch_size": args.batch_size,
        "runs": rows,
    }


def llm_generate_row(args, method: Method, prompts) -> tuple[dict, dict, dict]:
    """LLM.generate's row, its outputs and the prompts' token ids, by id."""
    engine = build_engine(feeding_config(args, method))
    ids = [encode_prompt(engine.tokenizer, p.prompt, p.request_id) for p in prompts]
    requests = [Request(p.request_id, prompt_ids, args.max_new_tokens) for p, prompt_ids in zip(prompts, ids)]
    started = time.perf_counter()
    results = engine.generate(requests, all_at_once(engine))
    seconds = time.perf_counter() - started
    outputs = {r.request_id: r.token_ids for r in results}
    tokens = sum(map(len, outputs.values()))
    engine.close()
    row = {
        "way": "llm_generate",
        "method": method.name,
        "tokens_per_second": round(tokens / seconds, 3),
        "generated_tokens": tokens,
        "engine_occupancy": None,
        "tokens_per_call": round(tokens / sum(r.stats.num_target_calls for r in results), 3),
    }
    return row, outputs, dict(zip((p.request_id for p in prompts), ids))


def all_at_once(engine):
    """vLLM's own LLM.generate over all the requests in one call, on the engine and its proposer
    (what continuous batching over a whole corpus gives: the feeding benchmark's ideal)."""
    llm = engine.feeder.llm

    def run(prompts, params):
        assert not any("lora_request" in prompt for prompt in prompts), "the benchmark's requests have no adapter"
        outputs = engine.feeder.call(lambda: llm.generate(prompts, params, use_tqdm=False))
        return outputs, (engine.feeder.call(lambda: engine.finished(outputs)) if engine.ours and outputs else {})

    return run


def feeder_row(args, method: Method, prompts, reference: dict) -> dict:
    from concurrent.futures import ThreadPoolExecutor

    from pipeline.engines.build import concurrent_batches

    config = feeding_config(args, method)
    engine = build_engine(config)
    requests = [
        Request(p.request_id, encode_prompt(engine.tokenizer, p.prompt, p.request_id), args.max_new_tokens)
        for p in prompts
    ]
    batches = [requests[i : i + args.batch_size] for i in range(0, len(requests), args.batch_size)]
    started = time.perf_counter()
    with ThreadPoolExecutor(concurrent_batches(config)) as pool:
        results = [r for batch in pool.map(engine.generate, batches) for r in batch]
    seconds = time.perf_counter() - started
    summary = engine_summary([engine.steps()])
    engine.close()
    outputs = {r.request_id: r.token_ids for r in results}
    tokens = sum(map(len, outputs.values()))
    return {
        "way": "feeder",
        "method": method.name,
        "tokens_per_second": round(tokens / seconds, 3),
        "generated_tokens": tokens,
        **summary,
        "tokens_per_call": round(tokens / sum(r.stats.num_target_calls for r in results), 3),
        "identical_fraction": identical(outputs, reference),
    }


def job_row(args, method: Method, input_path: str, output: str, reference: dict) -> dict:
    import pyarrow.parquet as pq

    from jobs.report import find_parts
    from pipeline.job.ray_job import run_job

    summary = run_job(feeding_config(args, method, output, input_path), "feeding")
    table = pq.read_table(find_parts(summary["run_dir"]), columns=["id", "generated_tokens"])
    outputs = dict(zip(table.column("id").to_pylist(), table.column("generated_tokens").to_pylist()))
    return {
        "way": "job",
        "method": method.name,
        "tokens_per_second": summary["tokens_per_second_after_startup"],
        "generated_tokens": summary["generated_tokens"],
        "engine_occupancy": summary["engine_occupancy"],
        "engine_steps": summary["engine_steps"],
        "engine_idle_seconds": summary["engine_idle_seconds"],
        "engine_drain_seconds": summary["engine_drain_seconds"],
        "tokens_per_call": summary["tokens_per_call"],
        "identical_fraction": identical(outputs, reference),
    }


def processor_run(llm, args, method: Method, prompts, prompt_ids: dict, **ours) -> tuple[dict, float]:
    """The same program through `llm` (ray.data.llm or pipeline.llm): the same engine settings, Ray
    batches and token ids. Its outputs by id, and its generation span: from the first request's
    start (its finish less its time_taken_llm) to the last request's finish."""
    import ray

    from pipeline.loading.model import resolve_model_dir

    config = feeding_config(args, method)
    model_dir, _ = resolve_model_dir(config.model)
    engine_kwargs = {
        "max_num_seqs": args.max_num_seqs,
        "dtype": "float32" if args.dtype == "auto" else args.dtype,
        "enforce_eager": True,
        "seed": 0,
        # on a CPU: the memory vLLM may take (the KV cache is VLLM_CPU_KVCACHE_SPACE's, as ours)
        "gpu_memory_utilization": 0.3,
    }
    decoder = config.drafting
    if decoder.drafter in VLLM_METHODS:  # vLLM's own method, as a ray.data.llm user configures it
        engine_kwargs["speculative_config"] = {
            "method": VLLM_METHODS[decoder.drafter],
            "num_speculative_tokens": decoder.w,
        }
    processor = llm.build_processor(
        llm.vLLMEngineProcessorConfig(
            model_source=str(model_dir),
            batch_size=args.batch_size,
            concurrency=1,
            engine_kwargs=engine_kwargs,
            runtime_env={"env_vars": {"VLLM_CPU_KVCACHE_SPACE": "2"}},
            chat_template_stage=False,
            tokenize_stage=False,
            detokenize_stage=False,
            placement_group_config={"bundles": [{"CPU": 1}]},
            log_engine_metrics=False,
            **ours,
        ),
        preprocess=lambda row: {
            "id": row["id"],
            "tokenized_prompt": row["tokenized_prompt"],
            "sampling_params": {"temperature": 0.0, "max_tokens": args.max_new_tokens},
        },
        postprocess=lambda row: {
            "id": row["id"],
            "generated_tokens": row["generated_tokens"],
            "time_taken_llm": row["time_taken_llm"],
            "finished_at": time.time(),
        },
    )
    items = [{"id": p.request_id, "tokenized_prompt": prompt_ids[p.request_id]} for p in prompts]
    out = processor(ray.data.from_items(items)).take_all()
    span = max(r["finished_at"] for r in out) - min(r["finished_at"] - r["time_taken_llm"] for r in out)
    return {r["id"]: list(r["generated_tokens"]) for r in out}, span


def ray_data_llm_row(args, method: Method, prompts, prompt_ids: dict, reference: dict) -> dict:
    import ray.data.llm

    outputs, span = processor_run(ray.data.llm, args, method, prompts, prompt_ids)
    tokens = sum(map(len, outputs.values()))
    return {
        "way": "ray_data_llm",
        "method": method.name,
        "tokens_per_second": round(tokens / span, 3),
        "generated_tokens": tokens,
        "engine_occupancy": None,
        "identical_fraction": identical(outputs, reference),
    }


def processor_row(args, method: Method, prompts, prompt_ids: dict, reference: dict) -> dict:
    import pipeline.llm

    # Our processor takes the engine's settings as ray.data.llm does, and the method's as `drafting`
    # (and `transformers`: k, one row on vLLM).
    config = feeding_config(args, method)
    decoder = {name: getattr(config.drafting, name) for name in ("drafter", "w", "auto_w")}
    rows = {name: getattr(config.transformers, name) for name in ("k", "auto_k")}
    outputs, span = processor_run(
        pipeline.llm,
        args,
        Method("vllm", "plain"),
        prompts,
        prompt_ids,
        drafting=decoder,
        transformers=rows,
        engine="vllm",
    )
    tokens = sum(map(len, outputs.values()))
    return {
        "way": "processor",
        "method": method.name,
        "tokens_per_second": round(tokens / span, 3),
        "generated_tokens": tokens,
        "engine_occupancy": None,
        "identical_fraction": identical(outputs, reference),
    }


def identical(outputs: dict, reference: dict) -> float:
    return round(sum(outputs.get(key) == value for key, value in reference.items()) / len(reference), 4)


def markdown(report: dict) -> str:
    return (
        f"{report['prompts']} prompts x {report['max_new_tokens']} new tokens, max_num_seqs "
        f"{report['max_num_seqs']}, Ray batches of {report['batch_size']}\n\n"
        + markdown_table(
            report["runs"],
            {
                "way": "way",
                "method": "method",
                "tokens_per_second": "tokens/s (generation span)",
                "tokens_per_call": "tokens/call",
                "engine_occupancy": "occupancy",
                "identical_fraction": "identical",
                "vs_llm_generate": "vs LLM.generate",
                "vs_ray_data_llm": "vs ray.data.llm",
            },
        )
    )
