import random

import pytest

from drafters.base import PADDING, DraftContext
from drafters.context_ngram import ContextNgramDrafter, continuation


def rows(drafter, tokens, k, w, max_q=3):
    drafts = drafter.propose(DraftContext(tokens, max_q), k, w)
    return drafts.tokens.tolist(), list(drafts.strategies)


def test_ranks_by_count_then_recency():
    drafter = ContextNgramDrafter(max_q=2, min_q=2)
    # (1, 2) was followed by 3, 4, 3: the continuation seen twice ranks first.
    assert rows(drafter, [1, 2, 3, 1, 2, 4, 1, 2, 3, 9, 1, 2], k=2, w=1)[0] == [[3], [4]]
    # Equal counts: the most recent occurrence (followed by 6) wins.
    assert rows(drafter, [1, 2, 5, 1, 2, 6, 1, 2], k=2, w=1)[0] == [[6], [5]]


def test_rows_carry_w_following_tokens():
    drafter = ContextNgramDrafter(max_q=2, min_q=2)
    tokens, strategies = rows(drafter, [1, 2, 5, 6, 7, 0, 1, 2], k=1, w=3)
    assert tokens == [[5, 6, 7]] and strategies == ["context_ngram"]


def test_overlapping_match_continues_periodically():
    # "7 8 7 8 7": the match at position 3 runs past the end; the text is periodic with period 2.
    assert continuation([7, 8, 7, 8, 7], position=3, w=4) == [8, 7, 8, 7]
    drafter = ContextNgramDrafter(max_q=1, min_q=1)
    assert rows(drafter, [7, 8, 7, 8, 7], k=1, w=4)[0] == [[8, 7, 8, 7]]


def test_longer_matches_come_first_and_shorter_ones_fill():
    drafter = ContextNgramDrafter(max_q=2, min_q=1)
    # (4, 2) occurred once (followed by 9); 2 alone was also followed by 5.
    tokens, _ = rows(drafter, [4, 2, 9, 3, 2, 5, 4, 2], k=2, w=1, max_q=2)
    assert tokens == [[9], [5]]


def test_no_match_gives_padding_rows():
    drafter = ContextNgramDrafter(max_q=2, min_q=2, pad_token=0)
    tokens, strategies = rows(drafter, [1, 2, 3, 4], k=2, w=2)
    assert strategies == [PADDING, PADDING] and tokens == [[0, 0], [0, 0]]


def brute_force_occurrences(tokens, q):
    suffix = tokens[-q:]
    return [p for p in range(q, len(tokens)) if tokens[p - q : p] == suffix]


@pytest.mark.parametrize("seed", range(5))
def test_incremental_index_matches_a_full_scan(seed):
    rng = random.Random(seed)
    context = DraftContext([rng.randrange(4) for _ in range(5)], max_q=3)
    for _ in range(40):
        context.append([rng.randrange(4) for _ in range(rng.randrange(1, 4))])
        for q in (1, 2, 3):
            assert context.occurrences(q) == brute_force_occurrences(context.tokens, q)
