"""How fast a host runs an engine step's bookkeeping: to carry the host time per step measured on
this CPU's vLLM (host_step.py) over to a GPU machine's host, where vLLM cannot run.

    python -m lab host-speed --batch 16,64,256 --out host_speed.json
    python -m lab host-speed --scale host_step_cpu.json --base host_speed_cpu.json \
        --out host_step_gpu_host.json     # on the GPU's host: host-step's figures x (there / here)

The work stands in for what a scheduler step does in Python per running request (append the
sampled token, count what is computed, order the requests, gather the next inputs into lists and
tensors, map request ids to outputs), one thread, no model. The projection's host time on another
host is then

    h_there(B) = h_here(B) x t_there(B) / t_here(B)

with t the fastest of `--rounds` runs of this work at B requests on each host. It is a proxy: the
ratio of single-threaded Python speed, not a measurement of vLLM there.
"""

from __future__ import annotations

import json
import time

from jobs.benchmark.arguments import integers
from jobs.benchmark.report import markdown_table


def requests_of(batch: int) -> list:
    return [
        {"id": f"r{i}", "tokens": list(range(i % 7, 300 + i % 7)), "computed": 300, "priority": 0, "arrival": float(i)}
        for i in range(batch)
    ]


def step(requests: list, torch) -> dict:
    for request in requests:
        request["tokens"].append(len(request["tokens"]) % 50000)
        request["computed"] += 1
    scheduled = sorted(requests, key=lambda r: (r["priority"], r["arrival"]))
    inputs = torch.tensor([r["tokens"][-1] for r in scheduled])
    positions = torch.tensor([r["computed"] for r in scheduled])
    return {"outputs": {r["id"]: r["tokens"][-1] for r in scheduled}, "shape": (inputs.shape, positions.shape)}


def seconds_per_step(batch: int, steps: int, rounds: int) -> float:
    import torch

    best = float("inf")
    for _ in range(rounds):
        requests = requests_of(batch)
        started = time.perf_counter()
        for _ in range(steps):
            step(requests, torch)
        best = min(best, (time.perf_counter() - started) / steps)
    return best


def scaled(host_step: dict, base: dict, here: dict) -> dict:
    """host_step's per-batch medians x (this host's time / the base host's), interpolated in B."""
    import numpy as np

    def at(report, batch):
        rows = sorted(report["rows"], key=lambda r: r["batch"])
        return float(np.interp(batch, [r["batch"] for r in rows], [r["us_per_step"] for r in rows]))

    median = [
        {
            **row,
            "host_ms_per_step": round(row["host_ms_per_step"] * at(here, row["batch"]) / at(base, row["batch"]), 3),
            "scaled_from_ms": row["host_ms_per_step"],
        }
        for row in host_step["median"]
    ]
    return {**host_step, "median": median, "scaled_by": "jobs.benchmark host-speed", "base": base, "here": here}


def add_cli_args(parser) -> None:
    parser.add_argument("--batch", type=integers, default=[16, 64, 256])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument(
        "--scale", default="", metavar="HOST_STEP_JSON", help="scale this host-step report to this host"
    )
    parser.add_argument(
        "--base",
        default="",
        metavar="HOST_SPEED_JSON",
        help="this subcommand's report from the host --scale was measured on",
    )


def run(args) -> dict:
    if bool(args.scale) != bool(args.base):
        raise SystemExit("host-speed: --scale and --base go together")
    report = {
        "rows": [
            {"batch": b, "us_per_step": round(1e6 * seconds_per_step(b, args.steps, args.rounds), 3)}
            for b in args.batch
        ]
    }
    if args.scale:
        with open(args.scale) as a, open(args.base) as b:
            report = scaled(json.load(a), json.load(b), report)
    return report


def markdown(report: dict) -> str:
    return markdown_table(report.get("median") or report["rows"])
