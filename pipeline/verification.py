"""Greedy verification of k drafts against one target forward call: a pure function.

For row i, the target's greedy choice at position j of the block [last, d_i1..d_iw] is
argmax(logits[i, j]). Row i *accepts* its longest draft prefix that equals those choices; the
*bonus* token is the target's choice right after the accepted prefix. The step takes the row that
accepted most (the lowest row on ties) and emits its accepted tokens plus the bonus, which is
exactly what plain greedy decoding would emit over the same positions.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Verdict:
    tokens: list[int]  # the winning row's accepted draft tokens followed by the bonus token
    num_accepted: int  # accepted draft tokens (0..w); len(tokens) == num_accepted + 1
    row: int  # index of the winning row among the k
    # For each *checked* draft position (the accepted ones, then the first rejected one if any):
    # the probability that it was accepted given the tokens before it. Greedy: 1 or 0. Their mean
    # over a request estimates alpha, the acceptance rate of speculative sampling.
    acceptance_probabilities: tuple[float, ...] = ()


def verify_greedy(drafts: torch.Tensor, logits: torch.Tensor) -> Verdict:
    # drafts: [k, w] token ids; logits: [k, w+1, V] target logits for the block [last, drafts]
    k, w = drafts.shape
    assert logits.shape[:2] == (k, w + 1), f"logits {tuple(logits.shape)} do not match drafts [{k}, {w}]"
    choices = logits.argmax(dim=-1)  # [k, w+1]
    matches = (drafts == choices[:, :w]).long()  # [k, w]
    accepted = matches.cumprod(dim=1).sum(dim=1)  # [k]
    row = int(torch.argmax(accepted))  # argmax returns the first maximum: ties go to the lower row
    num_accepted = int(accepted[row])
    tokens = drafts[row, :num_accepted].tolist() + [int(choices[row, num_accepted])]
    checked = (1.0,) * num_accepted + ((0.0,) if num_accepted < w else ())
    return Verdict(tokens=tokens, num_accepted=num_accepted, row=row, acceptance_probabilities=checked)
