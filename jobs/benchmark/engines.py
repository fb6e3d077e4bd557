"""engines: vLLM plain, its own methods and ours, side by side on the same prompts, each run by
the engine a job would build for it.

    python -m jobs.benchmark engines --batch 1,16 --spec batch_suffix:1:auto --rounds 3 --limit 16 ...

runs vLLM plain, vllm_ngram, vllm_suffix (when arctic-inference is installed) and our --spec
methods on vLLM, and the --reference methods on our transformers engine, side by side: per round
and batch size a chunk of --limit prompts no earlier run used, so --rounds x batch sizes x
--limit prompts in all.

A method is a name: `plain` (no drafts), `vllm_ngram[:W]` and `vllm_suffix[:W]` (vLLM's own
methods), or `DRAFTER:k:w` (ours; k and/or w may be `auto`). Methods with the engine `vllm` run on
vLLM; `transformers:METHOD` runs our own decoder, for reference. Every engine is built once.

A run is one round at one batch size B: every method generates the run's own chunk of prompts, B
requests per call, the methods taking turns call by call (the order rotated every call), so that a
drift of this machine's speed falls on all alike. Each run takes prompts no earlier run used: the methods that
draft from finished outputs (`vllm_suffix`, our `suffix`) never draft a prompt's answer from its
own earlier output, and all of them have the same earlier outputs to draw on, as in a corpus job.
Tokens/s are medians over the rounds; outputs are compared with `plain` on the same engine and
dtype, prompt by prompt.
"""

from __future__ import annotations

import importlib.util
import json
import statistics
import time
from dataclasses import dataclass, field

from jobs.benchmark.arguments import add_prompt_args, integers
from jobs.benchmark.corpus_tasks import structured_outputs
from jobs.benchmark.datasets import encode_prompt, load_prompts
from jobs.benchmark.report import markdown_table
from pipeline.config import ENGINES, Config, load_config
from pipeline.engines.base import Engine, Request, Result
from pipeline.engines.build import build_engines as pipeline_engines

# vLLM's own methods at the settings the issue measured: n-gram k = 5, q 2..4; suffix k = 16.
VLLM_DEFAULTS = {"vllm_ngram": ("5", ["drafting.ngram.min_q=2", "drafting.ngram.max_q=4"]), "vllm_suffix": ("16", [])}


def add_cli_args(parser) -> None:
    add_prompt_args(parser, limit=16)
    parser.add_argument(
        "--batch", type=integers, default=[1, 16], help="batch sizes: running requests, comma-separated"
    )
    parser.add_argument("--spec", default="batch_suffix:1:auto", help="our methods on vLLM, comma-separated")
    parser.add_argument(
        "--reference",
        default="context_ngram:auto:auto",
        help='our methods on the transformers engine beside them ("": none)',
    )
    parser.add_argument("--dtype", default="float32", choices=("auto", "float32", "bfloat16"))
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="runs per batch size, each on --limit prompts no earlier run used; tokens/s is the median",
    )
    parser.add_argument(
        "--per-call",
        type=int,
        default=0,
        help="requests per generate call (0: the batch size, each call draining from B running "
        "requests to 1; a multiple of B keeps B running for most of the call, as a job does)",
    )
    parser.add_argument(
        "--json-schema",
        action="store_true",
        help="every request carries its corpus task's JSON schema as structured_outputs (corpus-extract-json)",
    )


@dataclass(frozen=True)
class Method:
    engine: str  # "vllm" or "transformers"
    name: str  # as given, without the engine prefix

    def overrides(self) -> list[str]:
        """The config settings (over the base config) that make this method."""
        parts = self.name.split(":")
        if parts[0] == "plain":
            return ["drafting.drafter=none", "drafting.w=0"]
        # A method drafts throughout (drafting.speculation on): the comparison is of methods, not of modes.
        if parts[0] in VLLM_DEFAULTS:
            w, extra = VLLM_DEFAULTS[parts[0]]
            return [
                f"drafting.drafter={parts[0]}",
                f"drafting.w={parts[1] if len(parts) > 1 else w}",
                *extra,
                "drafting.speculation=on",
            ]
        if len(parts) not in (3, 4):
            raise ValueError(
                f"method {self.name!r}: expected plain, vllm_ngram[:W], vllm_suffix[:W] or DRAFTER:k:w[:tree]"
            )
        verify = [f"transformers.verify={parts[3]}"] if len(parts) == 4 else []
        return [
            f"drafting.drafter={parts[0]}",
            f"transformers.k={parts[1]}",
            f"drafting.w={parts[2]}",
            *verify,
            "drafting.speculation=on",
        ]


def parse_methods(names: str, engine: str) -> list[Method]:
    """`transformers:NAME` runs on the transformers engine; other names on `engine`."""
    methods = []
    for name in filter(None, (n.strip() for n in names.split(","))):
        on, _, rest = name.partition(":")
        methods.append(Method(on, rest) if on in ENGINES and rest else Method(engine, name))
    return methods


