"""The verdict of keyed verification (pipeline/engines/vllm/seeded_sampling.py's accept_matching):
a request keeps its draft while it equals the targets, emits the target at the first mismatch,
the bonus after a fully accepted draft, and nothing after that."""

import torch

from pipeline.engines.vllm.seeded_sampling import PLACEHOLDER, accept_matching

P = PLACEHOLDER


def test_drafts_are_kept_while_they_match_then_the_target_or_the_bonus():
    # Four requests, drafts of 3, 3, 0 and 2 tokens, flat in request order.
    drafts = torch.tensor([5, 6, 7, 5, 6, 7, 8, 9])
    targets = torch.tensor([5, 6, 7, 5, 4, 7, 8, 1])  # all kept; a mismatch at 2nd; -; mismatch at 2nd
    bonus = torch.tensor([[11], [12], [13], [14]])
    out = accept_matching(drafts, [3, 3, 0, 2], 3, targets, bonus)
    assert out.dtype == torch.int32
    assert out.tolist() == [[5, 6, 7, 11], [5, 4, P, P], [13, P, P, P], [8, 1, P, P]]


def test_a_first_token_mismatch_emits_only_the_target():
    out = accept_matching(torch.tensor([3, 4]), [2], 4, torch.tensor([9, 4]), torch.tensor([[1]]))
    assert out.tolist() == [[9, P, P, P, P]]


def test_a_step_without_draft_positions_emits_the_bonus_tokens():
    out = accept_matching(
        torch.zeros(0, dtype=torch.int64), [0, 0], 0, torch.zeros(0, dtype=torch.int64), torch.tensor([[4], [2]])
    )
    assert out.tolist() == [[4], [2]]
