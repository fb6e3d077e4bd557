"""GPU step costs for the benchmark's projections, c(n) as `seconds(n)` as drafters/budget.py's
allocator takes them:
- `RooflineStepCost`: a GPU step from its spec sheet: c(n) = max(bytes / bandwidth, flops(n) / peak)
  with bytes the weights plus the batch's KV cache and flops(n) = 2 x parameters x n. Tokens are
  free until the step turns compute-bound, then cost their FLOPs. A projection, not a measurement;
- `MeasuredStepCost`: a GPU step as measured on one (jobs/benchmark/gpu_step.py), for the replay's
  projection where a GPU was at hand.
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
MODELS = {"8b": Model("8B (Llama-3-8B shape)", 8.03e9, 32 * 8 * 128 * 2 * 2),
          "70b": Model("70B (Llama-3-70B shape)", 70.6e9, 80 * 8 * 128 * 2 * 2)}


@dataclass(frozen=True)
class RooflineStepCost:
    gpu: Gpu
    model: Model
    batch: int  # running requests
    context: float  # their mean tokens (prompt + generated so far): the KV cache each step reads

    def seconds(self, fed: np.ndarray) -> np.ndarray:
        memory = (2 * self.model.parameters + self.batch * self.context * self.model.kv_bytes_per_token) / self.gpu.bandwidth
        compute = 2 * self.model.parameters * np.asarray(fed, dtype=np.float64) / self.gpu.flops
        return np.maximum(memory, compute)


@dataclass(frozen=True)
class MeasuredStepCost:
    """A GPU step's seconds as measured (jobs/benchmark/gpu_step.py: a table of batch sizes x tokens
    fed per request, at one context): the table's batch size nearest to `batch` (in ratio),
    interpolated linearly in the tokens fed per request, and extrapolated past its last two points."""
    batches: tuple[int, ...]
    fed_per_request: tuple[tuple[float, ...], ...]  # per batch size, increasing
    step_seconds: tuple[tuple[float, ...], ...]
    batch: int  # running requests

    @classmethod
    def from_report(cls, report: dict, batch: int) -> "MeasuredStepCost":
        batches = tuple(sorted({row["batch"] for row in report["rows"]}))
        rows = [sorted((r["fed_per_request"], r["seconds"]) for r in report["rows"] if r["batch"] == b) for b in batches]
        return cls(batches, tuple(tuple(f for f, _ in points) for points in rows),
                   tuple(tuple(t for _, t in points) for points in rows), batch)

    def seconds(self, fed: np.ndarray) -> np.ndarray:
        index = int(np.argmin(np.abs(np.log(np.asarray(self.batches, dtype=np.float64)) - np.log(max(self.batch, 1)))))
        x, y = np.asarray(self.fed_per_request[index]), np.asarray(self.step_seconds[index])
        per_request = np.asarray(fed, dtype=np.float64) / max(self.batch, 1)
        slope = (y[-1] - y[-2]) / (x[-1] - x[-2])
        return np.where(per_request <= x[-1], np.interp(per_request, x, y), y[-1] + slope * (per_request - x[-1]))
