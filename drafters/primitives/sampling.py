"""Sampling primitives (temperature > 0): settings, the per-request random state, the target's
filtered distribution and inverse-CDF sampling. How drafts are accepted is
pipeline/engines/transformers/verification.py.

Randomness comes in as uniforms, so every function is deterministic and testable. The token at
generated position t is always sampled with the request's t-th position uniform, by plain
sampling and by point-draft verification alike. So, with the same seed, a point drafter emits the
very tokens plain sampling emits (up to float rounding between batched and single calls):
speculation changes the speed, not the sample.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 is greedy decoding
    top_k: int = 0  # 0 keeps every token
    top_p: float = 1.0  # 1 keeps every token
    seed: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


GREEDY = SamplingParams()


def request_seed(seed: int, request_id: str) -> int:
    """A stable per-request seed: rows sharing the job's seed still draw different samples, and a
    rerun draws the same ones (Python's hash() is salted per process, so it is not used)."""
    digest = hashlib.sha256(f"{seed}\0{request_id}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def sample_seed(seed: int, sample: int) -> int:
    """The seed of a request's sample `sample` (sampling_params.n): sample 0 samples with the
    request's own seed, so one sample of a seed is the text n samples begin with."""
    return seed if sample == 0 else request_seed(seed, f"sample {sample}")


class RandomState:
    """The uniforms of one request: one per generated position, plus a stream for drafting and accepting."""

    def __init__(self, seed: int, max_positions: int):
        generator = torch.Generator().manual_seed(seed)
        self.position_uniforms = torch.rand(max_positions, generator=generator, dtype=torch.float64)
        self.draft_generator = torch.Generator().manual_seed(seed ^ 0x5DEECE66D)

    def draft_uniforms(self, n: int) -> torch.Tensor:
        return torch.rand(n, generator=self.draft_generator, dtype=torch.float64)


def target_probs(logits: torch.Tensor, sampling: SamplingParams) -> torch.Tensor:
    """Softmax of logits [..., V] at the temperature, restricted to the top-k and the top-p nucleus."""
    assert not sampling.greedy, "temperature 0 is greedy: there is no distribution to sample"
    logits = logits.float() / sampling.temperature
    if sampling.top_k:
        kth = logits.topk(min(sampling.top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = logits.softmax(dim=-1)
    if sampling.top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        # Keep a token while the mass before it is below top_p (the first token always stays).
        drop = (sorted_probs.cumsum(dim=-1) - sorted_probs) >= sampling.top_p
        probs = probs.scatter(-1, order, sorted_probs.masked_fill(drop, 0.0))
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def sample(probs: torch.Tensor, uniform: float) -> int:
    """Inverse-CDF sample from probs [V] with one uniform in [0, 1)."""
    cdf = probs.double().cumsum(dim=0)
    index = int(torch.searchsorted(cdf, torch.tensor([uniform * float(cdf[-1])], dtype=cdf.dtype), right=True))
    if index >= probs.shape[0]:  # rounding at the top of the cdf: the last token that has mass
        index = int(torch.nonzero(probs).max())
    return index
