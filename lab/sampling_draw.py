"""What one rule for sampled draws on both engines would cost: a sampled token's draw by the
transformers engine's rule and by the vLLM engine's, against the model's step, on real logits.

    python -m lab sampling-draw --batch 1,16 --positions 1,8,32 --out sampling_draw.json

The two rules (docs/how-it-works.md, "Two keyed samplers, and why"):
- *inverse CDF* (the transformers engine: `sample`): the token at
  generated position t is where the request's t-th uniform falls in the cumulative probabilities;
- *keyed Gumbel* (the vLLM engine: drafters/primitives/keyed_noise.py): argmax_v (l_v + G_v), the
  noise G over the whole vocabulary drawn from the key (seed, t); as torch integer arithmetic (what
  the transformers engine would run) and as vLLM's fused CPU kernel where vLLM is installed;
- *inverse CDF, batched*: softmax, cumsum and searchsorted over all N rows in one call: what the
  vLLM engine would run to draw by the transformers engine's rule.

One thread (`torch.set_num_threads(1)`). The model's text is a standard-library module, its logits
at consecutive positions the rows drawn. For B requests drafting P positions each a step draws
N = B P tokens (vLLM draws every draft position; the transformers engine those along the accepted
path, at most as many), and its step is stood in for by one forward call feeding N tokens over a
cached context of `--context` tokens. Each time is the fastest of `--rounds`.

Two more tables: `coupling`, what a draft model's row (`draft_model: self`, the target's first L
layers) would accept per drafted token by Leviathan's rule, sum_v min(p_v, q_v), and by the keyed
rule (the draft drawn with the same keyed noise as the target, accepted iff they match), over
`--keys` keys per position; and `agreement`, how often the two rules give the same token for the
same seed, position and logits today (about sum_v p_v^2: independent draws).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from drafters.primitives.keyed_noise import gumbel_argmax_torch, position_keys
from drafters.primitives.sampling import RandomState, SamplingParams, sample, target_probs
from jobs.benchmark.arguments import integers
from jobs.benchmark.report import markdown_table


def fastest(work, rounds: int) -> float:
    """Seconds of the fastest of `rounds` runs of work()."""
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        work()
        best = min(best, time.perf_counter() - started)
    return best


def fused_kernel():
    """vLLM's fused CPU kernel of the keyed draw (float32 logits [N, V], int64 keys [N] -> [N]), or None."""
    from pipeline.engines.vllm import fused_gumbel_argmax

    return fused_gumbel_argmax(load=True)


