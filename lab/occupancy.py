"""occupancy: the engine slots a feeding design keeps busy, simulated at any size.

    python -m lab occupancy RUN_DIR [RUN_DIR ...] --slots 256 --batch-size 64 \
        [--requests 20000] --out occupancy.json

No model runs: each request occupies a slot for as many engine steps as it generated tokens
(plain decoding; a run's `num_generated_tokens`, drawn with replacement), requests arrive in Ray
batches of --batch-size, and two designs are stepped side by side:
- `drain`: one batch in flight per actor; the next batch enters only when the last request of the
  one before has ended (the vLLM engine before it was fed continuously);
- `stream`: the design built (pipeline/engines/vllm/feeder.py): up to
  pipeline/engines/build.concurrent_batches batches in flight, requests admitted the moment a slot
  frees (the engine holds its slots plus 10 % + 1 waiting), each batch returned when its own
  requests end and replaced by the next.
Occupancy is the mean running requests per step over the slots, across the steps taken while
input remained (until the last batch was admitted), as the job's `engine_occupancy` counts it.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np

from jobs.benchmark.report import markdown_table
from pipeline.config import load_config
from pipeline.engines.build import concurrent_batches
from pipeline.engines.vllm import WAITING_SHARE


def add_cli_args(parser) -> None:
    parser.add_argument(
        "runs", nargs="+", metavar="RUN_DIR", help="runs whose output lengths the requests are drawn from"
    )
    parser.add_argument("--slots", type=int, default=256, help="the engine's slots (max_num_seqs)")
    parser.add_argument("--batch-size", type=int, default=64, help="rows per Ray batch")
    parser.add_argument("--requests", type=int, default=20000, help="requests drawn from the lengths")
    parser.add_argument("--seed", type=int, default=0)


def markdown(report: dict) -> str:
    return markdown_table(report["designs"])


def simulate(lengths: np.ndarray, slots: int, batch_size: int, batches_in_flight: int) -> float:
    """Occupancy of one engine fed `lengths` (steps per request, in arrival order) in Ray batches."""
    capacity = slots + math.ceil(WAITING_SHARE * slots) + 1 if batches_in_flight > 1 else slots
    batches = deque(np.array_split(lengths, math.ceil(len(lengths) / batch_size)))
    open_batches: dict[int, int] = {}  # batch number -> requests not yet ended
    waiting: deque = deque()  # (batch number, steps) handed to the actor, not yet in the engine
    engine: list[list[int]] = []  # [batch number, steps left], in admission order (the first `slots` run)
    number, running_sum, steps = 0, 0, 0
    while batches or waiting or engine:
        while batches and len(open_batches) < batches_in_flight:  # Ray hands the actor its next batch
            batch = batches.popleft()
            open_batches[number] = len(batch)
            waiting.extend((number, int(n)) for n in batch)
            number += 1
        while waiting and len(engine) < capacity:
            engine.append(list(waiting.popleft()))
        if not batches and not waiting:
            break  # input exhausted: what is left is the final drain
        running = engine[:slots]
        running_sum, steps = running_sum + len(running), steps + 1
        for request in running:
            request[1] -= 1
        for batch_number, _ in [r for r in running if r[1] <= 0]:
            open_batches[batch_number] -= 1
            if open_batches[batch_number] == 0:
                del open_batches[batch_number]
        engine = [r for r in engine if r[1] > 0]
    return running_sum / (steps * slots) if steps else float("nan")


def run(args) -> dict:
    lengths = run_lengths(args.runs)
    rng = np.random.default_rng(args.seed)
    drawn = np.maximum(rng.choice(lengths, size=args.requests), 1)
    config = load_config(
        None, ["engine.name=vllm", f"vllm.max_num_seqs={args.slots}", f"ray.batch_size={args.batch_size}"]
    )
    in_flight = concurrent_batches(config)
    rows = [
        {
            "design": "drain",
            "batches_in_flight": 1,
            "occupancy": round(simulate(drawn, args.slots, args.batch_size, 1), 4),
        },
        {
            "design": "stream",
            "batches_in_flight": in_flight,
            "occupancy": round(simulate(drawn, args.slots, args.batch_size, in_flight), 4),
        },
    ]
    return {
        "runs_read": args.runs,
        "answers": len(lengths),
        "requests": args.requests,
        "slots": args.slots,
        "batch_size": args.batch_size,
        "mean_length": round(float(lengths.mean()), 1),
        "designs": rows,
    }


def run_lengths(run_dirs: list[str]) -> np.ndarray:
    """Every successful row's num_generated_tokens in these runs' Parquet."""
    import pyarrow.parquet as pq

    from jobs.report import find_parts

    lengths = []
    for run_dir in run_dirs:
        table = pq.read_table(find_parts(run_dir), columns=["num_generated_tokens", "error"])
        lengths += [
            n
            for n, error in zip(table.column("num_generated_tokens").to_pylist(), table.column("error").to_pylist())
            if error is None and n
        ]
    if not lengths:
        raise SystemExit(f"occupancy: no generated rows in {', '.join(run_dirs)}")
    return np.array(lengths)
