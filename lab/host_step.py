"""The host's time per engine step: what vLLM's async scheduling hides on a GPU.

    python -m lab host-step --batch 16,64,256 --max-new-tokens 32 --out host_step.json

vLLM plain (greedy, no drafts) on this CPU, B requests at once that all run their max tokens. Each
step's device work (the model's forward, its logits and the sampler: on a GPU, kernels) is timed
on the worker; what is left of the wall time is the host's: scheduling, preparing the inputs,
taking the outputs in. With async scheduling vLLM runs that while the GPU runs the step before;
without it (our `custom_class` proposer, vLLM's `suffix`) the GPU waits for it every step:

    host seconds per step = (wall seconds - device seconds) / steps

It is this machine's CPU (2 cores shared with the "device" work): a GPU host's cores are faster,
so the figure is an upper bound there. The replay's projection takes it as --host-step.
"""

from __future__ import annotations

import time

import numpy as np

from jobs.benchmark.arguments import integers
from jobs.benchmark.report import markdown_table

PROMPT = "Write a long, detailed story about a lighthouse keeper number {i} and the ships that pass."


def timed(obj, name: str, totals: dict, counts_steps: bool = False) -> None:
    """Wraps obj.name so its calls add their seconds to totals['device'] (and, if `counts_steps`,
    count totals['calls']: one per engine step)."""
    inner = getattr(obj, name)

    def wrapper(*args, **kwargs):
        started = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            totals["device"] += time.perf_counter() - started
            totals["calls"] += counts_steps

    setattr(obj, name, wrapper)


TOTALS = {"device": 0.0, "calls": 0}


def instrument(worker) -> bool:
    runner = worker.model_runner
    timed(runner.model, "forward", TOTALS, counts_steps=True)  # the sampler's is a `forward` too: not counted
    timed(runner.model, "compute_logits", TOTALS)
    timed(runner.sampler, "forward", TOTALS)
    return True


def read_totals(worker) -> dict:
    return dict(TOTALS)


def measure(llm, batch: int, max_new_tokens: int) -> dict:
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=max_new_tokens, temperature=0.0, ignore_eos=True)
    prompts = [PROMPT.format(i=i) for i in range(batch)]
    before = llm.collective_rpc(read_totals)[0]
    started = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    wall = time.perf_counter() - started
    after = llm.collective_rpc(read_totals)[0]
    steps = after["calls"] - before["calls"]
    device = after["device"] - before["device"]
    assert all(len(o.outputs[0].token_ids) == max_new_tokens for o in outputs)
    return {
        "batch": batch,
        "steps": steps,
        "wall_seconds": round(wall, 4),
        "device_seconds": round(device, 4),
        "host_ms_per_step": round(1e3 * (wall - device) / steps, 3),
        "device_ms_per_step": round(1e3 * device / steps, 3),
    }


def add_cli_args(parser) -> None:
    parser.add_argument("--batch", type=integers, default=[16, 64, 256])
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)


def markdown(report: dict) -> str:
    return markdown_table(report["median"])


def run(args) -> dict:
    from pipeline.config import load_config
    from pipeline.engines.vllm import llvmlite_set_aside, set_vllm_environment
    from pipeline.loading.model import dtype_name, resolve_model_dir

    batches = args.batch
    config = load_config(None, ["engine.name=vllm", "vllm.execution=eager", f"vllm.max_num_seqs={max(batches)}"])
    set_vllm_environment(config)
    from vllm import LLM

    model_dir, _ = resolve_model_dir(config.model)
    with llvmlite_set_aside():
        llm = LLM(
            model=str(model_dir),
            tokenizer=str(model_dir),
            dtype=dtype_name(config.model),
            seed=0,
            enforce_eager=True,
            max_num_seqs=max(batches),
            max_model_len=512,
        )
    llm.collective_rpc(instrument)
    measure(llm, 4, 4)  # warm-up
    rows = [measure(llm, batch, args.max_new_tokens) for _ in range(args.rounds) for batch in batches]
    summary = [
        {
            "batch": b,
            "host_ms_per_step": round(float(np.median([r["host_ms_per_step"] for r in rows if r["batch"] == b])), 3),
            "device_ms_per_step": round(
                float(np.median([r["device_ms_per_step"] for r in rows if r["batch"] == b])), 3
            ),
        }
        for b in batches
    ]
    return {
        "model": config.model.name,
        "dtype": dtype_name(config.model),
        "max_new_tokens": args.max_new_tokens,
        "rows": rows,
        "median": summary,
    }
