"""sampling: are sampled rows the model's own samples, with speculation on the vLLM engine?

    python -m lab sampling --dataset sharegpt --limit 28 --max-new-tokens 96 \
        --temperature 0.9 --spec batch_suffix:1:auto

vLLM plain, vllm_ngram (vllm_suffix where arctic-inference is installed) and the --spec methods on
vLLM, each engine built as a job builds it, generate every prompt with the same per-request seeds.
Every emitted token, given the tokens before it, must be a draw from the target's distribution at
that position (temperature, top-k and top-p applied; the model's logits computed again with
transformers on the same weights). Per method:
- the mean negative log-likelihood per token of the text under the model (temperature 1), and
  the same expected under exact sampling (Σ over positions of E_target[-log p_model]), with the
  z-score of the difference;
- the p-value of a chi-square test (ten bins) that the tokens' randomised probability integral
  transforms, u = P(X < x) + V P(X = x) with V uniform, are uniform on [0, 1), as they are for
  exact samples.
Tests use the same checks (tests/pipeline/engines/vllm/sampling_checks.py). Also per method: tokens/s,
tokens per target call, and how many rows are token for token plain sampling's row with the same
seed (issue 55: all of them on the vLLM engine).

`--compare-draws` runs each vLLM engine a second time with vLLM's own draws and rejection sampler
(the engine's keyed draws switched off: `VllmEngine.keyed_draws`), the two taking turns chunk by
chunk in one process, for the cost of the keyed draws and their acceptance against vLLM's.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import time

import numpy as np
import torch

from drafters.primitives.sampling import SamplingParams, target_probs
from jobs.benchmark.arguments import add_prompt_args, add_sampling_args
from jobs.benchmark.report import markdown_table
from pipeline.engines.base import Failed, Request


def add_cli_args(parser) -> None:
    add_prompt_args(parser, limit=28, max_new_tokens=96)
    add_sampling_args(parser)
    parser.set_defaults(temperature=0.9)
    parser.add_argument("--spec", default="batch_suffix:1:auto", help="our methods on vLLM, comma-separated")
    parser.add_argument("--dtype", default="float32", choices=("auto", "float32", "bfloat16"))
    parser.add_argument("--batch-size", type=int, default=16, help="the engine's slots")
    parser.add_argument(
        "--compare-draws",
        action="store_true",
        help="also run each method with vLLM's own draws and rejection sampler, taking turns "
        "with the engine's keyed draws chunk by chunk (speed, tokens per call)",
    )
    parser.add_argument("--chunks", type=int, default=4, help="chunks of the prompts the draws take turns on")


@dataclasses.dataclass
class Evidence:
    all_tokens: list[float] = dataclasses.field(default_factory=list)  # PIT of every emitted token
    after_rejection: list[float] = dataclasses.field(default_factory=list)  # PIT under the residual
    impossible: int = 0  # emitted tokens the target gives no mass
    nll: float = 0.0  # Σ -log p_model(token)
    nll_expected: float = 0.0  # Σ E_target[-log p_model]
    nll_variance: float = 0.0

    @property
    def z(self) -> float:
        return (self.nll - self.nll_expected) / math.sqrt(self.nll_variance) if self.nll_variance else 0.0


@torch.no_grad()
def target_rows(model, request: Request, tokens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's distribution (the request's sampling settings applied) and the raw model's
    log-probabilities at each generated position: [len(tokens), V] each."""
    ids = torch.tensor([list(request.prompt_ids) + tokens[:-1]])
    logits = model(ids).logits[0, len(request.prompt_ids) - 1 :].double()
    return target_probs(logits, request.sampling).double(), logits.log_softmax(-1)


def pit(probs: torch.Tensor, token: int, v: float) -> float | None:
    """Randomised probability integral transform of `token` under probs [V]; None if it has no mass."""
    mass = float(probs[token])
    return None if mass <= 0 else float(probs[:token].sum()) + v * mass


def uniformity_p_value(us: list[float], bins: int = 10) -> float:
    """Chi-square test that `us` are uniform on [0, 1): the p-value."""
    counts = np.bincount(np.minimum((np.array(us) * bins).astype(int), bins - 1), minlength=bins)
    expected = len(us) / bins
    statistic = float(((counts - expected) ** 2 / expected).sum())
    return float(
        torch.special.gammaincc(
            torch.tensor((bins - 1) / 2, dtype=torch.float64), torch.tensor(statistic / 2, dtype=torch.float64)
        )
    )


def gather(model, requests: list[Request], token_ids: list[list[int]], proposals: dict | None = None) -> Evidence:
    """The evidence of `token_ids` (one list per request). `proposals`, by request id, are the drafts
    our proposer made (the proposer's `Proposal`): the token that replaced a
    rejected draft token is checked against the target with that token removed."""
    rng = np.random.default_rng(0)
    evidence = Evidence()
    for request, tokens in zip(requests, token_ids):
        probs, logprobs = target_rows(model, request, tokens)
        for position, token in enumerate(tokens):
            add(evidence.all_tokens, evidence, pit(probs[position], token, rng.random()))
            surprise = -logprobs[position].clamp(min=-1e4)
            mean = float((probs[position] * surprise).sum())
            evidence.nll += float(surprise[token])
            evidence.nll_expected += mean
            evidence.nll_variance += float((probs[position] * (surprise - mean) ** 2).sum())
        for proposal in (proposals or {}).get(request.request_id, []):
            actual = tokens[proposal.position : proposal.position + len(proposal.tokens)]
            rejected = next((j for j, (a, b) in enumerate(zip(proposal.tokens, actual)) if a != b), None)
            if rejected is None:
                continue
            residual = probs[proposal.position + rejected].clone()
            residual[proposal.tokens[rejected]] = 0.0  # the draft put all its mass on its token
            if residual.sum() > 0:
                add(
                    evidence.after_rejection,
                    evidence,
                    pit(residual / residual.sum(), tokens[proposal.position + rejected], rng.random()),
                )
    return evidence


