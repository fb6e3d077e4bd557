"""Sampling through the whole decoder on a tiny model with an 8-token vocabulary: the tokens it
emits at positions 2 and 3 follow the target's own distribution, computed exactly, for k > 1
point drafts and for a self-draft model; deliberately broken verifiers fail the same test."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import pipeline.engines.transformers.verification
from drafters.bigram import BigramDrafter
from drafters.draft_model import DraftModelDrafter, self_draft_model
from drafters.model_tables import chain_extension, compute_bigram_table
from pipeline.engines.transformers.speculative_decoder import SpeculativeDecoder
from pipeline.engines.transformers.verification import Verdict, walk_sampled
from drafters.primitives.sampling import SamplingParams, sample, target_probs

V = 8
PROMPT = [3, 1, 4, 1, 5]
SAMPLING = SamplingParams(temperature=1.5, top_k=6, top_p=0.97)
SEEDS = 1000
# Chi-square over the joint (token 2, token 3) cells. The seeds are fixed, so the test is
# deterministic; the threshold is the 1e-4 upper quantile, i.e. an exact decoder would fail for
# only 1 in 10,000 choices of seeds, while the broken verifiers below land far above it.
P_VALUE = 1e-4


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(1)
    config = LlamaConfig(
        vocab_size=V,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        initializer_range=0.4,
        bos_token_id=0,
        eos_token_id=None,
        pad_token_id=0,
    )
    return LlamaForCausalLM(config).eval()


@torch.no_grad()
def exact_joint(model) -> dict[tuple[int, int], float]:
    """P(token 2 = a, token 3 = b) under plain sampling, summed over token 1, from the model's probs."""
    first = target_probs(model(torch.tensor([PROMPT])).logits[0, -1], SAMPLING).double()  # [V]
    sequences = torch.tensor([PROMPT + [t1, t2] for t1, t2 in itertools.product(range(V), repeat=2)])
    logits = model(sequences).logits  # [V*V, len+2, V]
    second = target_probs(logits[:, -2], SAMPLING).double()  # [V*V, V]: p(t2 | t1), repeated over t2
    third = target_probs(logits[:, -1], SAMPLING).double()  # [V*V, V]: p(t3 | t1, t2)
    joint: dict[tuple[int, int], float] = {}
    for i, (t1, t2) in enumerate(itertools.product(range(V), repeat=2)):
        for t3 in range(V):
            joint[(t2, t3)] = joint.get((t2, t3), 0.0) + float(first[t1] * second[i, t2] * third[i, t3])
    return joint


def chi_square_quantile(dof: int, p_value: float) -> float:
    """Upper quantile of chi-square (Wilson-Hilferty approximation, a few per cent off at worst here)."""
    z = {1e-3: 3.0902, 1e-4: 3.7190}[p_value]
    return dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3


def chi_square(counts: dict, exact: dict, n: int) -> tuple[float, int]:
    """Statistic and degrees of freedom; cells expecting fewer than 5 are pooled into one."""
    statistic, pooled_observed, pooled_expected, cells = 0.0, 0, 0.0, 0
    for cell, p in exact.items():
        if n * p < 5:
            pooled_observed, pooled_expected = pooled_observed + counts.get(cell, 0), pooled_expected + n * p
            continue
        statistic += (counts.get(cell, 0) - n * p) ** 2 / (n * p)
        cells += 1
    if pooled_expected > 0:
        statistic += (pooled_observed - pooled_expected) ** 2 / pooled_expected
        cells += 1
    return statistic, cells - 1


def joint_counts(decoder: SpeculativeDecoder, seeds: int = SEEDS) -> dict[tuple[int, int], int]:
    counts: dict[tuple[int, int], int] = {}
    for seed in range(seeds):
        tokens = decoder.generate(PROMPT, 3, sampling=SamplingParams(**{**SAMPLING.__dict__, "seed": seed})).token_ids
        counts[(tokens[1], tokens[2])] = counts.get((tokens[1], tokens[2]), 0) + 1
    return counts


def bigram_decoder(model) -> SpeculativeDecoder:
    """k = 3 rows: the table's top-3 next tokens after the last one, each continued by the table."""
    table = compute_bigram_table(model, [], top_k=3, batch_size=V)
    return SpeculativeDecoder(model, None, BigramDrafter(chain_extension(table, 3, 2), "bigram"), 3, 2)


def self_draft_decoder(model) -> SpeculativeDecoder:
    return SpeculativeDecoder(model, None, DraftModelDrafter(self_draft_model(model, 1)), 1, 2)


def root_probs_verify(tree, probs, uniforms) -> Verdict:
    """Wrong: after a match, samples every position from the root's probs, not the matched node's."""
    return walk_sampled(tree, probs[:1].expand_as(probs), uniforms)


def residual_free_speculative_sample(tree, draft, p, sample_uniforms) -> Verdict:
    """Wrong: on rejection samples from p instead of norm(max(0, p - q))."""
    q, drafts = draft.probs, tree.tokens
    for i, x in enumerate(drafts):
        if float(draft.accept_uniforms[i]) * float(q[i, x]) >= float(p[i, x]):
            return Verdict(drafts[:i] + [sample(p[i], float(sample_uniforms[i]))], i, 0, path=tuple(range(i)))
    return Verdict(drafts + [sample(p[-1], float(sample_uniforms[-1]))], len(drafts), 0, path=tuple(range(len(drafts))))


# The root-probs walk lands far above the threshold (chi2 5,906 against 51 at 1,000 seeds; 134
# against 30 at 150), so 150 seeds find it; the residual-free sample lands at about twice the
# threshold at 1,000 seeds (113 against 51), so it keeps them all.
@pytest.mark.parametrize(
    "make_decoder,broken,seeds",
    [
        (bigram_decoder, None, SEEDS),
        (bigram_decoder, ("walk_sampled", root_probs_verify), 150),
        (self_draft_decoder, None, SEEDS),
        (self_draft_decoder, ("speculative_sample", residual_free_speculative_sample), SEEDS),
    ],
)
def test_tokens_2_and_3_follow_the_target_distribution(model, make_decoder, broken, seeds, monkeypatch):
    if broken:
        monkeypatch.setattr(pipeline.engines.transformers.verification, *broken)
    decoder = make_decoder(model)
    counts = joint_counts(decoder, seeds)
    statistic, dof = chi_square(counts, exact_joint(model), seeds)
    threshold = chi_square_quantile(dof, P_VALUE)
    if broken:
        assert statistic > threshold, f"{broken[0]} broken went unnoticed: chi2 {statistic:.1f} <= {threshold:.1f}"
    else:
        assert statistic <= threshold, (
            f"not the target's distribution: chi2 {statistic:.1f} > {threshold:.1f} ({dof} dof)"
        )


def test_drafts_were_accepted_across_rows(model):
    """The statistical test means something only if drafts (and rows other than the first) win."""
    decoder = bigram_decoder(model)
    ranks, accepted = np.zeros(3, dtype=int), 0
    for seed in range(200):
        stats = decoder.generate(PROMPT, 6, sampling=SamplingParams(**{**SAMPLING.__dict__, "seed": seed})).stats
        ranks[: len(stats.accepted_rank_histogram)] += stats.accepted_rank_histogram
        accepted += sum(a * n for a, n in enumerate(stats.accepted_length_histogram))
    assert accepted > 100 and ranks[1] + ranks[2] > 20, (accepted, ranks)
