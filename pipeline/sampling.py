"""Exact verification when sampling (temperature > 0): pure functions plus the per-request random state.

Terms as in verification.py. Two cases:
- point-mass drafts (context n-gram, bigram, ...): `verify_point_drafts` samples the target's token
  at each position from its own distribution and keeps the rows whose draft matches it, so every
  emitted token is drawn from the target's conditional distribution;
- a draft model with probabilities q (Chen et al. 2023, arXiv 2302.01318; Leviathan et al. 2023):
  `speculative_sample` *accepts* draft token x with probability min(1, p(x)/q(x)); on the first
  rejection it samples the *recovered* token from norm(max(0, p - q)); if every draft token is
  accepted it samples the *bonus* token from p.
Randomness comes in as uniforms, so each function is deterministic and testable.

The token at generated position t is always sampled with the request's t-th position uniform, by
plain sampling and by point-draft verification alike. So, with the same seed, a point drafter
emits the very tokens plain sampling emits (up to float rounding between batched and single calls):
speculation changes the speed, not the sample.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from pipeline.verification import Verdict


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
    assert not sampling.greedy, "temperature 0 is greedy: use verify_greedy"
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


def verify_point_drafts(drafts: torch.Tensor, probs: torch.Tensor, uniforms: torch.Tensor) -> Verdict:
    # drafts: [k, w]; probs: [k, w+1, V] target probabilities for the block [last, drafts];
    # uniforms: [w+1], the position uniforms of the tokens this step may emit
    k, w = drafts.shape
    alive = list(range(k))  # rows whose drafts agree with every token sampled so far
    tokens: list[int] = []
    checked: list[float] = []
    for position in range(w + 1):
        row = alive[0]  # surviving rows share the context up to here, so any one's probs will do
        token = sample(probs[row, position], float(uniforms[position]))
        tokens.append(token)
        if position == w:
            break
        guesses = {int(drafts[r, position]) for r in alive}
        checked.append(float(probs[row, position, list(guesses)].sum()))  # P(the sample hits a guess)
        matching = [r for r in alive if int(drafts[r, position]) == token]
        if not matching:
            break
        alive = matching
    return Verdict(tokens=tokens, num_accepted=len(tokens) - 1, row=alive[0], acceptance_probabilities=tuple(checked))


def speculative_sample(drafts: torch.Tensor, q: torch.Tensor, p: torch.Tensor, accept_uniforms: torch.Tensor,
                       sample_uniforms: torch.Tensor, lenience: float = 1.0) -> Verdict:
    # drafts: [γ] draft-model tokens; q: [γ, V] draft probs; p: [γ+1, V] target probs;
    # accept_uniforms: [γ] decide acceptance; sample_uniforms: [γ+1] sample recovered/bonus tokens.
    # lenience l < 1 (Leviathan et al. §A.5) accepts more often and is NOT exact: default 1.
    gamma = drafts.shape[0]
    tokens: list[int] = []
    checked: list[float] = []
    for i in range(gamma):
        x = int(drafts[i])
        # q: draft prob, p: target prob; accept with probability min(1, p(x) / (l q(x))).
        accept_probability = min(1.0, float(p[i, x]) / max(lenience * float(q[i, x]), 1e-30))
        checked.append(accept_probability)
        if float(accept_uniforms[i]) < accept_probability:
            tokens.append(x)
            continue
        residual = (p[i] - lenience * q[i]).clamp_min(0)
        if float(residual.sum()) <= 0:  # p == q up to rounding: the residual is p itself
            residual = p[i]
        tokens.append(sample(residual, float(sample_uniforms[i])))
        return Verdict(tokens=tokens, num_accepted=i, row=0, acceptance_probabilities=tuple(checked))
    tokens.append(sample(p[gamma], float(sample_uniforms[gamma])))
    return Verdict(tokens=tokens, num_accepted=gamma, row=0, acceptance_probabilities=tuple(checked))
