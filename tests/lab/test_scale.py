"""lab scale (lab/scale.py): which documents its rerun edits."""

import pytest


def test_scale_edits_a_count_or_a_share_of_each_corpus_spread_over_it():
    from lab.scale import edited_count, edited_documents

    assert edited_documents(2000, edited_count("20")) == set(range(0, 2000, 100))
    assert edited_documents(1_000_000, edited_count("1%")) == set(range(0, 1_000_000, 100))
    assert len(edited_documents(200_000, edited_count("1%"))) == 2000
    with pytest.raises(ValueError, match="--edited 150%"):
        edited_count("150%")
