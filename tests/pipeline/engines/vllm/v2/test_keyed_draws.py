"""A seed is a text on vLLM 0.34 (pipeline/engines/vllm/v2/keyed_draws.py), tested in vLLM 0.34's own
Sampler, RejectionSampler, RequestState, post_update and speculators (sampled_loop.py, a target with
no model): plain, ours, vLLM's suffix and ngram emit the same tokens for a seed, those of the keyed
draw computed here in plain torch; without the processor they do not; and the draws follow the
target's distribution."""

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from jobs.benchmark.speculators import tiny_model_dir
from pipeline.engines.vllm.v2.keyed_draws import keyed_tokens
from tests.pipeline.engines.vllm.v2.sampled_loop import SampledLoop, loop_config, table_logits

VOCAB, K, BATCH, TOKENS = 128, 4, 4, 24
METHODS = ("plain", "ngrammys", "suffix", "ngram_gpu")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return tiny_model_dir(VOCAB, 256, Path(tmp_path_factory.mktemp("tiny")))


@pytest.fixture(scope="module")
def table() -> torch.Tensor:
    return table_logits(VOCAB)


def requests(settings: dict, count: int = 5) -> list:
    rng = np.random.default_rng(1)
    return [
        (f"r{i}", [int(t) for t in rng.integers(0, VOCAB, 6)], TOKENS, {**settings, "seed": 1000 + i})
        for i in range(count)
    ]


def reference(table: torch.Tensor, prompt: list[int], count: int, settings: dict) -> list[int]:
    """The tokens plain sampling with keyed draws emits, in plain torch: the t-th from the table's row
    for the token before it, with the noise of (seed, t)."""
    tokens = list(prompt)
    one = lambda value, dtype: torch.tensor([value], dtype=dtype)  # noqa: E731
    for t in range(count):
        token = keyed_tokens(
            table[tokens[-1]].unsqueeze(0),
            one(settings["temperature"], torch.float32),
            one(settings["top_k"], torch.int64),
            one(settings["top_p"], torch.float32),
            one(settings["seed"], torch.int64),
            one(t, torch.int64),
        )
        tokens.append(int(token[0]))
    return tokens[len(prompt) :]


@pytest.mark.parametrize(
    "settings",
    [
        {"temperature": 0.5, "top_k": 0, "top_p": 1.0},
        {"temperature": 1.0, "top_k": 0, "top_p": 1.0},
        {"temperature": 1.0, "top_k": 0, "top_p": 0.9},
    ],
    ids=["t0.5", "t1.0", "top_p0.9"],
)
def test_every_method_emits_plain_samplings_tokens_for_a_seed(model_dir, table, settings):
    rows = requests(settings)
    expected = {req_id: reference(table, prompt, TOKENS, s) for req_id, prompt, _, s in rows}
    accepted = {}
    for method in METHODS:
        loop = SampledLoop(loop_config(method, K, BATCH, 256, model_dir), method, K, BATCH, table)
        emitted = loop.run(rows)
        assert {r: tokens[:TOKENS] for r, tokens in emitted.items()} == expected, method
        accepted[method] = loop.accepted
    # Drafts were accepted, and rejected (verified 200-400 draft tokens each): ngram's 5-token matches
    # are rare at temperature 1.
    assert min(accepted["ngrammys"], accepted["suffix"]) >= 20, accepted
    assert settings["temperature"] == 1.0 or accepted["ngram_gpu"] >= 10, accepted


def test_without_the_keyed_draws_a_drafted_row_is_not_plains_text(model_dir, table):
    """vLLM's own seeded sampling: its rejection sampler resamples a rejected position from the residual,
    so drafting changes the text (the contrast that shows the test above can fail)."""
    rows = [(r, p, n, {"temperature": 1.0, "seed": s["seed"]}) for r, p, n, s in requests({}, count=4)]
    texts = {}
    for method in ("plain", "ngrammys"):
        loop = SampledLoop(loop_config(method, K, BATCH, 256, model_dir), method, K, BATCH, table)
        texts[method] = loop.run(rows, keyed=False)
    assert any(texts["plain"][r] != texts["ngrammys"][r] for r in texts["plain"])


def target(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> list[float]:
    """The target's probabilities after temperature, top-k (0: all) and top-p, in plain Python: the
    k likeliest tokens, renormalised, then the fewest likeliest of them whose mass reaches p."""
    scaled = [float(v) / temperature for v in logits]
    order = sorted(range(len(scaled)), key=lambda v: -scaled[v])[: top_k or len(scaled)]
    top = max(scaled[v] for v in order)
    weights = {v: math.exp(scaled[v] - top) for v in order}
    total, mass, kept = sum(weights.values()), 0.0, []
    for v in order:
        if kept and mass >= top_p:
            break
        kept.append(v)
        mass += weights[v] / total
    norm = sum(weights[v] for v in kept)
    return [weights[v] / norm if v in kept else 0.0 for v in range(len(scaled))]


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.5, 0, 1.0), (1.0, 0, 1.0), (1.0, 0, 0.9), (1.0, 5, 1.0)])
@pytest.mark.parametrize("position", [0, 7])
def test_the_keyed_draws_follow_the_targets_distribution(table, temperature, top_k, top_p, position):
    """A chi-square test over 10,000 seeds at one generated position: the draws against the target's
    probabilities after temperature, top-k and top-p, computed apart (bins expected below 5 draws pooled)."""
    draws, row = 10_000, table[5].unsqueeze(0)
    full = lambda value, dtype: torch.full((draws,), value, dtype=dtype)  # noqa: E731
    tokens = keyed_tokens(
        row.expand(draws, -1),
        full(temperature, torch.float32),
        full(top_k, torch.int64),
        full(top_p, torch.float32),
        torch.arange(draws, dtype=torch.int64) * 7919 + 17,
        full(position, torch.int64),
    )
    expected = torch.tensor(target(row[0], temperature, top_k, top_p), dtype=torch.float64) * draws
    observed = torch.bincount(tokens, minlength=VOCAB).double()
    assert observed[expected == 0].sum() == 0  # nothing drawn outside the nucleus
    big = expected >= 5
    observed = torch.cat([observed[big], observed[~big].sum().unsqueeze(0)])
    expected = torch.cat([expected[big], expected[~big].sum().unsqueeze(0)])
    keep = expected > 0
    chi2 = (((observed - expected) ** 2)[keep] / expected[keep]).sum()
    df = int(keep.sum()) - 1
    p = float(torch.special.gammaincc(torch.tensor(df / 2.0, dtype=torch.float64), chi2 / 2.0))
    assert df >= 2 and p > 0.01, (df, float(chi2), p)
