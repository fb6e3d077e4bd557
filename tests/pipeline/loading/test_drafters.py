"""The drafter registry: the config accepts exactly its names, and each entry's tables and factory
are all a drafter needs."""

import pytest

from drafters.base import DraftContext
from pipeline.loading.drafters import (
    FACTORIES,
    build_tables,
    make_batch_drafter,
    make_drafter,
    needs_model_tables,
)
from pipeline.config import ConfigError, DraftingConfig, load_config
from pipeline.config.drafter_kinds import DRAFTER_KINDS
from pipeline.config.drafting import BigramConfig
from pipeline.engines.build import checked_config


def test_the_config_accepts_exactly_the_registry_names():
    for name in DRAFTER_KINDS:
        assert DraftingConfig(drafter=name, datastore="a-datastore").drafter == name
    with pytest.raises(ConfigError, match="drafting.drafter: must be one of ours with engine.name transformers"):
        checked_config(load_config(overrides=["drafting.drafter=vllm_ngram", "engine.name=transformers"]))
    with pytest.raises(ConfigError, match="drafting.drafter: 'trigram' is not allowed"):
        DraftingConfig(drafter="trigram")


@pytest.mark.parametrize(
    "name", [name for name, make in FACTORIES.items() if make is not None and name not in ("rest", "draft_model")]
)
def test_each_entry_builds_its_drafter_from_the_tables_it_names(tiny_model, tmp_path, name):
    config = DraftingConfig(drafter=name, w=3, bigram=BigramConfig(top_k=4, prefix="none"))
    tables = build_tables(tiny_model, None, "tiny", config, tmp_path, rows=2)
    assert needs_model_tables(config) == bool(DRAFTER_KINDS[name].tables)
    for field in ("unigram", "chained", "extended"):  # built exactly when the entry names them
        assert (getattr(tables, field) is not None) == (field in DRAFTER_KINDS[name].tables), field
    drafts = make_drafter(config, tables, 0).propose(DraftContext([1, 5, 9, 2, 5, 9, 2], 3), 2, 3)
    assert tuple(drafts.tokens.shape) == (2, 3)


def test_bigram_and_extended_bigram_are_different_drafters(tiny_model, tmp_path):
    """bigram continues by chaining the table's top-1; extended_bigram by the model's own tokens."""
    rows = {}
    for name in ("bigram", "extended_bigram"):
        config = DraftingConfig(drafter=name, w=5, bigram=BigramConfig(top_k=4, prefix="none"))
        tables = build_tables(tiny_model, None, "tiny", config, tmp_path, rows=4)
        drafter = make_drafter(config, tables, 0)
        rows[name] = [drafter.propose(DraftContext([1, token], 3), 4, 5).tokens.tolist() for token in range(2, 40)]
        assert all(set(d.strategies) == {name} for d in [drafter.propose(DraftContext([1, 2], 3), 4, 5)])
    # Same first tokens (the bigram's top-k), different continuations somewhere.
    assert [[row[0] for row in r] for r in rows["bigram"]] == [[row[0] for row in r] for r in rows["extended_bigram"]]
    assert rows["bigram"] != rows["extended_bigram"]


def test_the_batch_drafter_is_the_batched_drafter_itself_or_the_per_request_one_adapted():
    from drafters.per_request import PerRequestBatchDrafter
    from drafters.suffix import BatchSuffixDrafter

    assert isinstance(make_batch_drafter(DraftingConfig(drafter="batch_suffix", w=4), None, 0), BatchSuffixDrafter)
    ngram = make_batch_drafter(DraftingConfig(drafter="context_ngram", w=4), None, 0)
    assert isinstance(ngram, PerRequestBatchDrafter) and ngram.w == 4
    assert make_batch_drafter(DraftingConfig(drafter="none", w=4), None, 0) is None
