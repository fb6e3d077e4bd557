import numpy as np
import torch

from drafters import model_tables
from drafters.base import DraftContext
from drafters.bigram import BigramDrafter
from drafters.context_ngram import ContextNgramDrafter
from drafters.mixed import MixedDrafter
from drafters.unigram import UnigramDrafter


def test_unigram_scores_match_the_formula(tiny_model):
    scores = model_tables.unigram_scores(tiny_model)
    u = tiny_model.get_output_embeddings().weight.double()
    v = tiny_model.get_input_embeddings().weight.double()
    mean = u.mean(dim=0)
    # ||z||_V = sqrt(zᵀ VᵀV z) = ||V z||, computed directly for every token.
    direct = torch.stack([-torch.linalg.norm(v @ (u[x] - mean)) for x in range(u.shape[0])])
    torch.testing.assert_close(scores.double(), direct, rtol=1e-4, atol=1e-4)


def test_unigram_drafter_rows_start_with_the_top_tokens():
    drafts = UnigramDrafter(np.array([7, 3, 5]), pad_token=0).propose(DraftContext([1], 1), k=2, w=3)
    assert drafts.tokens.tolist() == [[7, 7, 7], [3, 7, 7]]


def test_bigram_table_matches_the_models_own_logits(tiny_model):
    prefix = [1, 17]
    table = model_tables.compute_bigram_table(tiny_model, prefix, top_k=4, batch_size=7)
    with torch.no_grad():
        for x in (0, 5, 42, 95):
            logits = tiny_model(torch.tensor([prefix + [x]])).logits[0, -1]
            assert table[x].tolist() == logits.topk(4).indices.tolist(), f"token {x}"


def test_bigram_table_without_prefix(tiny_model):
    table = model_tables.compute_bigram_table(tiny_model, [], top_k=3, batch_size=32)
    with torch.no_grad():
        logits = tiny_model(torch.tensor([[9]])).logits[0, -1]
    assert table[9].tolist() == logits.topk(3).indices.tolist()


def test_chain_extension_follows_top1():
    bigram = np.array([[1, 2], [2, 0], [0, 1]])  # token x -> its two most likely next tokens
    extended = model_tables.chain_extension(bigram, k=2, w=3)
    assert extended[0].tolist() == [[1, 2, 0], [2, 0, 1]]


def test_model_extension_is_the_models_greedy_continuation(tiny_model):
    prefix = [1]
    bigram = model_tables.compute_bigram_table(tiny_model, prefix, top_k=2, batch_size=50)
    extended = model_tables.model_extension(tiny_model, bigram, prefix, k=2, w=3, batch_size=40)
    for x in (3, 60):
        for j in range(2):
            ids = prefix + [x, int(bigram[x, j])]
            with torch.no_grad():
                for _ in range(2):
                    ids.append(int(tiny_model(torch.tensor([ids])).logits[0, -1].argmax()))
            assert extended[x, j].tolist() == ids[2:], f"token {x}, row {j}"


def test_cached_table_is_built_once_and_loaded_read_only(tmp_path):
    calls = []

    def build():
        calls.append(1)
        return np.arange(6, dtype=np.int32).reshape(3, 2)

    path = tmp_path / "tables" / "t.npy"
    first, _ = model_tables.cached_table(path, build)
    second, seconds = model_tables.cached_table(path, build)
    assert calls == [1] and seconds == 0.0
    assert second.tolist() == [[0, 1], [2, 3], [4, 5]]
    assert isinstance(second, np.memmap) and not second.flags.writeable


def test_mixed_puts_context_rows_first_and_fills_from_the_table():
    table = np.array([[[5, 5], [6, 6], [7, 7]]] * 10, dtype=np.int32)  # every token -> rows 55, 66, 77
    mixed = MixedDrafter(ContextNgramDrafter(2, 2), BigramDrafter(table, "bigram"))
    drafts = mixed.propose(DraftContext([1, 2, 3, 4, 1, 2], 2), k=3, w=2)
    assert drafts.tokens.tolist() == [[3, 4], [5, 5], [6, 6]]
    assert drafts.strategies == ("context_ngram", "bigram", "bigram")


def test_mixed_drops_table_rows_that_repeat_a_context_row():
    table = np.array([[[3, 4], [6, 6], [7, 7]]] * 10, dtype=np.int32)
    mixed = MixedDrafter(ContextNgramDrafter(2, 2), BigramDrafter(table, "bigram"))
    drafts = mixed.propose(DraftContext([1, 2, 3, 4, 1, 2], 2), k=3, w=2)
    assert drafts.tokens.tolist() == [[3, 4], [6, 6], [7, 7]]
