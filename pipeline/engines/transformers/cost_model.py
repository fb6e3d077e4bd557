"""What a verification call costs on this hardware (N-Grammys §3, Figure 1), measured, not assumed.

The *relative cost* of a block [k, w+1] at context length ℓ is the time of one forward call
over it divided by the time of a single-token call at the same ℓ. On a memory-bound GPU it stays
near 1 for large blocks; on a CPU it grows with every token. It is measured once per model and
device on a small grid and cached as JSON; between grid points it is interpolated linearly in k,
in w+1 and in ℓ; beyond the largest k and w+1 it is extrapolated along the last segment.
"""
from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from pipeline.built_once import code_key
from pipeline.engines.transformers.kv_cache import keep_row, share_context
from pipeline.forward import prefill

GRID_K = (1, 2, 4, 8, 16)
GRID_WIDTH = (1, 2, 3, 5, 9)  # w + 1
GRID_CONTEXT = (25, 100, 500)


@dataclass(frozen=True)
class CostModel:
    ks: tuple[int, ...]
    widths: tuple[int, ...]  # w + 1
    context_lengths: tuple[int, ...]
    relative: list  # [len(context_lengths)][len(ks)][len(widths)] call time / single-token call time
    single_token_seconds: list  # [len(context_lengths)] the single-token call it is relative to
    device: str

    def cost(self, k: int, w: int, context_length: int) -> float:
        """Relative cost of verifying k drafts of w tokens (a [k, w+1] block) at this context length."""
        table = np.asarray(self.relative)  # [L, K, W]
        per_length = [_bilinear(self.ks, self.widths, table[i], k, w + 1) for i in range(len(self.context_lengths))]
        return float(np.interp(context_length, self.context_lengths, per_length))

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        staging = path.with_suffix(".tmp")
        staging.write_text(json.dumps(asdict(self), indent=1))
        staging.replace(path)

    @classmethod
    def load(cls, path: Path) -> CostModel:
        data = json.loads(path.read_text())
        return cls(**{key: tuple(value) if key in ("ks", "widths", "context_lengths") else value
                      for key, value in data.items()})


def _bilinear(xs, ys, grid: np.ndarray, x: float, y: float) -> float:
    # grid: [len(xs), len(ys)]; linear in each axis, held at the lower edges, extended beyond the upper
    along_y = np.array([_interp(y, ys, grid[i]) for i in range(len(xs))])
    return _interp(x, xs, along_y)


def _interp(x: float, xs, ys) -> float:
    """Linear interpolation; beyond the last point it continues the last segment's slope (never
    downwards): a bigger block than any measured costs more, not the same as the biggest."""
    if x <= xs[-1] or len(xs) < 2:
        return float(np.interp(x, xs, ys))
    slope = max(0.0, (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]))
    return float(ys[-1] + slope * (x - xs[-1]))


@torch.no_grad()
def timed_call(model, cache, block: torch.Tensor) -> float:  # block: [k, width]
    """Seconds of one forward call over `block` on top of `cache`, which is left as found."""
    context_length = cache.get_seq_length()
    if block.shape[0] > 1:
        share_context(cache, block.shape[0])
    started = time.perf_counter()
    model(input_ids=block, past_key_values=cache, use_cache=True)
    if model.device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    keep_row(cache, 0, context_length)
    return seconds


def measure(model, ks=GRID_K, widths=GRID_WIDTH, context_lengths=GRID_CONTEXT, repeats: int = 5) -> CostModel:
    """Times every block shape once per round, round after round, so a drift of the machine's
    speed (other work, clocks) falls on all shapes alike instead of on the ones timed last."""
    generator = torch.Generator().manual_seed(0)
    shapes = [(1, 1)] + [(k, width) for k in ks for width in widths]
    relative, single = [], []
    for length in context_lengths:
        context = torch.randint(0, model.config.vocab_size, (length,), generator=generator).tolist()
        cache = prefill(model, context)
        blocks = {shape: torch.randint(0, model.config.vocab_size, shape, generator=generator).to(model.device)
                  for shape in shapes}
        times = {shape: [] for shape in shapes}
        for round_index in range(repeats + 1):  # round 0 pays for allocations: untimed
            for shape in shapes:
                seconds = timed_call(model, cache, blocks[shape])
                if round_index:
                    times[shape].append(seconds)
        base = statistics.median(times[(1, 1)])
        single.append(base)
        relative.append([[statistics.median(times[(k, width)]) / base for width in widths] for k in ks])
    return CostModel(tuple(ks), tuple(widths), tuple(context_lengths), relative, single, str(model.device))


# The code a cached cost model was measured by: another measures it again.
MEASURED_BY = code_key(measure, timed_call)


def cached_cost_model(model, fingerprint: str, cache_dir: Path) -> CostModel:
    """The cost model of this model on this device: measured once, then read from the cache."""
    device = str(model.device)
    if device == "cuda" or device.startswith("cuda:"):
        device = torch.cuda.get_device_name(model.device).replace(" ", "_")
    path = cache_dir / "costs" / f"{fingerprint[:16]}-{device}-{model.dtype}-{MEASURED_BY}.json".replace("torch.", "")
    if path.is_file():
        return CostModel.load(path)
    costs = measure(model)
    costs.save(path)
    return costs