def text_ids(tokenizer, tokens: int) -> torch.Tensor:
    """[1, tokens] ids of a fixed, real text: the standard library's json encoder, repeated if short."""
    source = Path(json.__file__).with_name("encoder.py").read_text()
    ids = tokenizer(source, return_tensors="pt").input_ids
    return ids.repeat(1, -(-tokens // ids.shape[1]))[:, :tokens]


@torch.no_grad()
def model_logits(model, ids: torch.Tensor, draft_layers: list[int]) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
    """The target's logits [T, V] at every position of ids [1, T], and each self-draft's (the first
    L layers, then the target's final norm and LM head) as {L: [T, V]}."""
    out = model(input_ids=ids, output_hidden_states=True)
    drafts = {layers: model.lm_head(model.model.norm(out.hidden_states[layers]))[0] for layers in draft_layers}
    return out.logits[0].float(), drafts


@torch.no_grad()
def step_seconds(model, ids: torch.Tensor, context: int, fed: int, rounds: int) -> float:
    """One forward call feeding `fed` tokens over `context` cached tokens (the cache cut back after each)."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    model(input_ids=ids[:, :context], past_key_values=cache, use_cache=True)
    block = ids[:, context : context + fed]

    def step():
        model(input_ids=block, past_key_values=cache, use_cache=True)
        cache.crop(context)

    return fastest(step, rounds)


def inverse_cdf_batched(logits: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """[N] the inverse-CDF draws of softmax(logits [N, V]) with uniforms [N], batched as vLLM would run them."""
    cdf = logits.softmax(dim=-1).double().cumsum(dim=-1)  # [N, V]
    return (
        torch.searchsorted(cdf, (uniforms * cdf[:, -1]).unsqueeze(1), right=True).squeeze(1).clamp_max(cdf.shape[1] - 1)
    )


def draw_row(
    logits: torch.Tensor, batch: int, positions: int, step: float, fused, rounds: int, sampling: SamplingParams
) -> dict:
    """The draws of one step of `batch` requests x `positions` positions: ms per step and per token."""
    n = batch * positions
    rows = logits[torch.arange(n) % logits.shape[0]]  # [n, V]
    probs = target_probs(rows, sampling)
    scaled = (rows / sampling.temperature).contiguous()
    uniforms = torch.rand(n, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    keys = position_keys(torch.arange(batch).repeat_interleave(positions), torch.arange(positions).repeat(batch))
    times = {
        "inverse_cdf": fastest(lambda: [sample(probs[i], float(uniforms[i])) for i in range(n)], rounds),
        "inverse_cdf_batched": fastest(lambda: inverse_cdf_batched(scaled, uniforms), rounds),
        "gumbel_torch": fastest(lambda: gumbel_argmax_torch(scaled, keys), rounds),
    }
    if fused is not None:
        times["gumbel_fused"] = fastest(lambda: fused(scaled, keys), rounds)
    row = {"batch": batch, "positions": positions, "step_ms": round(1e3 * step, 2)}
    for way, seconds in times.items():
        row[f"{way}_us_per_token"] = round(1e6 * seconds / n, 1)
    for way in ("gumbel_torch", "gumbel_fused"):
        if way in times:  # what drawing this way instead of by the inverse CDF adds to the step
            row[f"{way}_extra_pct_of_step"] = round(100 * (times[way] - times["inverse_cdf"]) / step, 2)
    return row


def coupling_row(
    target: torch.Tensor, draft: torch.Tensor, layers: int, keys_per_position: int, draw, sampling: SamplingParams
) -> dict:
    """Acceptance per drafted token of a self-draft of `layers` layers: Leviathan's (exact expectation)
    and the keyed rule's (the share of keys whose draft draw equals the target's)."""
    p, q = target_probs(target, sampling).double(), target_probs(draft, sampling).double()  # [T, V]
    positions = target.shape[0]
    seeds = torch.arange(keys_per_position).repeat_interleave(positions)
    keys = position_keys(seeds, torch.arange(positions).repeat(keys_per_position))
    index = torch.arange(positions).repeat(keys_per_position)
    scaled = lambda logits: (logits.float() / sampling.temperature)[index].contiguous()  # noqa: E731
    matches = (draw(scaled(target), keys) == draw(scaled(draft), keys)).double()
    return {
        "draft_layers": layers,
        "positions": positions,
        "keys": keys_per_position,
        "leviathan_acceptance": round(float(torch.minimum(p, q).sum(-1).mean()), 4),
        "keyed_acceptance": round(float(matches.mean()), 4),
        "keyed_standard_error": round(float(matches.std() / len(matches) ** 0.5), 4),
    }


def agreement_row(target: torch.Tensor, seeds: int, draw, sampling: SamplingParams) -> dict:
    """How often today's two rules draw the same token for the same seed, position and logits."""
    positions = target.shape[0]
    probs = target_probs(target, sampling)
    same = []
    for seed in range(seeds):
        uniforms = RandomState(seed, positions).position_uniforms
        inverse = torch.tensor([sample(probs[t], float(uniforms[t])) for t in range(positions)])
        keys = position_keys(torch.full((positions,), seed), torch.arange(positions))
        same.append((inverse == draw((target / sampling.temperature).contiguous(), keys)).double())
    return {
        "seeds": seeds,
        "positions": positions,
        "same_token_fraction": round(float(torch.cat(same).mean()), 4),
        "independent_draws_expect": round(float(probs.double().pow(2).sum(-1).mean()), 4),
    }


def add_cli_args(parser) -> None:
    from pipeline.config import ModelConfig

    parser.add_argument("--model", default=ModelConfig().name)
    parser.add_argument("--batch", type=integers, default=[1, 16], help="requests per step")
    parser.add_argument("--positions", type=integers, default=[1, 8, 32], help="positions drawn per request per step")
    parser.add_argument("--context", type=int, default=256, help="cached tokens under each timed step")
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--draft-layers", type=integers, default=[8, 26, 28], help="self-drafts for the coupling table")
    parser.add_argument("--keys", type=int, default=64, help="keys per position for the coupling table")
    parser.add_argument("--rounds", type=int, default=5)


def run(args) -> dict:
    from pipeline.config import ModelConfig
    from pipeline.loading.model import load_model

    fused = fused_kernel()
    loaded = load_model(ModelConfig(name=args.model, dtype="float32", num_threads=1))
    torch.set_num_threads(1)
    model, sampling = loaded.model, SamplingParams(temperature=args.temperature)
    most = max(b * p for b in args.batch for p in args.positions)
    ids = text_ids(loaded.tokenizer, args.context + most)
    logits, drafts = model_logits(model, ids[:, args.context :], args.draft_layers)
    draw = fused or gumbel_argmax_torch
    draws = [
        draw_row(logits, b, p, step_seconds(model, ids, args.context, b * p, args.rounds), fused, args.rounds, sampling)
        for b in args.batch
        for p in args.positions
    ]
    sample_rows = logits[:64]
    return {
        "model": args.model,
        "dtype": "float32",
        "threads": torch.get_num_threads(),
        "vocab": logits.shape[1],
        "temperature": args.temperature,
        "fused_kernel": fused is not None,
        "draws": draws,
        "coupling": [
            coupling_row(sample_rows, drafts[layers][:64], layers, args.keys, draw, sampling)
            for layers in args.draft_layers
        ],
        "agreement": [agreement_row(sample_rows, args.keys, draw, sampling)],
    }


def markdown(report: dict) -> str:
    return "\n\n".join(markdown_table(report[table]) for table in ("draws", "coupling", "agreement"))
