import pytest
import torch

from drafters.base import DraftContext
from drafters.draft_model import DraftModelDrafter, self_draft_model
from pipeline.loading.drafters import load_draft_model
from pipeline.config import ModelConfig, TransformersConfig
from pipeline.engines.transformers.speculative_decoder import SpeculativeDecoder
from pipeline.loading.model import load_model
from drafters.primitives.sampling import RandomState, SamplingParams
from tests.conftest import make_tiny_model


def test_self_draft_is_the_first_layers_and_leaves_the_target_alone():
    target = make_tiny_model()
    before = target(torch.tensor([[1, 2, 3]])).logits
    draft = self_draft_model(target, 1)
    assert len(target.model.layers) == 2 and target.config.num_hidden_layers == 2
    assert len(draft.model.layers) == 1 and draft.model.layers[0] is target.model.layers[0]
    assert draft.lm_head.weight.data_ptr() == target.lm_head.weight.data_ptr()  # shared, not copied
    torch.testing.assert_close(target(torch.tensor([[1, 2, 3]])).logits, before)
    # By hand: embeddings, layer 0, final norm, LM head.
    hidden = target.model.embed_tokens(torch.tensor([[1, 2, 3]]))
    positions = torch.arange(3)[None]
    rotary = target.model.rotary_emb(hidden, positions)
    mask = torch.full((3, 3), float("-inf")).triu(1)[None, None]
    hidden = target.model.layers[0](hidden, attention_mask=mask, position_embeddings=rotary, position_ids=positions)
    hidden = hidden[0] if isinstance(hidden, tuple) else hidden
    expected = target.lm_head(target.model.norm(hidden))
    torch.testing.assert_close(draft(torch.tensor([[1, 2, 3]])).logits, expected, atol=1e-5, rtol=1e-5)


def test_self_draft_layer_count_is_checked():
    with pytest.raises(ValueError, match="transformers.draft_layers: must be from 1 to 1"):
        self_draft_model(make_tiny_model(), 2)


def test_draft_cache_follows_the_context_across_steps_and_requests():
    """After rejections and on a new request the drafter's logits equal a fresh forward's."""
    draft = self_draft_model(make_tiny_model(), 1)
    drafter = DraftModelDrafter(draft)
    contexts = [[1, 5, 9, 2], [1, 5, 9, 2, 7, 7], [1, 5, 9, 3], [4, 4], [4, 4, 8, 1, 2, 3]]
    for tokens in contexts:
        drafts = drafter.propose(DraftContext(tokens, 3), 1, 3)
        expected, sequence = [], list(tokens)
        for _ in range(3):
            expected.append(int(draft(torch.tensor([sequence])).logits[0, -1].argmax()))
            sequence.append(expected[-1])
        assert drafts.tokens[0].tolist() == expected, f"context {tokens}"
        assert drafts.probs is None and drafts.num_model_calls == 3


def test_sampled_drafts_carry_the_distribution_they_were_drawn_from():
    draft = self_draft_model(make_tiny_model(), 1)
    sampling = SamplingParams(temperature=0.7, top_k=5)
    context = DraftContext([1, 5, 9], 3, sampling, RandomState(0, 8))
    drafts = DraftModelDrafter(draft).propose(context, 1, 2)
    assert drafts.probs.shape == (1, 2, 96)
    first = torch.softmax(draft(torch.tensor([[1, 5, 9]])).logits[0, -1] / 0.7, -1)
    torch.testing.assert_close(drafts.probs[0, 0][drafts.probs[0, 0] > 0].sum(), torch.tensor(1.0))
    assert (drafts.probs[0, 0] > 0).sum() == 5  # the top-5 cut
    assert drafts.probs[0, 0, drafts.tokens[0, 0]] > 0
    assert int(drafts.probs[0, 0].argmax()) == int(first.argmax())


def test_greedy_with_a_self_draft_is_plain_greedy(tiny_model):
    drafter = DraftModelDrafter(self_draft_model(tiny_model, 1))
    plain = SpeculativeDecoder(tiny_model, None, None, 1, 0)
    for gamma in (1, 3, 6):
        ours = SpeculativeDecoder(tiny_model, None, drafter, 1, gamma)
        for prompt in ([1, 5, 9, 2, 5, 9, 2, 7], [1, 40, 41], [1]):
            result = ours.generate(prompt, 30)
            assert result.token_ids == plain.generate(prompt, 30).token_ids, f"gamma {gamma} prompt {prompt}"
            assert result.stats.num_draft_model_calls > 0 and result.stats.draft_cost_ratio > 0
            assert 0 <= result.stats.acceptance_rate <= 1


def test_a_draft_model_directory_must_share_the_tokenizer(tiny_model_dir, smollm2):
    config = TransformersConfig(draft_model=str(tiny_model_dir))
    assert load_draft_model(config, ModelConfig(), smollm2).config.hidden_size == 64
    with pytest.raises(ValueError, match="transformers.draft_model: .* different tokenizer"):

        class OtherTokenizer:
            def get_vocab(self):
                return {"a": 0}

        target = load_model(ModelConfig(name=str(tiny_model_dir)))
        load_draft_model(config, ModelConfig(), type(target)(target.model, OtherTokenizer(), "", ""))