@dataclass
class Measured:
    method: Method
    batch: int
    seconds: list[float] = field(default_factory=list)  # one per round
    tokens: list[int] = field(default_factory=list)  # one per round
    outputs: list[list[int]] = field(default_factory=list)  # every round's, prompt by prompt
    calls: int = 0  # per-request steps (a request's share of a forward call counts as one)

    def add(self, seconds: float, results: list[Result]) -> None:
        self.seconds.append(seconds)
        self.tokens.append(sum(len(r.token_ids) for r in results))
        self.outputs += [r.token_ids for r in results]
        self.calls += sum(r.stats.num_target_calls for r in results)


def run_methods(engines: dict, methods: list, requests: list[Request], batch: int, first: int = 0) -> dict:
    """Every method generates every request, `batch` requests per call, the methods taking turns
    call by call (the order rotated each call, starting at methods[first]) so that a drift of this
    machine's speed falls on all alike. Returns per method: (seconds, results in order)."""
    seconds = {method: 0.0 for method in methods}
    results: dict = {method: [] for method in methods}
    for call, start in enumerate(range(0, len(requests), batch)):
        shift = (first + call) % len(methods)
        for method in methods[shift:] + methods[:shift]:
            started = time.perf_counter()
            results[method] += engines[method].generate(requests[start : start + batch])
            seconds[method] += time.perf_counter() - started
    return {method: (seconds[method], results[method]) for method in methods}


def method_config(base: list[str], method: Method, batch: int, slots: int) -> Config:
    """The method's config at `batch` running requests: a vLLM engine has `slots` (the largest
    batch: one engine serves every batch size), the transformers engine batches `batch` requests
    per forward call (its throughput mode is part of its decoder)."""
    return load_config(
        None,
        [
            *base,
            f"engine.name={method.engine}",
            *method.overrides(),
            f"transformers.max_batch_requests={batch}",
            f"vllm.max_num_seqs={slots}",
            f"ray.batch_size={batch}",
        ],
    )


def build_engines(base: list[str], methods: list[Method], batches: list[int]) -> dict[tuple[Method, int], Engine]:
    """Each method's engine at each batch size, as pipeline/engines/build.build_engines shares them:
    one vLLM engine per method serves every batch size, the transformers engine gets one per batch
    size (sharing the model)."""
    # vLLM's own methods are built last: its n-gram method imports numba, whose llvmlite answers any
    # attribute lookup (__dict__ too), and that breaks the module scan of every later vLLM start in
    # this process (vLLM 0.32's CPU kernel registration), vllm_suffix's included: vllm_ngram goes
    # last of all. A job has one engine per process.
    last = {"vllm_suffix": 1, "vllm_ngram": 2}
    keys = [
        (method, batch)
        for method in sorted(methods, key=lambda m: last.get(m.name.split(":")[0], 0))
        for batch in batches
    ]
    engines = pipeline_engines([method_config(base, method, batch, max(batches)) for method, batch in keys])
    return dict(zip(keys, engines))


def compare(
    base: list[str],
    methods: list[Method],
    prompts: list[str],
    batches: list[int],
    max_new_tokens: int,
    rounds: int = 1,
    structured_outputs: dict | None = None,
    per_call: int = 0,
) -> dict:
    """Runs every method at every batch size, `rounds` times, each run on its own chunk of
    len(prompts) // (rounds * len(batches)) prompts; returns the rows of the comparison. With
    `structured_outputs` every request carries it (its answers constrained, for every method).
    A batch size B is the engine's running requests at most; each generate call gets `per_call`
    requests (0: B, so a call starts with B running and drains to 1 as its requests finish; more
    keeps B running for most of the call, as a job's feeding keeps its engine full)."""
    per_run = len(prompts) // (rounds * len(batches))
    if per_run < 1:
        raise ValueError(
            f"{len(prompts)} prompts cannot give {rounds} rounds x {len(batches)} batch sizes a prompt each"
        )
    engines = build_engines(base, methods, batches)
    tokenizer = next(iter(engines.values())).tokenizer
    requests = [
        Request(str(i), encode_prompt(tokenizer, prompt, str(i)), max_new_tokens, structured_outputs=structured_outputs)
        for i, prompt in enumerate(prompts)
    ]
    measured = {(m, b): Measured(m, b) for m in methods for b in batches}
    chunks = []
    for run in range(rounds * len(batches)):
        round_index, position = divmod(run, len(batches))
        batch = batches[position]
        chunk = requests[run * per_run : (run + 1) * per_run]
        chunks.append({"round": round_index + 1, "batch": batch, "prompts": [r.request_id for r in chunk]})
        engines_now = {method: engines[method, batch] for method in methods}
        for method, (seconds, results) in run_methods(
            engines_now, methods, chunk, per_call or batch, first=run
        ).items():
            measured[method, batch].add(seconds, results)
            print(
                f"round {round_index + 1}/{rounds} B={batch} prompts {chunk[0].request_id}..{chunk[-1].request_id} "
                f"{method.engine}:{method.name} {measured[method, batch].tokens[-1] / seconds:.2f} tok/s",
                flush=True,
            )
    return {
        "prompts": rounds * len(batches) * per_run,
        "prompts_per_run": per_run,
        "requests_per_call": {batch: per_call or batch for batch in batches},
        "max_new_tokens": max_new_tokens,
        "rounds": rounds,
        "chunks": chunks,
        "runs": summarize(list(measured.values())),
    }


