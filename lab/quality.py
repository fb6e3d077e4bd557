"""quality: every method on every prompt, one request at a time, against transformers' generate.

    python -m lab quality --dataset humaneval|gsm8k|sharegpt|PATH.jsonl --limit N --max-new-tokens M \
        --out results.json [--model M] [--methods hf_greedy,plain,mixed:4:4,...] \
        [--temperature T --top-p P --top-k K --seed S]

Methods: hf_greedy (hf_sample when --temperature > 0), hf_prompt_lookup:N, hf_assisted:L:G
(transformers' assisted generation with the self-draft of L layers, G tokens per draft), plain
(ours without drafts), self_draft:L:G (ours, draft-model speculative sampling with the same
self-draft), DRAFTER:k:w[:tree] (any drafting.drafter; k and/or w may be `auto`; `:tree` verifies
with tree attention; `rest` reads --datastore, and so does `mixed+rest`: the mixed drafter with
retrieved rows). Ours run on the transformers engine, built as a job builds it
(pipeline/engines/build.py). Every method runs on every prompt; the order of methods is rotated
per prompt so slow drifts of this machine's speed fall on all methods alike. Speed-ups are
ratios within this one run. When sampling, request i samples with the same seed in every method.
--dataset takes a comma-separated list; each dataset is a run of its own.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from drafters.draft_model import self_draft_model
from drafters.primitives.sampling import SamplingParams, request_seed
from jobs.benchmark.arguments import add_prompt_args, add_sampling_args
from jobs.benchmark.datasets import encode_prompt, load_prompts
from lab.hf import hf_generate
from jobs.benchmark.report import markdown_table
from jobs.plots import AcceptanceCounts
from pipeline.config import (
    AUTO_MAX,
    Config,
    DraftingConfig,
    EngineConfig,
    ModelConfig,
    RayConfig,
    SamplingConfig,
    TransformersConfig,
)
from pipeline.engines.base import Engine, Failed, Request
from pipeline.engines.build import build_engine
from pipeline.engines.transformers import use_gqa_attention
from pipeline.loading.model import load_model
from pipeline.engines.stats import RequestStats

DEFAULT_METHODS = (
    "hf_greedy,hf_prompt_lookup:3,plain,context_ngram:1:3,bigram:1:1,mixed:1:3,mixed:2:3,mixed:4:4,mixed:10:10"
)


def add_cli_args(parser) -> None:
    add_prompt_args(parser)
    add_sampling_args(parser)
    parser.add_argument("--methods", default=DEFAULT_METHODS, help="comma-separated; the module's docstring says which")
    parser.add_argument("--datastore", default="", help="a datastore directory for rest:k:w and mixed+rest:k:w")
    parser.add_argument("--max-batch-tokens", type=int, default=0, help="tokens fed per call, at most (0: no cap)")


def method_names(args, methods: list[str] = ()) -> list[str]:
    """`methods`, then --methods', with the reference first (hf_greedy, or hf_sample when sampling)."""
    names = list(dict.fromkeys([*methods, *(n.strip() for n in args.methods.split(",") if n.strip())]))
    reference = "hf_greedy" if args.temperature == 0 else "hf_sample"
    return names if reference in names else [reference, *names]


def run(args, methods: list[str] = ()) -> dict:
    """Each of --dataset's datasets (comma-separated), every method on every prompt."""
    loaded = load_model(ModelConfig(name=args.model))
    use_gqa_attention(loaded.model)  # the model as the transformers engine runs it; baselines switch back
    names = method_names(args, methods)
    runners = build_runners(names, loaded, args)
    return {
        "model": args.model,
        "datasets": [run_dataset(dataset, names, runners, loaded, args) for dataset in args.dataset.split(",")],
    }


def markdown(report: dict) -> str:
    return "\n\n".join(
        f"{dataset['dataset']}:\n\n{runs_table(dataset['runs'], dataset['reference'])}"
        for dataset in report["datasets"]
    )


@dataclass
class MethodRun:
    name: str  # see the module docstring
    outputs: list[list[int]] = field(default_factory=list)
    seconds: float = 0.0
    stats: RequestStats = field(default_factory=RequestStats)  # summed over prompts (ours only)
    counts: AcceptanceCounts = field(default_factory=AcceptanceCounts)  # histograms summed over prompts

    @property
    def drafter_k_w(self) -> tuple[str, int, int]:
        """(drafter or method, k, w); for hf_assisted/self_draft k is the draft's layer count L."""
        parts = self.name.split(":")
        if parts[0] == "plain":
            return "none", 1, 0
        if parts[0] in ("hf_greedy", "hf_sample"):
            return parts[0], 1, 0
        if parts[0] == "hf_prompt_lookup":
            return parts[0], 1, int(parts[1])
        k, w = (AUTO_MAX[axis] if value == "auto" else int(value) for axis, value in zip("kw", parts[1:3]))
        return parts[0], k, w

    @property
    def auto(self) -> tuple[bool, bool]:
        """Whether k and w are chosen per step (DRAFTER:auto:auto, DRAFTER:1:auto, ...)."""
        parts = self.name.split(":")
        return len(parts) > 2 and parts[1] == "auto", len(parts) > 2 and parts[2] == "auto"

    @property
    def verify_mode(self) -> str:
        parts = self.name.split(":")
        return parts[3] if len(parts) > 3 else "batch"

    def add(self, stats: RequestStats | None) -> None:
        if stats is None:
            return
        self.counts.add(stats)
        self.stats.draft_step_seconds += stats.draft_step_seconds
        for name in (
            "num_target_calls",
            "num_verified_tokens",
            "num_checked_draft_tokens",
            "sum_acceptance_probability",
            "num_draft_model_calls",
            "draft_seconds",
            "verify_seconds",
        ):
            setattr(self.stats, name, getattr(self.stats, name) + getattr(stats, name))


