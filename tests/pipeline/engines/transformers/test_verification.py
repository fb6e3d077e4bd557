"""Greedy verification through the one entry point, on k rows of a [k, w+1] block call."""

import torch

from pipeline.engines.transformers.tree import build_tree, node_logits
from pipeline.engines.transformers.verification import verify
from drafters.primitives.sampling import GREEDY


def verify_greedy(drafts, logits):
    tree = build_tree(drafts)
    return verify(tree, node_logits(tree, logits), GREEDY)


V = 10


def logits_choosing(choices):
    """[k, w+1, V] logits whose argmax at [i, j] is choices[i][j]."""
    logits = torch.zeros(len(choices), len(choices[0]), V)
    for i, row in enumerate(choices):
        for j, token in enumerate(row):
            logits[i, j, token] = 1.0
    return logits


def reference(drafts, choices):
    """Token by token: accept while the draft equals the target's choice, then add the bonus."""
    best = None
    for i, row in enumerate(drafts):
        accepted = 0
        while accepted < len(row) and row[accepted] == choices[i][accepted]:
            accepted += 1
        if best is None or accepted > best[1]:
            best = (i, accepted)
    i, accepted = best
    return drafts[i][:accepted] + [choices[i][accepted]], accepted, i


def check(drafts, choices):
    verdict = verify_greedy(torch.tensor(drafts), logits_choosing(choices))
    assert (verdict.tokens, verdict.num_accepted, verdict.row) == reference(drafts, choices)
    return verdict


def test_full_acceptance_emits_every_draft_and_the_bonus():
    verdict = check([[1, 2, 3]], [[1, 2, 3, 4]])
    assert verdict.tokens == [1, 2, 3, 4] and verdict.num_accepted == 3


def test_rejection_stops_at_the_first_mismatch():
    verdict = check([[1, 5, 3]], [[1, 2, 3, 4]])
    assert verdict.tokens == [1, 2] and verdict.num_accepted == 1


def test_a_later_match_after_a_mismatch_is_not_accepted():
    assert check([[9, 2, 3]], [[1, 2, 3, 4]]).tokens == [1]


def test_the_row_that_accepted_most_wins():
    verdict = check([[1, 9, 9], [1, 2, 9], [7, 7, 7]], [[1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 3, 4]])
    assert verdict.row == 1 and verdict.tokens == [1, 2, 3]


def test_ties_go_to_the_higher_ranked_row():
    verdict = check([[1, 8], [1, 9]], [[1, 5, 0], [1, 6, 0]])
    assert verdict.row == 0 and verdict.tokens == [1, 5]


def test_w_zero_is_plain_greedy():
    verdict = verify_greedy(torch.empty(1, 0, dtype=torch.long), logits_choosing([[4]]))
    assert verdict.tokens == [4] and verdict.num_accepted == 0


def test_random_cases_match_the_reference():
    generator = torch.Generator().manual_seed(0)
    for _ in range(200):
        k, w = torch.randint(1, 5, (2,), generator=generator).tolist()
        drafts = torch.randint(0, 3, (k, w), generator=generator).tolist()
        # The target's choice depends on the tokens before it only: rows sharing a prefix agree there.
        choice_after: dict[tuple, int] = {}
        choices = [
            [
                choice_after.setdefault(tuple(row[:j]), int(torch.randint(0, 3, (1,), generator=generator)))
                for j in range(w + 1)
            ]
            for row in drafts
        ]
        check(drafts, choices)
