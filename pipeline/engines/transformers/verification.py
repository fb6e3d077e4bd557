"""Verification: one entry point, `verify`, decides what a step emits. Pure functions.

A step's drafts are a draft tree (pipeline/engines/transformers/tree.py): k rows of w tokens merged by shared prefixes,
so a batch of k rows is a tree whose rows share nothing but the root. The target's logits come
in per tree position: [root, node 1, ..., node n] (`tree.node_logits` gathers them from a
[k, w+1] block call). Terms:
- a row *accepts* its longest draft prefix the target agrees with; the *path* is that prefix's
  nodes; the *bonus* token is the target's own token after it, so a step emits accepted + 1;
- greedy: the target agrees with a draft token when it is the argmax there;
- sampling with point drafts (context n-gram, bigram, ...): the target's token at each position
  is sampled from its own distribution with that position's uniform, and the path follows the
  child that matches it, so every emitted token is drawn from the target's conditional;
- sampling with a draft model's probabilities q (one row; Chen et al. 2023, Leviathan et al.
  2023): draft token x is accepted with probability min(1, p(x)/q(x)); on the first rejection the
  *recovered* token is sampled from norm(max(0, p - q)); when all are accepted the bonus from p.
The winning row is the lowest row through the path's last node: the row that accepted most, the
higher-ranked on ties.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pipeline.engines.transformers.tree import DraftTree, winning_row
from drafters.primitives.sampling import SamplingParams, sample, target_probs


@dataclass(frozen=True)
class Verdict:
    tokens: list[int]  # the accepted draft tokens followed by the bonus (or recovered) token
    num_accepted: int  # accepted draft tokens (0..w); len(tokens) == num_accepted + 1
    row: int  # index of the winning row among the k
    # For each *checked* draft position (the accepted ones, then the first rejected one if any):
    # the probability that it was accepted given the tokens before it. Greedy: 1 or 0. Their mean
    # over a request estimates alpha, the acceptance rate of speculative sampling.
    acceptance_probabilities: tuple[float, ...] = ()
    path: tuple[int, ...] = ()  # the accepted nodes of the draft tree, root's child first


@dataclass(frozen=True)
class DraftEvidence:
    """What speculative sampling needs from a draft model's one row of w tokens."""

    probs: torch.Tensor  # [w, V] q at each draft token
    accept_uniforms: torch.Tensor  # [w] decide acceptance
    lenience: float = 1.0  # accept with min(1, p / (lenience q)): 1 is exact, < 1 is lossy


def verify(
    tree: DraftTree,
    logits: torch.Tensor,
    sampling: SamplingParams,
    uniforms: torch.Tensor | None = None,
    draft: DraftEvidence | None = None,
) -> Verdict:
    """The verdict on `tree` given the target's logits [n+1, V] at [root, nodes]. `uniforms` [w+1]:
    the position uniforms of the tokens this step may emit (sampling only); `draft`: a draft
    model's evidence, for speculative sampling of its row (sampling only)."""
    assert logits.shape[0] == len(tree.tokens) + 1, (
        f"logits {tuple(logits.shape)} for a tree of {len(tree.tokens)} nodes"
    )
    if sampling.greedy:
        return walk_greedy(tree, logits)
    probs = target_probs(logits, sampling).cpu()
    if draft is None:
        return walk_sampled(tree, probs, uniforms)
    return speculative_sample(tree, draft, probs, uniforms)


def walk_greedy(tree: DraftTree, logits: torch.Tensor) -> Verdict:
    choices = logits.argmax(dim=-1).tolist()  # [n+1]
    path: list[int] = []
    node = -1
    while (child := tree.children(node).get(choices[node + 1])) is not None:
        path.append(child)
        node = child
    tokens = [tree.tokens[p] for p in path] + [choices[node + 1]]
    checked = (1.0,) * len(path) + ((0.0,) if len(path) < tree.w else ())
    return Verdict(tokens, len(path), winning_row(tree, path), checked, tuple(path))


def walk_sampled(tree: DraftTree, probs: torch.Tensor, uniforms: torch.Tensor) -> Verdict:
    # probs: [n+1, V] target probabilities at [root, nodes]
    path: list[int] = []
    tokens: list[int] = []
    checked: list[float] = []
    node = -1
    while True:
        token = sample(probs[node + 1], float(uniforms[len(path)]))
        tokens.append(token)
        children = tree.children(node)
        if not children:
            break
        checked.append(float(probs[node + 1, list(children)].sum()))  # P(the sample hits a child)
        if token not in children:
            break
        node = children[token]
        path.append(node)
    return Verdict(tokens, len(path), winning_row(tree, path), tuple(checked), tuple(path))


def speculative_sample(
    tree: DraftTree, draft: DraftEvidence, p: torch.Tensor, sample_uniforms: torch.Tensor
) -> Verdict:
    # tree: one row of γ draft tokens (nodes 0..γ-1); p: [γ+1, V] target probs at [root, nodes];
    # sample_uniforms: [γ+1] sample the recovered or bonus token.
    assert len(tree.row_nodes) == 1, "speculative sampling verifies a draft model's single row"
    q, lenience = draft.probs, draft.lenience
    tokens: list[int] = []
    checked: list[float] = []
    for i, x in enumerate(tree.tokens):
        accept_probability = min(1.0, float(p[i, x]) / max(lenience * float(q[i, x]), 1e-30))
        checked.append(accept_probability)
        if float(draft.accept_uniforms[i]) < accept_probability:
            tokens.append(x)
            continue
        residual = (p[i] - lenience * q[i]).clamp_min(0)
        if float(residual.sum()) <= 0:  # p == q up to rounding: the residual is p itself
            residual = p[i]
        tokens.append(sample(residual, float(sample_uniforms[i])))
        return Verdict(tokens, i, 0, tuple(checked), tuple(range(i)))
    gamma = len(tree.tokens)
    tokens.append(sample(p[gamma], float(sample_uniforms[gamma])))
    return Verdict(tokens, gamma, 0, tuple(checked), tuple(range(gamma)))