def build_runners(names: list[str], loaded, args) -> dict:
    """One callable per method: (prompt ids, SamplingParams) -> (generated ids, RequestStats or None)."""
    model, n = loaded.model, args.max_new_tokens
    runners = {}
    for name in names:
        method, k, w = MethodRun(name).drafter_k_w
        if method in ("hf_greedy", "hf_sample"):
            runners[name] = lambda ids, s: (hf_generate(model, ids, n, s), None)
        elif method == "hf_prompt_lookup":
            runners[name] = lambda ids, s, w=w: (hf_generate(model, ids, n, s, prompt_lookup_num_tokens=w), None)
        elif method == "hf_assisted":
            assistant = self_draft_model(model, k)
            assistant.generation_config.num_assistant_tokens = w
            assistant.generation_config.num_assistant_tokens_schedule = "constant"
            runners[name] = lambda ids, s, a=assistant: (hf_generate(model, ids, n, s, assistant_model=a), None)
        else:
            engine = build_engine(our_config(name, args), loaded=loaded)
            runners[name] = lambda ids, s, engine=engine: _ours(engine, ids, n, s)
    return runners


def our_config(name: str, args, batch: int = 1) -> Config:
    """The transformers engine's config for one of our methods (plain, self_draft:L:G or
    DRAFTER:k:w[:tree]), batching `batch` requests per forward call."""
    run = MethodRun(name)
    method, k, w = run.drafter_k_w
    auto_k, auto_w = run.auto
    if method == "self_draft":
        decoder = DraftingConfig(drafter="draft_model", w=w)
        own = TransformersConfig(k=1, draft_layers=k)
    else:
        datastore = args.datastore if method in ("rest", "mixed+rest") else ""
        decoder = DraftingConfig(
            drafter=method.removesuffix("+rest"),
            w=w,
            datastore=datastore,
            auto_w=auto_w,
        )
        own = TransformersConfig(
            k=k, verify=run.verify_mode, auto_k=auto_k, max_batch_requests=batch, max_batch_tokens=args.max_batch_tokens
        )
    return Config(
        model=ModelConfig(name=args.model),
        engine=EngineConfig(name="transformers"),
        drafting=decoder,
        sampling=SamplingConfig(max_new_tokens=args.max_new_tokens),
        transformers=own,
        ray=RayConfig(batch_size=max(batch, RayConfig().batch_size)),
    )


def _ours(engine: Engine, ids: list[int], max_new_tokens: int, sampling: SamplingParams):
    result = engine.generate([Request("benchmark", ids, max_new_tokens, sampling=sampling)])[0]
    if isinstance(result, Failed):
        raise RuntimeError(result.message)
    return result.token_ids, result.stats


def predicted_speedup(alpha: float, gamma: int, c: float) -> float:
    """Leviathan et al. 2023, Theorem 3.8: expected walltime improvement over plain decoding, with
    c = draft-call time / plain target-call time, and a verification call priced as a plain one."""
    if alpha >= 1:
        return (gamma + 1) / (gamma * c + 1)
    return (1 - alpha ** (gamma + 1)) / ((1 - alpha) * (gamma * c + 1))


def predicted_with_verify_cost(alpha: float, gamma: int, t_draft: float, t_verify: float, t_plain: float) -> float:
    """The same expectation with the measured price of a (γ+1)-token verification call: on a CPU
    it costs more than a plain call, which the theorem's setting (a memory-bound GPU) ignores."""
    expected_tokens = gamma + 1 if alpha >= 1 else (1 - alpha ** (gamma + 1)) / (1 - alpha)
    return expected_tokens * t_plain / (gamma * t_draft + t_verify)


def draft_model_predictions(stats: RequestStats, gamma: int, plain: MethodRun | None) -> dict:
    if (
        stats.acceptance_rate is None
        or not stats.num_draft_model_calls
        or plain is None
        or not plain.stats.num_target_calls
    ):
        return {}
    t_draft = stats.draft_seconds / stats.num_draft_model_calls
    t_verify = stats.verify_seconds / stats.num_target_calls
    t_plain = plain.stats.verify_seconds / plain.stats.num_target_calls
    return {
        "c_vs_plain_call": round(t_draft / t_plain, 4),
        "verify_call_vs_plain_call": round(t_verify / t_plain, 3),
        "predicted_speedup_vs_plain": round(predicted_speedup(stats.acceptance_rate, gamma, t_draft / t_plain), 3),
        "predicted_with_verify_cost_vs_plain": round(
            predicted_with_verify_cost(stats.acceptance_rate, gamma, t_draft, t_verify, t_plain), 3
        ),
    }


