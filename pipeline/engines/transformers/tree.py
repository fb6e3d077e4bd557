"""Tree verification: k draft rows merged by shared prefixes and checked as one sequence.

Batch mode feeds [k, w+1] tokens and repeats every prefix the rows share. Tree mode feeds the
last emitted token (the root) followed by each distinct draft prefix once (a *node*), over the
batch-1 cache, with a 4D attention mask and position ids so each node sees the context, the
root and its own ancestors only. The accepted path is the deepest chain of nodes the target
agrees with; it is the winning row's accepted prefix, so tree and batch mode emit the same tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DraftTree:
    tokens: list[int]  # [n] node tokens; a parent always comes before its children
    parents: list[int]  # [n] parent node, -1 for the root's children
    depths: list[int]  # [n] 1 for the root's children
    row_nodes: list[list[int]]  # [k][w] row r's node at each of its positions

    @property
    def w(self) -> int:
        """w: the tokens of a row (every row of a step has the same)."""
        return len(self.row_nodes[0]) if self.row_nodes else 0

    def children(self, node: int) -> dict[int, int]:
        """token -> child node of `node` (-1 is the root); the first row's child wins a token."""
        found: dict[int, int] = {}
        for child, parent in enumerate(self.parents):
            if parent == node:
                found.setdefault(self.tokens[child], child)
        return found


def build_tree(drafts: torch.Tensor) -> DraftTree:
    # drafts: [k, w] token ids
    node_of: dict[tuple[int, ...], int] = {}
    tokens, parents, depths, row_nodes = [], [], [], []
    for row in drafts.tolist():
        nodes = []
        for position in range(len(row)):
            prefix = tuple(row[: position + 1])
            if prefix not in node_of:
                node_of[prefix] = len(tokens)
                tokens.append(row[position])
                parents.append(nodes[-1] if nodes else -1)
                depths.append(position + 1)
            nodes.append(node_of[prefix])
        row_nodes.append(nodes)
    return DraftTree(tokens, parents, depths, row_nodes)


def tree_visibility(tree: DraftTree) -> torch.Tensor:
    """[n+1, n+1] bool: which of [root, nodes] each of them sees (the root, itself, its ancestors)."""
    n = len(tree.tokens)
    visible = torch.zeros(n + 1, n + 1, dtype=torch.bool)
    visible[:, 0] = True
    for node in range(n):
        row = node + 1
        visible[row, row] = True
        parent = tree.parents[node]
        if parent >= 0:
            visible[row] |= visible[parent + 1]
    return visible


def tree_inputs(tree: DraftTree, last_token: int, context_length: int, dtype: torch.dtype):
    """input_ids [1, n+1], position_ids [1, n+1] and an additive mask [1, 1, n+1, context+n+1]."""
    n = len(tree.tokens)
    input_ids = torch.tensor([[last_token] + tree.tokens])
    position_ids = context_length + torch.tensor([[0] + tree.depths])
    visible = torch.cat([torch.ones(n + 1, context_length, dtype=torch.bool), tree_visibility(tree)], dim=1)
    return input_ids, position_ids, additive_mask(visible[None], dtype)


def additive_mask(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[B, 1, N, L] additive attention mask (0 where visible, the dtype's minimum elsewhere) from
    visible [B, N, L] bool."""
    return torch.zeros(visible.shape, dtype=dtype).masked_fill(~visible, torch.finfo(dtype).min)[:, None]


def node_logits(tree: DraftTree, block_logits: torch.Tensor) -> torch.Tensor:
    """[n+1, V] logits at [root, nodes] from a block call's [k, w+1, V] over the rows [last, row]:
    each node's from the first row through it (rows sharing a prefix saw the same tokens)."""
    rows, columns = [0], [0]
    for node in range(len(tree.tokens)):
        row = next(r for r, nodes in enumerate(tree.row_nodes) if node in nodes)
        rows.append(row)
        columns.append(tree.row_nodes[row].index(node) + 1)
    return block_logits[rows, columns]


def winning_row(tree: DraftTree, path: list[int]) -> int:
    """The lowest row through the path's last node (row 0 for an empty path), as batch mode picks."""
    if not path:
        return 0
    depth = len(path)
    return next(r for r, nodes in enumerate(tree.row_nodes) if len(nodes) >= depth and nodes[depth - 1] == path[-1])