def add(us: list[float], evidence: Evidence, u: float | None) -> None:
    if u is None:
        evidence.impossible += 1
    else:
        us.append(u)


def run(args) -> dict:
    """Every method's sampled rows checked against the model's distribution."""
    from jobs.benchmark.datasets import encode_prompt, load_prompts
    from jobs.benchmark.engines import build_engines, parse_methods
    from pipeline.loading.model import load_model

    if args.temperature <= 0:
        raise SystemExit("sampling checks sampled rows: give --temperature > 0")
    names = ["plain", "vllm_ngram"] + (["vllm_suffix"] if importlib.util.find_spec("arctic_inference") else [])
    methods = parse_methods(",".join(names + [n for n in args.spec.split(",") if n.strip()]), "vllm")
    base = [f"model.name={json.dumps(args.model)}", f"model.dtype={args.dtype}", "vllm.cpu_kv_cache_gib=1"]
    engines = build_engines(base, methods, [args.batch_size])
    tokenizer = next(iter(engines.values())).tokenizer
    sampling = SamplingParams(args.temperature, args.top_k, args.top_p)
    requests = [
        Request(
            p.request_id,
            encode_prompt(tokenizer, p.prompt, p.request_id),
            args.max_new_tokens,
            sampling=dataclasses.replace(sampling, seed=args.seed + i),
        )
        for i, p in enumerate(load_prompts(args.dataset, args.limit))
    ]
    model = load_model(engines[methods[0], args.batch_size].config.model).model
    draws = ("keyed", "vllm") if args.compare_draws else ("keyed",)
    runs = {}
    for method in methods:
        engine = engines[method, args.batch_size]
        ways = draws if hasattr(engine, "keyed_draws") else ("keyed",)
        runs.update({(method, way): run for way, run in generate_in_turns(engine, requests, ways, args.chunks).items()})
    plain = [r.token_ids if not isinstance(r, Failed) else None for r in runs[methods[0], "keyed"][0]]
    rows = [method_row(model, requests, method, way, *runs[method, way], plain) for method, way in runs]
    return {
        "dataset": args.dataset,
        "model": args.model,
        "dtype": args.dtype,
        "sampling": dataclasses.asdict(sampling),
        "seeds": f"{args.seed}..{args.seed + len(requests) - 1}",
        "max_new_tokens": args.max_new_tokens,
        "batch": args.batch_size,
        "chunks": args.chunks,
        "runs": rows,
    }


def generate_in_turns(engine, requests: list[Request], draws: tuple[str, ...], chunks: int) -> dict:
    """{way: (results, seconds)} of `engine` on `requests` for each way of `draws`: the prompts in
    `chunks` chunks, each run with every way in turn (one way first, then the other), so that drift
    on the machine falls on both alike."""
    size = max(1, -(-len(requests) // chunks))
    out = {way: ([], 0.0) for way in draws}
    for chunk, start in enumerate(range(0, len(requests), size)):
        for way in draws if chunk % 2 == 0 else draws[::-1]:
            if len(draws) > 1:
                engine.keyed_draws(way == "keyed")
            began = time.perf_counter()
            results = engine.generate(requests[start : start + size])
            done, seconds = out[way]
            out[way] = (done + results, seconds + time.perf_counter() - began)
    if len(draws) > 1:
        engine.keyed_draws(True)
    return out


def method_row(model, requests, method, way: str, results, seconds: float, plain: list) -> dict:
    """One method's (and draws') row: speed, identity with plain sampling, and the evidence."""
    done = [(request, r) for request, r in zip(requests, results) if not isinstance(r, Failed)]
    evidence = gather(model, [request for request, _ in done], [r.token_ids for _, r in done])
    tokens = max(len(evidence.all_tokens) + evidence.impossible, 1)
    calls = sum(r.stats.num_target_calls for _, r in done)
    return {
        "method": method.name,
        "draws": way,
        "tokens": tokens,
        "failed_rows": len(results) - len(done),
        "tokens_per_s": round(tokens / seconds, 2),
        "tokens_per_call": round(tokens / max(calls, 1), 4),
        "identical_to_plain": sum(not isinstance(r, Failed) and r.token_ids == p for r, p in zip(results, plain)),
        "checked_draft_tokens": sum(r.stats.num_checked_draft_tokens for _, r in done),
        "nll_per_token": round(evidence.nll / tokens, 4),
        "nll_per_token_expected": round(evidence.nll_expected / tokens, 4),
        "z": round(evidence.z, 2),
        "pit_p_value": uniformity_p_value(evidence.all_tokens),
        "impossible_tokens": evidence.impossible,
        "example": done[0][1].text[:300] if done else None,
    }


def markdown(report: dict) -> str:
    return markdown_table(
        report["runs"],
        {
            "method": "method",
            "draws": "draws",
            "tokens": "tokens",
            "tokens_per_s": "tokens/s",
            "tokens_per_call": "tokens/call",
            "identical_to_plain": "rows = plain's",
            "checked_draft_tokens": "draft tokens checked",
            "nll_per_token": "NLL/token",
            "nll_per_token_expected": "expected",
            "z": "z",
            "pit_p_value": "PIT uniformity p",
            "impossible_tokens": "impossible",
        },
    )
