import numpy as np
import pytest
import torch

from drafters.adaptive import AcceptanceEstimate, AdaptiveController
from drafters.base import Drafts
from drafters.context_ngram import ContextNgramDrafter
from drafters.budget import LinearStepCost
from pipeline.engines.transformers.speculative_decoder import SpeculativeDecoder

PROMPT = [1, 5, 9, 2, 5, 9, 2, 7]


class FixedCosts:
    """Stands in for the engine's learned step cost: a call feeding n tokens costs 1 + per_token (n - 1)
    one-token calls, whatever the calls it observes."""

    def __init__(self, per_token: float):
        self.per_token = per_token

    def observe(self, tokens, seconds):
        pass

    def cost(self) -> LinearStepCost:
        return LinearStepCost(1 - self.per_token, self.per_token)


def flat_costs(per_token: float) -> FixedCosts:
    return FixedCosts(per_token)


def test_expected_tokens_add_disjoint_rows_and_merge_shared_prefixes():
    controller = AdaptiveController(flat_costs(0.0))  # no evidence yet: every row kind has α = 1/2
    one = Drafts(tokens=torch.tensor([[1, 2, 3]]), strategies=("a",))
    assert controller.expected_tokens(one)[1][0].tolist() == pytest.approx([1.5, 1.75, 1.875])  # geometric
    # Different first tokens: at most one row can be right, so their chances add.
    two = Drafts(tokens=torch.tensor([[1, 2, 3], [4, 5, 6]]), strategies=("a", "a"))
    assert controller.expected_tokens(two)[1][1].tolist() == pytest.approx([2.0, 2.5, 2.75])
    # The same first token: one event at depth 1 (P = 1/2), alternatives after it (P = 1/4 + 1/4).
    shared = Drafts(tokens=torch.tensor([[1, 2, 3], [1, 5, 6]]), strategies=("a", "a"))
    assert controller.expected_tokens(shared)[1][1].tolist() == pytest.approx([1.5, 2.0, 2.25])


def test_estimates_learn_from_accepted_lengths():
    estimate = AcceptanceEstimate()
    estimate.observe(3, 4)  # 3 accepted, then a rejection
    assert estimate.alpha(0.5, 2) == pytest.approx((1 + 3) / (2 + 4))
    estimate.observe(4, 4)  # all accepted: no rejection seen
    assert estimate.alpha(0.5, 2) == pytest.approx((1 + 7) / (2 + 8))


def test_a_new_request_starts_from_what_earlier_requests_accepted():
    drafts = Drafts(tokens=torch.tensor([[1, 2, 3]]), strategies=("bigram",))
    pool = {}
    first = AdaptiveController(flat_costs(0.1), pool)
    assert first.alpha(("bigram", 0)) == pytest.approx(0.5)  # nothing seen yet
    for _ in range(30):
        first.observe(drafts, [0])
    second = AdaptiveController(flat_costs(0.1), pool)
    assert second.alpha(("bigram", 0)) < 0.1
    assert second.choose(drafts).w == 0  # the pool says this row kind is never right


def test_the_controller_drafts_when_it_pays_and_not_when_it_does_not():
    drafts = Drafts(tokens=torch.tensor([[1, 2, 3, 4], [1, 2, 5, 6]]), strategies=("a", "a"))
    cheap, dear = AdaptiveController(flat_costs(0.0)), AdaptiveController(flat_costs(0.6))
    assert (cheap.choose(drafts).k, cheap.choose(drafts).w) == (2, 4)  # verifying is free: all of it
    # Each token costs 0.6 of a call: at the prior alpha of 0.5, plain steps win...
    assert dear.choose(drafts).w == 0
    for _ in range(20):
        dear.observe(drafts, [4, 2])  # ...until row 0 proves to be always right
    choice = dear.choose(drafts)
    assert choice.k == 1 and choice.w >= 1


