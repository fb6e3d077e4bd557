"""The keyed Gumbel-max draw (drafters/primitives/keyed_noise.py): the torch form draws the very
tokens of vLLM's fused CPU kernel for the same keys, each key's draw is fixed, and over many keys
the draws follow softmax(logits) (drawn as the vLLM engine draws: with vLLM's kernel, by compat.py)."""

import pytest
import torch
from vllm.platforms import current_platform

from drafters.primitives.keyed_noise import gumbel_argmax, gumbel_argmax_torch, position_keys
from pipeline.engines.vllm.compat import fused_gumbel_argmax, keyed_draw
from tests.pipeline.engines.vllm.sampling_checks import uniformity_p_value

# Registers torch.ops._C.fused_gumbel_argmax from the build of vLLM's kernels this CPU runs (AVX2,
# AVX512 or AVX512-BF16), as vLLM loads them: importing vllm._C itself is an illegal instruction
# on a CPU without AVX512-BF16.
current_platform.import_kernels()


@pytest.mark.parametrize("vocab", [7, 49152])
def test_the_torch_draw_is_vllms_fused_kernel_token_for_token(vocab):
    generator = torch.Generator().manual_seed(vocab)
    logits = torch.randn(40, vocab, generator=generator) * 3
    logits[:5, vocab // 3 :] = float("-inf")  # top-k or top-p left a few tokens
    logits[5, :] = 0.0  # flat
    keys = position_keys(torch.randint(-(2**63), 2**63 - 1, (40,), generator=generator), torch.arange(40))
    fused = fused_gumbel_argmax()
    assert fused is not None
    assert torch.equal(gumbel_argmax(logits, keys, fused), gumbel_argmax_torch(logits, keys))
    assert torch.equal(keyed_draw(logits, keys), gumbel_argmax_torch(logits, keys))
    assert bool((gumbel_argmax(logits, keys, fused)[:5] < vocab // 3).all())


def test_a_key_fixes_its_draw_and_the_next_position_draws_anew():
    logits = torch.zeros(1, 1000).expand(64, 1000)
    keys = position_keys(torch.full((64,), 12345), torch.arange(64))
    draws = keyed_draw(logits, keys)
    assert torch.equal(draws, keyed_draw(logits, keys))
    assert len(set(draws.tolist())) > 55  # 64 positions of one seed: independent draws from 1000 tokens
    other_seed = keyed_draw(logits, position_keys(torch.full((64,), 12346), torch.arange(64)))
    assert (other_seed != draws).sum() > 55


def test_keyed_draws_follow_the_softmax():
    """20,000 keys (seeds x positions) on one row of logits: the randomised PIT of the draws is uniform."""
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0, float("-inf"), 1.5])
    seeds = torch.arange(200).repeat_interleave(100)
    keys = position_keys(seeds, torch.arange(100).repeat(200))
    draws = keyed_draw(logits.expand(len(keys), -1).contiguous(), keys)
    probs = logits.softmax(-1).double()
    cdf = torch.cat([torch.zeros(1, dtype=torch.float64), probs.cumsum(0)])
    v = torch.rand(len(draws), generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    pits = (cdf[draws] + v * probs[draws]).tolist()
    assert uniformity_p_value(pits) > 1e-3
    assert int((draws == 6).sum()) == 0
