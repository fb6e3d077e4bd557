"""Exact sampling verification: literal cases, and statistical tests that the emitted tokens follow
the target's distribution (with a deliberately broken verifier to show the test can fail)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from pipeline.engines.transformers.tree import build_tree, node_logits
from pipeline.engines.transformers.verification import (
    DraftEvidence,
    Verdict,
    walk_sampled,
)
from pipeline.engines.transformers.verification import (
    speculative_sample as sample_speculatively,
)
from drafters.primitives.sampling import SamplingParams, request_seed, sample, target_probs

V = 4
# The target is a Markov chain: row t is p(next | t). The draft model is a different chain.
TARGET = torch.tensor(
    [[0.50, 0.30, 0.15, 0.05], [0.10, 0.60, 0.20, 0.10], [0.25, 0.25, 0.25, 0.25], [0.70, 0.10, 0.10, 0.10]],
    dtype=torch.float64,
)
DRAFT = torch.tensor(
    [[0.10, 0.20, 0.30, 0.40], [0.40, 0.30, 0.20, 0.10], [0.05, 0.05, 0.45, 0.45], [0.25, 0.25, 0.25, 0.25]],
    dtype=torch.float64,
)
START, LENGTH, SAMPLES = 0, 3, 12000
# With 64 outcomes and 12000 samples the expected total-variation distance of an exact sampler is
# about 0.5 * sum_x sqrt(2 p(x) / (pi N)) <= 0.5 * sqrt(2 * 64 / (pi * 12000)) = 0.029; 0.05 leaves
# room for chance while a bias of a few percent on the likely sequences exceeds it.
TV_THRESHOLD = 0.05


def exact_distribution() -> dict[tuple[int, ...], float]:
    probs = {}
    for seq in itertools.product(range(V), repeat=LENGTH):
        prob, prev = 1.0, START
        for token in seq:
            prob, prev = prob * float(TARGET[prev, token]), token
        probs[seq] = prob
    return probs


def total_variation(samples: list[tuple[int, ...]]) -> float:
    exact = exact_distribution()
    counts: dict[tuple[int, ...], int] = {}
    for seq in samples:
        counts[seq] = counts.get(seq, 0) + 1
    return 0.5 * sum(abs(counts.get(seq, 0) / len(samples) - p) for seq, p in exact.items())


def verify_point_drafts(drafts, probs, uniforms) -> Verdict:
    """The verifier on k point-draft rows: drafts [k, w]; probs [k, w+1, V] at the block [last, row]."""
    tree = build_tree(drafts)
    return walk_sampled(tree, node_logits(tree, probs), uniforms)


def speculative_sample(drafts, q, p, accept_uniforms, sample_uniforms, lenience=1.0) -> Verdict:
    """The verifier on a draft model's row: drafts [γ]; q [γ, V]; p [γ+1, V]."""
    return sample_speculatively(
        build_tree(drafts[None]), DraftEvidence(q, accept_uniforms, lenience), p, sample_uniforms
    )


def generate_point_drafts(rng, verify) -> tuple[int, ...]:
    drafts = torch.tensor([[0, 1], [1, 1], [3, 0]])  # fixed guesses, as a context drafter might make
    sequence = [START]
    while len(sequence) <= LENGTH:
        blocks = torch.cat([torch.full((3, 1), sequence[-1]), drafts], dim=1)  # [k, w+1]
        probs = TARGET[blocks]  # [k, w+1, V]: the target's next-token distribution after each block token
        verdict = verify(drafts, probs, torch.from_numpy(rng.random(3)))
        sequence += verdict.tokens
    return tuple(sequence[1 : LENGTH + 1])


def generate_with_draft_model(rng, verify, gamma=2) -> tuple[int, ...]:
    sequence = [START]
    while len(sequence) <= LENGTH:
        drafts, prev = [], sequence[-1]
        for _ in range(gamma):
            prev = sample(DRAFT[prev], float(rng.random()))
            drafts.append(prev)
        block = [sequence[-1]] + drafts
        q, p = DRAFT[block[:-1]], TARGET[block]  # [γ, V], [γ+1, V]
        verdict = verify(
            torch.tensor(drafts), q, p, torch.from_numpy(rng.random(gamma)), torch.from_numpy(rng.random(gamma + 1))
        )
        sequence += verdict.tokens
    return tuple(sequence[1 : LENGTH + 1])


def broken_point_verify(drafts, probs, uniforms):
    """Wrong: trusts the first row's first draft token without sampling it."""
    verdict = verify_point_drafts(drafts, probs, uniforms)
    return (
        verdict
        if verdict.tokens[0] == int(drafts[0, 0])
        else type(verdict)(tokens=[int(drafts[0, 0])] + verdict.tokens[:1], num_accepted=1, row=0)
    )


def broken_speculative_sample(drafts, q, p, accept_uniforms, sample_uniforms):
    """Wrong: on rejection samples from p instead of the residual max(0, p - q)."""
    tokens = []
    for i in range(drafts.shape[0]):
        x = int(drafts[i])
        if float(accept_uniforms[i]) * float(q[i, x]) < float(p[i, x]):
            tokens.append(x)
            continue
        tokens.append(sample(p[i], float(sample_uniforms[i])))
        return Verdict(tokens, i, 0)
    tokens.append(sample(p[-1], float(sample_uniforms[-1])))
    return Verdict(tokens, drafts.shape[0], 0)