def summarize(measured: list[Measured]) -> list[dict]:
    rows = []
    for record in measured:
        rates = [tokens / seconds for tokens, seconds in zip(record.tokens, record.seconds)]
        plain = plain_of(measured, record)
        rows.append(
            {
                "engine": record.method.engine,
                "method": record.method.name,
                "batch": record.batch,
                "tokens_per_second": round(statistics.median(rates), 3),
                "tokens_per_second_rounds": [round(rate, 3) for rate in rates],
                "tokens_per_call": round(sum(record.tokens) / record.calls, 3) if record.calls else None,
                "identical_fraction": None
                if plain is None
                else round(sum(a == b for a, b in zip(record.outputs, plain.outputs)) / len(record.outputs), 4),
                "identical_to": None if plain is None else f"{plain.method.engine}:plain",
            }
        )
    for row in rows:
        same = {(r["engine"], r["method"]): r for r in rows if r["batch"] == row["batch"]}
        for reference in (("vllm", "plain"), ("vllm", "vllm_ngram"), ("vllm", "vllm_suffix")):
            if reference in same:
                row[f"vs_{reference[1]}"] = median_ratio(row, same[reference])
    return rows


def median_ratio(row: dict, reference: dict) -> float:
    """The median over rounds of row's tokens/s over the reference's in the same round (the
    rounds ran side by side, so a round's ratio is free of the drift between rounds)."""
    ratios = [a / b for a, b in zip(row["tokens_per_second_rounds"], reference["tokens_per_second_rounds"])]
    return round(statistics.median(ratios), 3)


def plain_of(measured: list[Measured], record: Measured) -> Measured | None:
    """The plain run to check `record` against: its own engine's at the same batch size (the
    same engine and dtype), else vLLM's (another engine: its kernels may round differently)."""
    for engine in (record.method.engine, "vllm"):
        for other in measured:
            if other.batch == record.batch and other.method == Method(engine, "plain"):
                return other
    return None


def markdown(report: dict) -> str:
    return (
        f"{report['rounds']} round(s) of {report['prompts_per_run']} new prompts per batch size; "
        "vs X: the median over rounds of the ratio within a round\n\n"
        + markdown_table(
            report["runs"],
            {
                "batch": "batch",
                "engine": "engine",
                "method": "method",
                "tokens_per_second": "tokens/s (median)",
                "tokens_per_second_rounds": "per round",
                "tokens_per_call": "tokens/call",
                "identical_fraction": "identical",
                "vs_plain": "vs plain",
                "vs_vllm_ngram": "vs vllm_ngram",
                "vs_vllm_suffix": "vs vllm_suffix",
            },
        )
    )


def run(args) -> dict:
    """Every method through the engine a job would build for it."""
    names = ["plain", "vllm_ngram"] + (["vllm_suffix"] if importlib.util.find_spec("arctic_inference") else [])
    if "vllm_suffix" not in names:
        print("vllm_suffix: not run (arctic-inference is not installed: make install-suffix)", flush=True)
    names += [name for name in args.spec.split(",") if name.strip()]
    names += [f"transformers:{name}" for name in args.reference.split(",") if name.strip()]
    batches = args.batch
    if args.per_call < 0:
        raise SystemExit(f"--per-call {args.per_call}: requests per generate call must be 0 (the batch size) or more")
    needed = args.limit * args.rounds * len(batches)
    prompts = [p.prompt for p in load_prompts(args.dataset, needed)]
    if args.rounds < 1 or len(prompts) < needed:
        raise SystemExit(
            f"--rounds {args.rounds} x --batch {batches} x --limit {args.limit} needs {needed} prompts "
            f"(every run new ones); {args.dataset} has {len(prompts)}"
        )
    base = [f"model.name={json.dumps(args.model)}", f"model.dtype={args.dtype}", "vllm.cpu_kv_cache_gib=1"]
    try:
        structured = structured_outputs(args.dataset) if args.json_schema else None
    except ValueError as error:
        raise SystemExit(f"--json-schema: {error}") from error
    report = compare(
        base,
        parse_methods(",".join(names), "vllm"),
        prompts,
        batches,
        args.max_new_tokens,
        args.rounds,
        structured,
        args.per_call,
    )
    return {
        "dataset": args.dataset,
        "model": args.model,
        "dtype": args.dtype,
        "structured_outputs": structured,
        **report,
    }
