"""The sampling-draw benchmark's pieces on small literal cases (no model): the batched inverse CDF
draws what the transformers engine's `sample` draws, a draft equal to the target is always accepted
by both rules, and today's two rules agree about as often as independent draws."""

import torch

from drafters.primitives.keyed_noise import gumbel_argmax_torch
from drafters.primitives.sampling import SamplingParams, sample
from lab.sampling_draw import agreement_row, coupling_row, inverse_cdf_batched


def test_the_batched_inverse_cdf_draws_what_sample_draws():
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(50, 1000, generator=generator) * 3
    logits[:10, 300:] = float("-inf")  # top-k left a few tokens
    uniforms = torch.rand(50, generator=generator, dtype=torch.float64)
    uniforms[0] = 1.0 - 2.0**-53  # the top of the cdf: the last token with mass
    probs = logits.softmax(dim=-1)
    expected = [sample(probs[i], float(uniforms[i])) for i in range(50)]
    assert inverse_cdf_batched(logits, uniforms).tolist() == expected


def test_a_draft_equal_to_the_target_is_always_accepted_by_both_rules():
    logits = torch.randn(8, 200, generator=torch.Generator().manual_seed(1))
    row = coupling_row(logits, logits.clone(), 3, 4, gumbel_argmax_torch, SamplingParams(temperature=0.8))
    assert row["leviathan_acceptance"] == 1.0 and row["keyed_acceptance"] == 1.0


def test_todays_two_rules_agree_as_independent_draws_do():
    logits = torch.tensor([[3.0, 1.0, 0.0, -1.0]]).repeat(50, 1)
    row = agreement_row(logits, 40, gumbel_argmax_torch, SamplingParams(temperature=1.0))
    assert abs(row["same_token_fraction"] - row["independent_draws_expect"]) < 0.06
