import pytest
import torch

import pipeline.engines.transformers.cost_model as cost_model
from pipeline.engines.transformers.cost_model import (
    CostModel,
    cached_cost_model,
    measure,
    timed_call,
)
from pipeline.forward import prefill


def synthetic() -> CostModel:
    # relative cost = 1 + 0.1 * (k * width - 1) at ℓ = 10, twice that slope at ℓ = 100
    ks, widths = (1, 2, 4), (1, 3, 5)
    relative = [[[1 + slope * (k * w - 1) for w in widths] for k in ks] for slope in (0.1, 0.2)]
    return CostModel(ks, widths, (10, 100), relative, [0.01, 0.02], "cpu")


def test_cost_is_the_grid_value_on_the_grid_and_linear_between():
    costs = synthetic()
    assert costs.cost(4, 4, 10) == pytest.approx(1 + 0.1 * 19)  # k = 4, w + 1 = 5
    assert costs.cost(3, 2, 10) == pytest.approx((costs.cost(2, 2, 10) + costs.cost(4, 2, 10)) / 2)
    assert costs.cost(2, 2, 55) == pytest.approx((costs.cost(2, 2, 10) + costs.cost(2, 2, 100)) / 2)
    assert costs.cost(4, 4, 1000) == costs.cost(4, 4, 100)  # held constant beyond the longest context
    # Beyond the largest block: the last segment's slope continues (cost 1 + slope * (k * width - 1)
    # is linear in width, so the extrapolation is exact here).
    assert costs.cost(4, 8, 100) == pytest.approx(1 + 0.2 * (4 * 9 - 1))


def test_save_load_round_trip(tmp_path):
    costs = synthetic()
    costs.save(tmp_path / "c.json")
    assert CostModel.load(tmp_path / "c.json") == costs


def test_timing_a_block_leaves_the_cache_as_it_was(tiny_model):
    cache = prefill(tiny_model, list(range(1, 20)))
    keys = cache.layers[0].keys.clone()
    assert timed_call(tiny_model, cache, torch.randint(0, 96, (4, 3))) > 0
    assert cache.get_seq_length() == 19 and torch.equal(cache.layers[0].keys, keys)


def test_measured_once_then_read_from_the_cache(tiny_model, tmp_path, monkeypatch):
    small = lambda model: measure(model, ks=(1, 4), widths=(1, 3), context_lengths=(8, 32), repeats=2)
    monkeypatch.setattr(cost_model, "measure", small)
    first = cached_cost_model(tiny_model, "f" * 64, tmp_path)
    assert len(first.relative) == 2 and all(t > 0 for t in first.single_token_seconds)
    monkeypatch.setattr(cost_model, "measure", lambda model: pytest.fail("measured again"))
    assert cached_cost_model(tiny_model, "f" * 64, tmp_path) == first


def test_plot_costs_writes_one_heatmap_per_context_length(tiny_model_dir, tmp_path, monkeypatch):
    from jobs import plot_costs

    monkeypatch.setattr(plot_costs, "measure", lambda model, context_lengths: measure(
        model, ks=(1, 2), widths=(1, 2), context_lengths=context_lengths, repeats=1))
    paths = plot_costs.main(["--model", str(tiny_model_dir), "--out", str(tmp_path), "--context-lengths", "8,16"])
    assert [p.name for p in paths] == ["costs_l8.png", "costs_l16.png"]
    assert all(p.read_bytes()[:4] == b"\x89PNG" for p in paths)
