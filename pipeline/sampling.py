"""Exact verification when sampling (temperature > 0): pure functions, groundwork for issue 4.

Terms as in verification.py. Two cases:
- point-mass drafts (context n-gram, bigram, ...): `verify_point_drafts` samples the target's token
  at each position from its own distribution and keeps the rows whose draft matches it, so every
  emitted token is drawn from the target's conditional distribution;
- a draft model with probabilities q (Chen et al. 2023, arXiv 2302.01318; Leviathan et al. 2023):
  `speculative_sample` accepts draft token x with probability min(1, p(x)/q(x)); on the first
  rejection it samples the *recovered* token from norm(max(0, p - q)); if every draft token is
  accepted it samples the *bonus* token from p.
Randomness comes in as uniforms, so each function is deterministic and testable.
"""
from __future__ import annotations

import torch

from pipeline.verification import Verdict


def target_probs(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Softmax of logits [..., V] at `temperature`, restricted to the top-k and the top-p nucleus."""
    assert temperature > 0, "temperature 0 is greedy: use verify_greedy"
    logits = logits.float() / temperature
    if top_k:
        kth = logits.topk(min(top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = logits.softmax(dim=-1)
    if top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        # Keep a token while the mass before it is below top_p (the first token always stays).
        drop = (sorted_probs.cumsum(dim=-1) - sorted_probs) >= top_p
        probs = probs.scatter(-1, order, sorted_probs.masked_fill(drop, 0.0))
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def sample(probs: torch.Tensor, uniform: float) -> int:
    """Inverse-CDF sample from probs [V] with one uniform in [0, 1)."""
    cdf = probs.double().cumsum(dim=0)
    index = int(torch.searchsorted(cdf, torch.tensor([uniform * float(cdf[-1])], dtype=cdf.dtype), right=True))
    return min(index, probs.shape[0] - 1)


def verify_point_drafts(drafts: torch.Tensor, probs: torch.Tensor, uniforms: torch.Tensor) -> Verdict:
    # drafts: [k, w]; probs: [k, w+1, V] target probabilities for the block [last, drafts]; uniforms: [w+1]
    k, w = drafts.shape
    alive = list(range(k))  # rows whose drafts agree with every token sampled so far
    tokens: list[int] = []
    for position in range(w + 1):
        row = alive[0]  # surviving rows share the context up to here, so any one's probs will do
        token = sample(probs[row, position], float(uniforms[position]))
        tokens.append(token)
        if position == w:
            break
        matching = [r for r in alive if int(drafts[r, position]) == token]
        if not matching:
            break
        alive = matching
    return Verdict(tokens=tokens, num_accepted=len(tokens) - 1, row=alive[0])


def speculative_sample(drafts: torch.Tensor, q: torch.Tensor, p: torch.Tensor,
                       uniforms: torch.Tensor) -> tuple[list[int], int]:
    # drafts: [γ] draft-model tokens; q: [γ, V] draft probs; p: [γ+1, V] target probs;
    # uniforms: [γ+1, 2]: column 0 decides acceptance, column 1 samples recovered/bonus tokens.
    gamma = drafts.shape[0]
    tokens: list[int] = []
    for i in range(gamma):
        x = int(drafts[i])
        # q: draft prob, p: target prob; accept with probability min(1, p(x)/q(x)).
        if float(uniforms[i, 0]) * float(q[i, x]) < float(p[i, x]):
            tokens.append(x)
            continue
        residual = (p[i] - q[i]).clamp_min(0)
        tokens.append(sample(residual, float(uniforms[i, 1])))
        return tokens, i
    tokens.append(sample(p[gamma], float(uniforms[gamma, 1])))
    return tokens, gamma