@pytest.mark.parametrize("per_token", [0.0, 0.15, 1.0])
def test_adaptive_decoding_is_plain_greedy(tiny_model, per_token):
    plain = SpeculativeDecoder(tiny_model, None, None, 1, 0).generate(PROMPT, 60).token_ids
    decoder = SpeculativeDecoder(tiny_model, None, ContextNgramDrafter(3, 1, 0), 4, 8, costs=flat_costs(per_token))
    result = decoder.generate(PROMPT, 60)
    assert result.token_ids == plain
    if per_token == 1.0:
        assert result.stats.num_target_calls == len(plain)  # never drafted


def test_auto_in_the_config_sets_the_maximum_and_the_flag():
    from pipeline.config import load_config
    from pipeline.engines.build import checked_config
    from pipeline.engines.vllm.settings import AUTO_MAX_VLLM_W

    config = load_config(
        overrides=[
            "engine.name=transformers",
            "drafting.drafter=context_ngram",
            "transformers.k=auto",
            "drafting.w=auto",
        ]
    )
    assert (config.transformers.k, config.drafting.w, config.transformers.auto_k, config.drafting.auto_w) == (
        8,
        8,
        True,
        True,
    )
    fixed_k = load_config(
        overrides=["engine.name=transformers", "drafting.drafter=context_ngram", "transformers.k=1", "drafting.w=auto"]
    )
    assert (fixed_k.transformers.k, fixed_k.transformers.auto_k, fixed_k.drafting.auto_w) == (1, False, True)
    # vLLM verifies one row per request: its drafts may be longer (its own setting, when the job starts).
    on_vllm = checked_config(
        load_config(overrides=["engine.name=vllm", "drafting.drafter=context_ngram", "drafting.w=auto"])
    ).drafting
    assert (on_vllm.w, on_vllm.auto_w) == (AUTO_MAX_VLLM_W, True) and AUTO_MAX_VLLM_W > 8


def test_rows_are_allocated_to_the_strategy_that_has_been_right():
    # Two context rows then two bigram rows; for this request the bigram rows have been right.
    drafts = Drafts(
        tokens=torch.tensor([[1, 2], [3, 4], [5, 6], [7, 8]]),
        strategies=("context_ngram", "context_ngram", "bigram", "bigram"),
    )
    controller = AdaptiveController(flat_costs(0.05))
    for _ in range(10):
        controller.observe(drafts, [0, 0, 2, 0])
    choice = controller.choose(drafts)
    assert choice.rows[0] == 2  # the bigram's first row goes first, ahead of the context rows
    assert 0 not in choice.rows[:2]


def test_auto_w_is_refused_for_a_draft_model():
    from pipeline.config import ConfigError, load_config
    from pipeline.engines.build import checked_config

    with pytest.raises(ConfigError, match="drafting.w"):
        checked_config(
            load_config(
                overrides=[
                    "engine.name=transformers",
                    "drafting.drafter=draft_model",
                    "transformers.k=1",
                    "drafting.w=auto",
                ]
            )
        )


def test_one_shape_chooser_weighs_the_requests_a_call_serves():
    from drafters.budget import choose_shape

    table = np.array([[1.9, 2.7], [2.2, 3.1]])  # expected tokens of (k, w) for one request
    alone = choose_shape([table], lambda k, w: 1 + 0.1 * k * w, 2, 2)
    # 2.7 / 1.2 beats 3.1 / 1.4 (both rows), 2.2 / 1.2, 1.9 / 1.1 and a plain step's 1 / 1.
    assert (alone.k, alone.w) == (1, 2) and alone.expected_tokens == pytest.approx(2.7)
    # Eight requests in one call whose cost grows with every token fed: drafting no longer pays.
    batch = choose_shape([table] * 8, lambda k, w: 1 + 8 * 0.6 * k * w, 2, 2)
    assert (batch.k, batch.w) == (0, 0) and batch.expected_tokens == 8
    # A request that proposed nothing counts one token; the cap on tokens fed per request holds.
    capped = choose_shape([table, None], lambda k, w: 1 + 0.1 * k * w, 2, 2, max_fed=2)
    assert capped.k * capped.w <= 2 and capped.expected_tokens == pytest.approx(1 + table[0, 1])
