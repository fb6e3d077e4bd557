"""A step's cost as a function of the tokens it feeds the model: what the draft budget weighs.

A step that feeds n tokens (one per running request plus their drafts) takes `seconds(n)`; the
budget (drafters/suffix_kernels.py `_budget`) takes a draft token while its probability of being
accepted P beats what it costs: P > T (c(n + 1) - c(n)) / c(n), T the step's expected tokens so far.
- `LinearStepCost`: c(n) = a + b n, fitted online from the engine's own steps (the vLLM proposer's
  StepCosts): on this CPU each token fed costs ~5 % of a step, so only likely tokens pay;
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
class LinearStepCost:
    a: float  # seconds of a step whatever it feeds
    b: float  # seconds per token fed

    def seconds(self, fed: np.ndarray) -> np.ndarray:
        return self.a + self.b * np.asarray(fed, dtype=np.float64)


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


class DraftingPays:
    """Whether running the drafter at all pays, step after step: what a step's drafts were worth
    (their expected accepted tokens, each worth a plain step's seconds per request, less what the
    extra tokens fed cost) against the drafter's own seconds, as a moving average. The budget cuts
    tokens that do not pay for themselves; this cuts the drafting when even its kept tokens do not
    pay for the drafter's time (at 256 requests on a GPU, where the step keeps few tokens and the
    drafter's time is the step's too). While it does not pay, one step in `probe` drafts anyway, to
    keep the estimate current."""

    def __init__(self, decay: float = 0.8, probe: int = 16):
        self.decay, self.probe = decay, probe
        self.net = 0.0  # seconds a drafting step gained, on average (>= 0 at first: draft)
        self.skipped = 0

    def drafting(self) -> bool:
        if self.net >= 0 or self.skipped + 1 >= self.probe:
            self.skipped = 0
            return True
        self.skipped += 1
        return False

    def observe(self, expected_accepted: float, fed_drafts: int, batch: int, step_cost: np.ndarray,
                drafter_seconds: float) -> None:
        plain = float(step_cost[batch])
        gained = expected_accepted * plain / batch - (float(step_cost[batch + fed_drafts]) - plain) - drafter_seconds
        self.net = self.decay * self.net + (1 - self.decay) * gained


def cost_table(cost, batch: int, max_draft: int) -> np.ndarray:
    """[batch (max_draft + 1) + 1]: cost.seconds(n) for every n a step of `batch` requests can feed."""
    return cost.seconds(np.arange(batch * (max_draft + 1) + 1))
