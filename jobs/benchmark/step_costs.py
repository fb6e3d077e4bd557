"""GPU step costs for the benchmark's projections, c(n) as `seconds(n)` as drafters/budget.py's
allocator takes them:
- `RooflineStepCost`: a GPU step from its spec sheet: c(n) = max(bytes / bandwidth, flops(n) / peak)
  with bytes the weights plus the batch's KV cache and flops(n) = 2 x parameters x n. Tokens are
  free until the step turns compute-bound, then cost their FLOPs. A projection, not a measurement;
- `MeasuredStepCost`: a GPU step as measured on one (lab/gpu_step.py), for the replay's
  projection where a GPU was at hand;
- `CpuStepCost`: this CPU's vLLM step as measured (lab/host_step.py), for the replay's
  projection onto the machine the live benchmarks run on (`--project cpu`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Gpu:
    name: str
    bandwidth: float  # bytes/s of its memory
    flops: float  # dense bf16 FLOP/s


@dataclass(frozen=True)
class Model:
    name: str
    parameters: float
    kv_bytes_per_token: float  # all layers, K and V, bf16


GPUS = {"a100": Gpu("A100 80GB SXM", 2.039e12, 312e12), "h100": Gpu("H100 SXM", 3.35e12, 989e12)}
# Llama-3-8B: 32 layers x 8 KV heads x 128 dims x (K, V) x 2 bytes; Llama-3-70B: 80 layers.
MODELS = {
    "8b": Model("8B (Llama-3-8B shape)", 8.03e9, 32 * 8 * 128 * 2 * 2),
    "70b": Model("70B (Llama-3-70B shape)", 70.6e9, 80 * 8 * 128 * 2 * 2),
}


@dataclass(frozen=True)
class RooflineStepCost:
    gpu: Gpu
    model: Model
    batch: int  # running requests
    context: float  # their mean tokens (prompt + generated so far): the KV cache each step reads

    def seconds(self, fed: np.ndarray) -> np.ndarray:
        memory = (
            2 * self.model.parameters + self.batch * self.context * self.model.kv_bytes_per_token
        ) / self.gpu.bandwidth
        compute = 2 * self.model.parameters * np.asarray(fed, dtype=np.float64) / self.gpu.flops
        return np.maximum(memory, compute)


@dataclass(frozen=True)
class MeasuredStepCost:
    """A GPU step's seconds as measured (lab/gpu_step.py: a table of batch sizes x tokens
    fed per request, at one context): the table's batch size nearest to `batch` (in ratio),
    interpolated linearly in the tokens fed per request, and extrapolated past its last two points,
    but never faster than the GPU fed tokens in any measured step: a long draft (a prediction's, up
    to 128 tokens a request) takes a small batch's step far past its table, where the step turns
    compute-bound and the memory-bound slope of its last points would make its tokens nearly free.
    Within the table the floor never binds (each measured step is at most that fast)."""

    batches: tuple[int, ...]
    fed_per_request: tuple[tuple[float, ...], ...]  # per batch size, increasing
    step_seconds: tuple[tuple[float, ...], ...]
    batch: int  # running requests
    tokens_per_second: float = np.inf  # the most tokens fed per second in a measured step (all of them compute)

    @classmethod
    def from_report(cls, report: dict, batch: int) -> MeasuredStepCost:
        batches = tuple(sorted({row["batch"] for row in report["rows"]}))
        rows = [
            sorted((r["fed_per_request"], r["seconds"]) for r in report["rows"] if r["batch"] == b) for b in batches
        ]
        fastest = max(r["batch"] * r["fed_per_request"] / r["seconds"] for r in report["rows"])
        return cls(
            batches,
            tuple(tuple(f for f, _ in points) for points in rows),
            tuple(tuple(t for _, t in points) for points in rows),
            batch,
            fastest,
        )

    def seconds(self, fed: np.ndarray) -> np.ndarray:
        index = int(np.argmin(np.abs(np.log(np.asarray(self.batches, dtype=np.float64)) - np.log(max(self.batch, 1)))))
        x, y = np.asarray(self.fed_per_request[index]), np.asarray(self.step_seconds[index])
        fed = np.asarray(fed, dtype=np.float64)
        return np.maximum(interpolated(x, y, fed / max(self.batch, 1)), fed / self.tokens_per_second)


@dataclass(frozen=True)
class CpuStepCost:
    """A step of the vLLM CPU engine, host and device together (it runs synchronously), from a
    lab/host_step.py report of plain steps of B requests: a step that feeds n tokens
    costs what a plain step of n requests did, interpolated between the measured batch sizes and
    extrapolated along the last two. (On a CPU a step's work grows with the tokens it feeds,
    whichever requests they belong to: the weights' products dominate; attention over a request's
    context, which a plain step of n requests has n of, is a tenth of a token's work at the
    replayed contexts for SmolLM2.)"""

    tokens: tuple[float, ...]  # the measured batch sizes: tokens a plain step feeds
    step_seconds: tuple[float, ...]

    @classmethod
    def from_report(cls, report: dict) -> CpuStepCost:
        points = sorted(
            (row["batch"], 1e-3 * (row["host_ms_per_step"] + row["device_ms_per_step"])) for row in report["median"]
        )
        if len(points) < 2:
            raise ValueError("a CPU step cost needs a host_step report of at least two batch sizes")
        return cls(tuple(float(b) for b, _ in points), tuple(t for _, t in points))

    def seconds(self, fed: np.ndarray) -> np.ndarray:
        return interpolated(np.asarray(self.tokens), np.asarray(self.step_seconds), np.asarray(fed, dtype=np.float64))


def interpolated(x: np.ndarray, y: np.ndarray, at: np.ndarray) -> np.ndarray:
    """y at `at`: linear between the points (x increasing), extended along the last two past them."""
    slope = (y[-1] - y[-2]) / (x[-1] - x[-2])
    return np.where(at <= x[-1], np.interp(at, x, y), y[-1] + slope * (at - x[-1]))
