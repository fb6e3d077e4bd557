"""The rejection sampler's kernels as vLLM runs them on this CPU, against their definitions on random
inputs: vLLM's own CPU expand kernel is wrong (the canary below fails once vLLM fixes it: then
cpu_sampling.py can go), ours is right, and the accept/reject test, the recovered-token draw
and the greedy path of vLLM's CPU build agree with plain Python loops."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from pipeline.engines.vllm.compat import install, llvmlite_set_aside, sampling_is_exact
from pipeline.engines.vllm.cpu_sampling import expand


@pytest.fixture(scope="module")
def rejection_sampler():
    """vLLM's rejection sampler module with the CPU platform's kernels registered, as a CPU worker
    starts, and ours installed, as our engine does."""
    from vllm.platforms import current_platform
    from vllm.v1.sample import rejection_sampler

    if not current_platform.is_cpu():
        pytest.skip("vLLM's CPU kernels: this vLLM is not the CPU build")
    with llvmlite_set_aside():
        current_platform.register_triton_kernel_overrides()
    install()
    return rejection_sampler


def random_batch(seed: int, batch: int = 6, vocab: int = 40, max_drafts: int = 5):
    """Draft counts (some 0), drafts, target probabilities peaked on some drafts, the rest [T, V]."""
    generator = torch.Generator().manual_seed(seed)
    counts = torch.randint(0, max_drafts + 1, (batch,), generator=generator)
    cu = counts.cumsum(0).to(torch.int32)
    total = int(cu[-1])
    drafts = torch.randint(0, vocab, (total,), generator=generator, dtype=torch.int32)
    probs = torch.rand(total, vocab, generator=generator) ** 4
    probs[torch.arange(total), drafts.long()] += torch.rand(total, generator=generator) * 4 * probs.sum(-1)
    probs = probs / probs.sum(-1, keepdim=True)
    return counts.tolist(), cu, drafts, probs, generator


def expand_reference(values: list, counts: list[int], replace_from, replace_to) -> list:
    return [replace_to if v == replace_from else v for v, n in zip(values, counts) for _ in range(n)]


def vllms_own_cpu_expand():
    """vLLM's `_expand_kernel_impl` as shipped (a fresh copy of its module: ours may be installed in
    the one Python has loaded)."""
    spec = importlib.util.find_spec("vllm.utils.cpu_triton_utils")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module._expand_kernel_impl


@pytest.mark.parametrize("seed", range(5))
def test_our_expand_matches_its_definition_for_every_dtype(seed):
    counts, cu, _, _, generator = random_batch(seed)
    for values in (
        torch.rand(len(counts), generator=generator).round(decimals=1),
        torch.randint(0, 3, (len(counts),), generator=generator, dtype=torch.int32),
        torch.randint(0, 3, (len(counts),), generator=generator, dtype=torch.int64),
    ):
        output = torch.full((int(cu[-1]),), -7, dtype=values.dtype)
        expand(output, values, cu, 0, 1)
        assert output.tolist() == pytest.approx(expand_reference(values.tolist(), counts, 0, 1))


def test_vllms_cpu_expand_leaves_float_outputs_unset_so_ours_is_needed(rejection_sampler):
    """Canary: fails once vLLM's CPU expand kernel is right (then that vLLM version leaves
    compat.REACHES["expand_kernel"], and cpu_sampling.expand goes once no supported version needs it)."""
    counts, cu = [2, 3, 1], torch.tensor([2, 5, 6], dtype=torch.int32)
    temperature = torch.tensor([0.9, 0.7, 1.0])
    output = torch.full((6,), -7.0)
    vllms_own_cpu_expand()(output, temperature, cu, 0, 1)
    assert output.tolist() != pytest.approx(expand_reference(temperature.tolist(), counts, 0, 1))


def test_the_rejection_sampler_as_installed_is_exact(rejection_sampler):
    assert sampling_is_exact()
    empty = torch.zeros(0, 9)
    assert rejection_sampler.apply_top_k_top_p(empty, torch.zeros(0, dtype=torch.int32), None) is empty


@pytest.mark.parametrize("seed", range(8))
def test_vllms_cpu_accept_reject_matches_its_definition(rejection_sampler, seed):
    """A draft token is accepted where p_target(token) >= u (no draft probabilities: ngram-like
    drafters); the first rejection emits the recovered token; all accepted, the bonus follows."""
    counts, cu, drafts, probs, generator = random_batch(seed)
    batch, width = len(counts), max(counts) + 1
    bonus = torch.randint(0, probs.shape[1], (batch, 1), generator=generator)
    recovered = torch.randint(0, probs.shape[1], drafts.shape, generator=generator, dtype=torch.int32)
    uniform = torch.rand(drafts.shape, generator=generator, dtype=torch.float64)
    greedy = torch.rand(batch, generator=generator) < 0.2
    output = torch.full((batch, width), -1, dtype=torch.int32)
    rejection_sampler._rejection_random_sample(
        output, cu, drafts, None, probs, bonus, recovered, uniform, greedy, width - 1, None
    )
    expected = torch.full((batch, width), -1, dtype=torch.int32)
    start = 0
    for r, n in enumerate(counts):
        if not greedy[r]:
            for position in range(start, start + n):
                if probs[position, drafts[position]] >= uniform[position]:
                    expected[r, position - start] = drafts[position]
                else:
                    expected[r, position - start] = recovered[position]
                    break
            else:
                expected[r, n] = bonus[r, 0]
        start += n
    assert torch.equal(output, expected)


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("with_draft_probs", [False, True])
def test_vllms_cpu_recovered_tokens_match_their_definition(rejection_sampler, seed, with_draft_probs):
    """Recovered token = argmax over x of max(p - q, 0)(x) / E_x (E exponential per request and x):
    a draw from norm(max(p - q, 0)); q is one-hot on the draft without draft probabilities."""
    counts, cu, drafts, probs, generator = random_batch(seed)
    draft_probs = torch.rand(probs.shape, generator=generator).softmax(-1) if with_draft_probs else None
    inv_q = torch.empty(len(counts), probs.shape[1]).exponential_(generator=generator).reciprocal()
    output = torch.empty_like(drafts)
    rejection_sampler._sample_recovered_tokens(output, cu, drafts, draft_probs, probs, inv_q, max_spec_len=max(counts))
    start = 0
    for r, n in enumerate(counts):
        for position in range(start, start + n):
            residual = probs[position].clone()
            if draft_probs is None:
                residual[drafts[position]] = 0.0
            else:
                residual = (residual - draft_probs[position]).clamp(min=0)
            assert int(output[position]) == int((residual * inv_q[r]).argmax())
        start += n


@pytest.mark.parametrize("seed", range(4))
def test_vllms_cpu_greedy_path_matches_its_definition(rejection_sampler, seed):
    counts, cu, drafts, probs, generator = random_batch(seed)
    batch, width = len(counts), max(counts) + 1
    argmax = probs.argmax(-1)
    bonus = torch.randint(0, probs.shape[1], (batch, 1), generator=generator)
    output = torch.full((batch, width), -1, dtype=torch.int32)
    rejection_sampler._rejection_greedy_sample(output, cu, drafts, argmax, bonus, None, width - 1, None, None)
    start = 0
    for r, n in enumerate(counts):
        row = []
        for position in range(start, start + n):
            row.append(int(argmax[position]))
            if row[-1] != drafts[position]:
                break
        else:
            row.append(int(bonus[r, 0]))
        assert output[r].tolist() == row + [-1] * (width - len(row))
        start += n