def summarize(runs: list[MethodRun], reference: MethodRun, plain: MethodRun | None, greedy: bool) -> list[dict]:
    """Speed-ups against `reference` (hf_greedy or hf_sample). Identity is checked against the
    reference when greedy; when sampling, against our plain sampling with the same seeds."""

    def rate(run):
        return sum(map(len, run.outputs)) / run.seconds

    identity_reference = reference if greedy else plain
    results = []
    for run in runs:
        method, k, w = run.drafter_k_w
        stats = run.stats
        generated = sum(len(o) for o in run.outputs)
        result = {
            "method": run.name,
            "k": k,
            "w": w,
            "prompts": len(run.outputs),
            "generated_tokens": generated,
            "tokens_per_second": round(rate(run), 3),
            "tokens_per_call": round(generated / stats.num_target_calls, 3) if stats.num_target_calls else None,
            "verified_tokens_per_call": round(stats.num_verified_tokens / stats.num_target_calls, 2)
            if stats.num_target_calls
            else None,
            "median_draft_ms": None
            if stats.median_draft_seconds is None
            else round(1e3 * stats.median_draft_seconds, 3),
            "acceptance_rate": None if stats.acceptance_rate is None else round(stats.acceptance_rate, 4),
            "draft_cost_ratio": None if stats.draft_cost_ratio is None else round(stats.draft_cost_ratio, 4),
            "identical_fraction": None
            if identity_reference is None
            else round(sum(a == b for a, b in zip(run.outputs, identity_reference.outputs)) / len(run.outputs), 4),
            f"speedup_vs_{reference.name}": round(rate(run) / rate(reference), 3),
            "speedup_vs_plain": None if plain is None else round(rate(run) / rate(plain), 3),
            "predicted_speedup_vs_plain": None,
            **{
                name: getattr(run.counts, name)
                for name in ("accepted_length_histogram", "accepted_rank_histogram", "strategy_rows", "strategy_wins")
            },
        }
        if method == "self_draft":
            result.update(draft_model_predictions(stats, w, plain))
        results.append(result)
    return results


def datastore_summary(directory: str) -> dict | None:
    if not directory:
        return None
    from drafters.datastore import Datastore

    meta = Datastore.open(directory).meta
    return {"directory": directory, **{key: meta.get(key) for key in ("num_tokens", "num_documents", "bytes_on_disk")}}


def runs_table(results: list[dict], reference: str) -> str:
    rows = [
        {**r, "predicted": [r["predicted_speedup_vs_plain"], r.get("predicted_with_verify_cost_vs_plain")]}
        for r in results
    ]
    return markdown_table(
        rows,
        {
            "method": "method",
            "k": "k/L",
            "w": "w/γ",
            "tokens_per_second": "tokens/s",
            "tokens_per_call": "tokens/call",
            "verified_tokens_per_call": "fed/call",
            "median_draft_ms": "draft ms",
            "acceptance_rate": "acceptance",
            "c_vs_plain_call": "c",
            "identical_fraction": "identical",
            f"speedup_vs_{reference}": f"vs {reference}",
            "speedup_vs_plain": "vs plain",
            "predicted": "predicted vs plain (theorem, with verify cost)",
        },
    )


def run_dataset(dataset: str, names: list[str], runners: dict, loaded, args) -> dict:
    prompts = load_prompts(dataset, args.limit)
    base = SamplingParams(args.temperature, args.top_k, args.top_p, args.seed)
    reference = names[0] if names[0] in ("hf_greedy", "hf_sample") else ("hf_greedy" if base.greedy else "hf_sample")
    runs = {name: MethodRun(name) for name in names}
    for index, prompt in enumerate(prompts):
        ids = encode_prompt(loaded.tokenizer, prompt.prompt, prompt.request_id)
        sampling = SamplingParams(base.temperature, base.top_k, base.top_p, request_seed(args.seed, prompt.request_id))
        rotation = index % len(names)
        for name in names[rotation:] + names[:rotation]:
            started = time.perf_counter()
            output, stats = runners[name](ids, sampling)
            runs[name].seconds += time.perf_counter() - started
            runs[name].outputs.append(output)
            runs[name].add(stats)
        print(f"{dataset}: prompt {index + 1}/{len(prompts)} done", flush=True)
    results = summarize(list(runs.values()), runs[reference], runs.get("plain"), base.greedy)
    return {
        "dataset": dataset,
        "reference": reference,
        "limit": args.limit,
        "max_new_tokens": args.max_new_tokens,
        "datastore": datastore_summary(args.datastore),
        "sampling": {"temperature": args.temperature, "top_p": args.top_p, "top_k": args.top_k, "seed": args.seed},
        "runs": results,
    }
