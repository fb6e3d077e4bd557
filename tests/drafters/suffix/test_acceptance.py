"""The acceptance model: probabilities from features, learned online from judged tokens."""

import numpy as np
import pytest

from tests.drafters.reference import AcceptanceModel, sigmoid


def test_cumulative_probabilities_are_products_of_the_conditionals():
    model = AcceptanceModel(np.array([0.0, 1.0]))
    features = np.array([[1.0, 2.0], [1.0, -1.0], [1.0, 0.0]])  # [3, F]
    conditional = sigmoid(np.array([2.0, -1.0, 0.0]))
    assert model.conditional(features) == pytest.approx(conditional)
    assert model.cumulative(features) == pytest.approx(np.cumprod(conditional))


def test_it_learns_what_predicts_acceptance_and_holds_its_prior_on_little_evidence():
    rng = np.random.default_rng(0)
    truth = np.array([-1.0, 2.5])  # bias, and how much the one feature says
    model = AcceptanceModel(np.zeros(2), prior_strength=20.0, refit_every=256)
    model.observe(np.array([[1.0, 1.0]] * 5), np.ones(5))  # a handful: no refit yet
    assert model.weights.tolist() == [0.0, 0.0]
    for _ in range(16):
        features = np.column_stack([np.ones(256), rng.normal(size=256)])  # [256, 2]
        model.observe(features, rng.random(256) < sigmoid(features @ truth))
    assert model.weights == pytest.approx(truth, abs=0.3)
    assert model.seen == 16 * 256 + 5


def test_a_strong_prior_moves_less_and_the_buffer_keeps_the_newest():
    features = np.array([[1.0]] * 600)
    weak, strong = AcceptanceModel(np.zeros(1), prior_strength=1.0), AcceptanceModel(np.zeros(1), prior_strength=1e4)
    for model in (weak, strong):
        model.observe(features, np.ones(600))  # everything accepted
    assert weak.weights[0] > 3.0 and 0 < strong.weights[0] < 0.1
    small = AcceptanceModel(np.zeros(1), capacity=100, refit_every=10**6)
    small.observe(np.arange(250.0)[:, None], np.zeros(250))
    assert sorted(small.features[:, 0].tolist()) == list(np.arange(150.0, 250.0)) and small.seen == 250
    small.observe(np.array([[7.0]]), np.ones(1))  # the oldest (150) gives way
    assert 150.0 not in small.features[:, 0] and 7.0 in small.features[:, 0]
