import pytest

from drafters import model_tables
from pipeline.loading.drafters import DrafterTables


@pytest.fixture(scope="session")
def tables(tiny_model):
    """The tiny model's unigram and bigram tables (top 8)."""
    bigram = model_tables.compute_bigram_table(tiny_model, [1], top_k=8, batch_size=64)
    unigram = model_tables.unigram_scores(tiny_model).topk(8).indices.numpy()
    return DrafterTables(unigram=unigram, bigram=bigram)