@pytest.mark.parametrize(
    "generate,verify,exact",
    [
        (generate_point_drafts, verify_point_drafts, True),
        (generate_point_drafts, broken_point_verify, False),
        (generate_with_draft_model, speculative_sample, True),
        (generate_with_draft_model, broken_speculative_sample, False),
    ],
)
def test_emitted_tokens_follow_the_target_distribution(generate, verify, exact):
    rng = np.random.default_rng(0)
    distance = total_variation([generate(rng, verify) for _ in range(SAMPLES)])
    if exact:
        assert distance < TV_THRESHOLD, f"exact verifier off by TV {distance:.3f}"
    else:
        assert distance > TV_THRESHOLD, f"the broken verifier went unnoticed (TV {distance:.3f})"


def test_identical_draft_and_target_accept_everything():
    p = TARGET[[0, 1, 2]]
    verdict = speculative_sample(torch.tensor([1, 2]), p[:2], p, torch.full((2,), 0.999), torch.full((3,), 0.5))
    assert verdict.num_accepted == 2 and verdict.tokens[:2] == [1, 2] and len(verdict.tokens) == 3
    assert verdict.acceptance_probabilities == (1.0, 1.0)


def test_rejection_samples_from_the_residual():
    q = torch.tensor([[0.0, 1.0, 0.0, 0.0]], dtype=torch.float64)
    p = torch.tensor([[0.5, 0.0, 0.5, 0.0], [0.25] * 4], dtype=torch.float64)
    # p(1) = 0 < q(1): always rejected; the residual max(0, p - q) is p itself here.
    verdict = speculative_sample(torch.tensor([1]), q, p, torch.tensor([0.0]), torch.tensor([0.7, 0.0]))
    assert verdict.num_accepted == 0 and verdict.tokens == [2] and verdict.acceptance_probabilities == (0.0,)


def test_lenience_accepts_more_and_is_recorded_as_lossy():
    q = torch.tensor([[0.2, 0.8, 0.0, 0.0]], dtype=torch.float64)
    p = torch.tensor([[0.6, 0.4, 0.0, 0.0], [0.25] * 4], dtype=torch.float64)
    drafts, accept, samples = torch.tensor([1]), torch.tensor([0.7]), torch.tensor([0.1, 0.1])
    # Exact: accept x=1 with probability 0.4 / 0.8 = 0.5 < 0.7, so it is rejected.
    assert speculative_sample(drafts, q, p, accept, samples).num_accepted == 0
    # Lenience 0.5: 0.4 / (0.5 * 0.8) = 1, so it is accepted.
    verdict = speculative_sample(drafts, q, p, accept, samples, lenience=0.5)
    assert verdict.num_accepted == 1 and verdict.acceptance_probabilities == (1.0,)


def test_point_drafts_keep_only_matching_rows():
    drafts = torch.tensor([[1, 3], [2, 2]])
    probs = torch.zeros(2, 3, V, dtype=torch.float64)
    probs[:, 0, 2] = 1.0  # the target surely emits 2 first: row 1 survives
    probs[1, 1, 2] = 1.0  # then 2 again: row 1's second draft matches
    probs[1, 2, 0] = 1.0  # then the bonus 0
    verdict = verify_point_drafts(drafts, probs, torch.tensor([0.5, 0.5, 0.5]))
    assert verdict.tokens == [2, 2, 0] and verdict.num_accepted == 2 and verdict.row == 1
    # P(first sample in {1, 2}) = 1, then P(second sample == 2 | row 1 alone) = 1.
    assert verdict.acceptance_probabilities == (1.0, 1.0)


def test_target_probs_temperature_top_k_top_p():
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0])
    torch.testing.assert_close(target_probs(logits, SamplingParams(1.0)), logits.softmax(-1))
    torch.testing.assert_close(target_probs(logits, SamplingParams(0.5)), (logits / 0.5).softmax(-1))
    assert (target_probs(logits, SamplingParams(1.0, top_k=2)) > 0).tolist() == [True, True, False, False]
    # softmax is [0.64, 0.24, 0.09, 0.03]: the nucleus at 0.8 needs the first two tokens.
    nucleus = target_probs(logits, SamplingParams(1.0, top_p=0.8))
    assert (nucleus > 0).tolist() == [True, True, False, False]
    assert nucleus.sum().item() == pytest.approx(1.0)


def test_sample_never_returns_a_zero_probability_token():
    probs = torch.tensor([0.3, 0.7, 0.0, 0.0], dtype=torch.float32)
    assert sample(probs, 0.999999999) == 1
    assert sample(probs, 0.0) == 0


def test_request_seed_is_stable_and_differs_per_row():
    assert request_seed(0, "a") == request_seed(0, "a")
    assert len({request_seed(0, "a"), request_seed(0, "b"), request_seed(1, "a")}) == 3
