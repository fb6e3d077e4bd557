"""The transformers engine's attention call and KV cache layer: same numbers, fewer copies."""

import copy

import pytest
import torch
from transformers import DynamicCache

from pipeline.engines.transformers.attention import (
    NAME,
    attention_implementation,
    use_gqa_attention,
)
from pipeline.engines.transformers.kv_cache import SLACK_COLUMNS, SlackLayer
from tests.conftest import make_tiny_model


def masked_call(model, cache=None):
    """Logits of a [2, 5] call with an additive tree-like mask over a 3-column cache (or none)."""
    torch.manual_seed(1)
    ids = torch.randint(3, 100, (2, 5))
    columns = 0 if cache is None else cache.get_seq_length()
    visible = torch.ones(2, 5, columns + 5, dtype=torch.bool).tril(diagonal=columns)
    visible[1, 3, columns + 1] = False  # a sibling branch
    mask = torch.zeros(visible.shape).masked_fill(~visible, torch.finfo(torch.float32).min)[:, None]
    positions = torch.arange(columns, columns + 5).repeat(2, 1)
    return model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache).logits


def test_grouped_query_attention_gives_what_sdpa_gives():
    model = make_tiny_model()  # 4 query heads share 2 key/value heads
    assert model.config._attn_implementation == "sdpa"
    prefix = lambda: DynamicCache([(torch.randn(2, 2, 3, 16),) * 2 for _ in range(2)])  # noqa: E731
    torch.manual_seed(2)
    cache = prefix()
    expected = masked_call(model, copy.deepcopy(cache))
    use_gqa_attention(model)
    assert model.config._attn_implementation == NAME
    assert torch.allclose(masked_call(model, cache), expected, atol=1e-6)
    with attention_implementation(model, "sdpa"):
        assert model.config._attn_implementation == "sdpa"
    assert model.config._attn_implementation == NAME


def test_only_sdpa_models_are_switched():
    model = make_tiny_model()
    model.set_attn_implementation("eager")
    use_gqa_attention(model)
    assert model.config._attn_implementation == "eager"


def test_slack_layer_appends_in_place_and_equals_concatenation():
    layer = SlackLayer()
    start = torch.randn(2, 2, 3, 4)
    layer.lazy_initialization(start, start)
    layer.keys, layer.values = start, start.clone()
    chunks = [torch.randn(2, 2, n, 4) for n in (1, 5, 2)]
    layer.update(chunks[0], chunks[0])  # the first call moves the keys into a buffer with slack
    pointer = layer.keys.data_ptr()
    for chunk in chunks[1:]:
        keys, values = layer.update(chunk, chunk)
        assert keys.data_ptr() == pointer  # no copy of what was cached
    assert torch.equal(layer.keys, torch.cat([start] + chunks, dim=2))
    assert torch.equal(layer.values, torch.cat([start] + chunks, dim=2))
    layer.keys = layer.keys.index_select(0, torch.tensor([1]))  # replaced from outside (a row dropped)
    layer.values = layer.values.index_select(0, torch.tensor([1]))
    expected = torch.cat([layer.keys, chunks[0][1:]], dim=2)
    keys, _ = layer.update(chunks[0][1:], chunks[0][1:])
    assert torch.equal(keys, expected) and keys.data_ptr() != pointer


@pytest.mark.parametrize("columns", [1, SLACK_COLUMNS + 7])
def test_slack_layer_grows_past_its_slack(columns):
    layer = SlackLayer()
    empty = torch.zeros(1, 1, 0, 2)
    layer.lazy_initialization(empty, empty)
    layer.keys = layer.values = empty
    added = [torch.full((1, 1, columns, 2), float(i)) for i in range(3)]
    for chunk in added:
        layer.update(chunk, chunk)
    assert torch.equal(layer.keys, torch.cat(added, dim=2))
