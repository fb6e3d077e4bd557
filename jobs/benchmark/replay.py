"""replay: a finished greedy run's outputs through drafters, no model.

    python -m jobs.benchmark replay RUN_DIR [RUN_DIR ...] --batch 1,16,64,256 --out R.json \
        [--store DATASTORE_DIR] [--max-draft 16] [--methods ours,vllm_suffix,vllm_ngram,plain] [--project a100-8b] \
        [--predictions EARLIER_RUN_DIR ...] [--prediction-w 128]

Greedy verification accepts exactly a draft's common prefix with the greedy output, so a recorded
greedy output (the run's `prompt_token_ids` and `generated_tokens`) says what any draft would have
gained. B slots run at once, refilled in the run's order as requests end; a request's first step
is its prefill (one token, no draft), each later step verifies its draft and emits the accepted
tokens plus one. Every method drafts at most --max-draft tokens per request-step:
- `ours`: drafters/suffix/ with the config's defaults, one compiled call per step for every
  running request (with --store, an earlier runs' datastore); no step budget (its confidence cut only);
- `ours_budget_<gpu>_<model>` (--project): the same with the step budget of that roofline step cost;
- `ours_prediction` (with --predictions, as a series' changed rows run: each row's prediction is the
  earlier run's `generated_tokens` of its `id`, none where the earlier run has no such id): ours, then
  for the rows with a prediction drafters/prediction.py's step of prediction drafts, as vLLM's proposer
  drafts them (up to --prediction-w tokens; each judged by what the row emitted), and
  `ours_prediction_budget_<gpu>_<model>` the same with that step's budget cutting both;
- `vllm_suffix`: arctic-inference's SuffixDecodingCache as vLLM's `suffix` method calls it (tree
  depth 24, min token probability 0.1, spec factor 1.0), per request; with --store, the store's
  documents are first added to its global tree as finished responses (if installed:
  `make install-suffix`);
- `vllm_ngram`: vLLM's numba n-gram lookup (`batch_propose_numba`, as its `ngram` method calls it)
  per step over every running request, n-grams of --ngram-min to --ngram-max tokens;
- `vllm_ngram_gpu`: the same lookup with drafts of at most 5 tokens, as drafting.speculation auto runs
  vLLM's `ngram_gpu` (its Triton kernel finds the same n-grams on the GPU, asynchronously);
- `plain`: no drafts (the projection's reference);
- `copy_ceiling`: not a drafter but a bound: each step drafts, knowing the recorded output, the
  longest run of it that occurs in the row's prediction, its prompt, its output so far or its
  siblings' outputs so far (the other samples of its prompt), up to --prediction-w tokens: no
  drafter copying from those sources takes fewer steps.
With --project, `auto` says what drafting.speculation auto would run at each batch size and its tokens/s
(`auto_projection`: the actor's own chooser over --actor-hours, each switch --restart-seconds), and
every row also has its projected tokens/s on that GPU (see `projection`), or with
`--project cpu --host-step R` on this CPU's vLLM engine as the host-step subcommand measured it
(`cpu_projection`), the budget of `ours_budget_cpu` weighing that CPU step.
Time is the drafter's own, everything it does over the request-steps it serves (starting and
finishing requests, taking in emitted tokens, drafting); memory is the resident growth of a fresh
process running that replay (forked, so code already loaded is not counted).
"""

from __future__ import annotations

import gc
import json
import multiprocessing
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from jobs.benchmark.arguments import integers, numbers
from jobs.benchmark.replay_answers import Answer, load_answers, load_predictions
from jobs.benchmark.replay_methods import METHODS, Ours
from jobs.benchmark.replay_projection import auto_projection, cpu_projection, projection
from jobs.benchmark.step_costs import GPUS, MODELS, CpuStepCost, MeasuredStepCost, RooflineStepCost


def add_cli_args(parser) -> None:
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR", help="greedy runs whose outputs are replayed")
    parser.add_argument("--batch", type=integers, default=[1, 16], help="running requests, comma-separated")
    parser.add_argument(
        "--methods", default="", help="comma-separated (default: all of them; the docstring says which)"
    )
    parser.add_argument("--max-new-tokens", type=int, default=0, help="each answer cut to this many tokens (0: whole)")
    parser.add_argument("--store", default="", help="an earlier runs' datastore (jobs.build_datastore)")
    parser.add_argument("--max-draft", type=int, default=16, help="draft tokens per request-step, at most")
    parser.add_argument("--ngram-min", type=int, default=2, help="vllm_ngram's shortest n-gram")
    parser.add_argument("--ngram-max", type=int, default=4, help="vllm_ngram's longest n-gram")
    parser.add_argument(
        "--project",
        default="a100-8b",
        help="the GPU and model of the roofline projection (a100|h100 - 8b|70b; empty: none), or "
        "`cpu`: this CPU's vLLM engine as --host-step measured it; adds ours with that step budget",
    )
    parser.add_argument(
        "--step-costs",
        default="",
        metavar="GPU_STEP_JSON",
        help="step costs measured on that GPU (the gpu-step subcommand) for the projection and the "
        "budget, instead of the roofline",
    )
    parser.add_argument(
        "--host-step",
        default="",
        metavar="HOST_STEP_JSON",
        help="the host's time per step (the host-step subcommand), which async scheduling hides "
        "(with --project cpu: the CPU's whole step, host and device)",
    )
    parser.add_argument("--plots", default="", help="directory for the calibration plot (default: none)")
    parser.add_argument(
        "--predictions",
        nargs="+",
        default=[],
        metavar="EARLIER_RUN_DIR",
        help="earlier runs of the replayed rows (a series' last outputs): each row's prediction is "
        "the generated_tokens of its id there (an id in several: the last listed); adds "
        "ours_prediction",
    )
    parser.add_argument(
        "--prediction-w",
        type=int,
        default=128,
        help="a prediction's draft tokens per request-step, at most (the engine's drafting.prediction_w)",
    )
    parser.add_argument(
        "--actor-hours",
        type=numbers,
        default=[1.0, 8.0],
        help="drafting.speculation auto's projection: the hours of work one actor is given, comma-separated",
    )
    parser.add_argument(
        "--restart-seconds",
        type=float,
        default=60.0,
        help="drafting.speculation auto's projection: an engine's start, in seconds (an 8B model on a "
        "GPU: weights, compilation and CUDA graphs; this CPU's SmolLM2: about 5)",
    )


def markdown(report: dict) -> str:
    from jobs.benchmark.report import markdown_table

    rows = [
        {key: value for key, value in row.items() if not isinstance(value, (dict, list))} for row in report["replay"]
    ]
    table = markdown_table(rows)
    if "projection" in report:
        table += "\n\n" + report["projection"]["formula"] + "\n\n" + markdown_table(report["projection"]["rows"])
        if report["projection"].get("auto"):
            table += "\n\ndrafting.speculation auto:\n\n" + markdown_table(report["projection"]["auto"])
    return table


def resident_mb() -> float:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * 4096 / 2**20


@dataclass(frozen=True)
class HostedStepCost:
    """A GPU step's cost plus the host's seconds that a synchronous engine adds to every step
    (scheduling, inputs, outputs: what async scheduling would overlap with the GPU's work)."""

    device: object  # a step cost: RooflineStepCost or MeasuredStepCost
    host: float

    def seconds(self, fed: np.ndarray) -> np.ndarray:
        return self.device.seconds(fed) + self.host


class StepClock:
    """The replayed steps' projected seconds (--project): each step's GPU cost for the tokens it fed
    and its requests' own context (jobs/benchmark/step_costs.py: the roofline, or --step-costs as measured),
    summed, and apart from it the host's seconds of each step (--host-step, by running requests);
    with `--project cpu`, this CPU's whole step for the tokens it fed, prompts included."""

    def __init__(self, projection: str, measured: dict | None = None, host: dict | None = None):
        self.seconds, self.host_seconds, self.prefill_seconds = 0.0, 0.0, 0.0
        # `cpu`: this CPU's vLLM step as host_step measured it, host included (a synchronous engine);
        # a request's first step feeds its prompt (`prefill`), each token costed as a decoding step's
        # (about half again what the live engine's steps suggest): corpus prompts are 2-6 times
        # their answers, so the live benchmark's ratios are diluted by that time, alike for every method.
        self.cpu = CpuStepCost.from_report(host) if projection == "cpu" else None  # (replay_comparison checks host)
        if self.cpu is None:
            gpu, model = (part.lower() for part in projection.split("-"))
            self.gpu, self.model = GPUS[gpu], MODELS[model]
        self.measured = measured  # a jobs.benchmark.gpu_step report: its step costs, not the roofline's
        self.host = (
            host if self.cpu is None else None
        )  # a jobs.benchmark.host_step report: the host's ms per step by batch
        self.measured_costs: dict[int, HostedStepCost] = {}  # by running requests (measured costs only)

    @property
    def prefill(self) -> bool:
        """Whether a request's first step feeds its whole prompt (the CPU projection's)."""
        return self.cpu is not None

    def device_cost(self, running: int, lengths: np.ndarray):
        if self.cpu is not None:
            return self.cpu
        if self.measured is not None:
            return MeasuredStepCost.from_report(self.measured, running)
        return RooflineStepCost(self.gpu, self.model, running, float(np.mean(lengths)))

    def cost(self, running: int, lengths: np.ndarray) -> HostedStepCost:
        """A synchronous step's (what our budget weighs): the GPU's and the host's (a measured one
        depends on the running requests alone: made once for each count)."""
        if self.cpu is not None:
            return HostedStepCost(self.cpu, 0.0)
        if self.measured is None:
            return HostedStepCost(self.device_cost(running, lengths), host_seconds(self.host, running))
        if running not in self.measured_costs:
            self.measured_costs[running] = HostedStepCost(
                self.device_cost(running, lengths), host_seconds(self.host, running)
            )
        return self.measured_costs[running]

    def step(self, running: int, fed: int, context: int, prompts: int = 0) -> None:
        """A step of `running` requests that fed `fed` tokens and, with `prefill`, `prompts` more of
        the prompts it prefilled (their seconds also kept apart: `prefill_seconds`)."""
        cost = self.device_cost(running, np.array([context / running]))
        seconds = float(cost.seconds(fed + prompts))
        self.seconds += seconds
        self.prefill_seconds += seconds - float(cost.seconds(fed)) if prompts else 0.0
        self.host_seconds += host_seconds(self.host, running)


def host_seconds(report: dict | None, running: int) -> float:
    """The host's seconds for a step of `running` requests: the host_step report's medians,
    interpolated linearly in the batch size (0 without a report)."""
    if report is None:
        return 0.0
    points = sorted((row["batch"], row["host_ms_per_step"]) for row in report["median"])
    return 1e-3 * float(np.interp(running, [b for b, _ in points], [ms for _, ms in points]))


def step_costs(args) -> dict | None:
    """--step-costs: a jobs.benchmark.gpu_step report, measured on the GPU that --project names."""
    return read_json(getattr(args, "step_costs", ""))


def read_json(path: str) -> dict | None:
    if not path:
        return None
    with open(path) as handle:
        return json.load(handle)


def replay(args, method: str, batch: int, answers: list[Answer], store, budget: str = "") -> dict:
    """One method at one batch size over every answer (see the module's docstring); `budget`: ours
    (or ours_prediction) with that GPU-model's step budget."""
    gc.collect()
    before = resident_mb()
    clock = (
        StepClock(budget or args.project, step_costs(args), read_json(getattr(args, "host_step", "")))
        if (budget or args.project)
        else None
    )
    drafter = METHODS[method](args, store, answers, clock.cost) if budget else METHODS[method](args, store, answers)
    # steps, tokens emitted and drafted, the most fed in a step; the drafter's seconds and request-steps,
    # and each step's drafter seconds per request it served
    totals = {"steps": 0, "emitted": 0, "drafted": 0, "most_fed": 0, "seconds": 0.0, "calls": 0, "per_step": []}
    run_steps(answers, batch, drafter, clock, totals)
    row = {
        "method": f"{method}_budget_{budget.replace('-', '_')}" if budget else method,
        "batch": batch,
        **step_columns(totals),
        "memory_mb": round(resident_mb() - before, 1),
    }
    return {**row, **drafter_columns(drafter, totals["steps"], clock, totals["seconds"])}


def run_steps(answers: list[Answer], batch: int, drafter, clock, totals: dict) -> None:
    """B slots, refilled in the answers' order as requests end: each step verifies the running
    requests' drafts (verify), then drafts for them; counts into `totals`."""
    longest = max(len(a.prompt) + len(a.output) for a in answers) + 1
    tokens = np.zeros((batch, longest), np.int32)
    waiting, free_rows = list(range(len(answers)))[::-1], list(range(batch))[::-1]
    active: dict[int, list] = {}  # answer -> [row, emitted, draft]
    while waiting or active:
        step_seconds = 0.0
        while waiting and free_rows:  # a free slot takes the next request: its prefill step emits one token
            key, row = waiting.pop(), free_rows.pop()
            answer = answers[key]
            tokens[row, : len(answer.prompt) + len(answer.output)] = np.concatenate([answer.prompt, answer.output])
            active[key] = [row, 0, None]
            started = time.perf_counter()
            drafter.start(key, answer.prompt, len(answer.prompt) + answer.max_tokens)
            step_seconds += time.perf_counter() - started
        step_seconds += verify(active, answers, drafter, free_rows, totals, clock)
        if active:
            keys = list(active)
            prompts = np.array([len(answers[k].prompt) for k in keys], np.int64)
            lengths = prompts + np.array([active[k][1] for k in keys], np.int64)
            limits = prompts + np.array([answers[k].max_tokens for k in keys], np.int64)
            rows = np.array([active[k][0] for k in keys], np.int64)  # (the engine's arrays: not the drafter's time)
            started = time.perf_counter()
            drafts = drafter.draft(keys, rows, lengths, prompts, limits, tokens)
            step_seconds += time.perf_counter() - started
            drafter.predict(keys)
            totals["calls"] += len(keys)
            totals["per_step"].append(step_seconds / len(keys))
            for key, draft in zip(keys, drafts):
                active[key][2] = draft
        totals["seconds"] += step_seconds


def step_columns(totals: dict) -> dict:
    """A replay's tokens per step, draft tokens per step and the drafter's time per request-step."""
    steps, per_step = totals["steps"], totals["per_step"]
    return {
        "tokens_per_step": round(totals["emitted"] / steps, 4),
        "draft_tokens_per_step": round(totals["drafted"] / steps, 4),
        "us_per_request_step_mean": round(1e6 * totals["seconds"] / max(totals["calls"], 1), 2),
        "us_per_request_step_p99": round(1e6 * float(np.percentile(per_step, 99)), 2) if per_step else 0.0,
        "request_steps": steps,
        "most_fed_in_a_step": totals["most_fed"],
    }


def drafter_columns(drafter, steps: int, clock, seconds: float) -> dict:
    """What a method's drafter says of itself (calibration, prediction tokens) and, with a
    projection, the seconds on the GPU, the host's per step and the drafter's (see `projection`)."""
    found = {}
    if isinstance(drafter, Ours):
        found.update(calibration_error=round(drafter.calibration.error(), 4), calibration=drafter.calibration.rows())
    if getattr(drafter, "predictions", None) is not None:  # its prediction tokens drafted, and accepted, per step
        found["prediction_tokens_per_step"] = round(drafter.predictions.drafted / steps, 4)
        found["accepted_prediction_tokens_per_step"] = round(drafter.predictions.accepted / steps, 4)
    if clock is not None:
        found["projected_seconds"] = {
            "gpu": round(clock.seconds, 6),
            "host": round(clock.host_seconds, 6),
            "drafter": round(seconds, 6) if drafter.proposes else 0.0,
        }
        if clock.prefill:  # (within "gpu": the steps' seconds)
            found["projected_seconds"]["prefill"] = round(clock.prefill_seconds, 6)
    return found


def verify(active: dict, answers: list[Answer], drafter, free_rows: list, totals: dict, clock) -> float:
    """One step for the running requests: each verifies its draft against its recorded output and
    emits the accepted tokens plus one; those that end are finished (returns the drafter's seconds for that)."""
    seconds, fed, context, running, prompts = 0.0, 0, 0, len(active), 0
    for key, state in list(active.items()):
        output = answers[key].output
        draft = state[2] if state[2] is not None else np.zeros(0, np.int64)
        accepted = 0
        while (
            accepted < len(draft)
            and state[1] + accepted < len(output) - 1
            and draft[accepted] == output[state[1] + accepted]
        ):
            accepted += 1
        drafter.judged(key, accepted)
        if clock is not None and clock.prefill and state[2] is None:  # its first step: its prompt, not one token
            prompts += len(answers[key].prompt) - 1
        fed, context = fed + 1 + len(draft), context + len(answers[key].prompt) + state[1]
        state[1] += accepted + 1
        totals["steps"], totals["emitted"], totals["drafted"] = (
            totals["steps"] + 1,
            totals["emitted"] + accepted + 1,
            totals["drafted"] + len(draft),
        )
        if state[1] >= len(output):
            started = time.perf_counter()
            drafter.finish(key, output)
            seconds += time.perf_counter() - started
            free_rows.append(state[0])
            del active[key]
    totals["most_fed"] = max(totals["most_fed"], fed)
    if clock is not None and running:
        clock.step(running, fed, context, prompts)
    return seconds


def _replay_in_child(job):
    return replay(*job)


def available(method: str) -> bool:
    if method != "vllm_suffix":
        return True
    import importlib.util

    return importlib.util.find_spec("arctic_inference") is not None


def run(args) -> dict:
    """Every method at every batch size, methods taking turns within a batch size, each in a fresh
    forked process (its memory its own); then the projection."""
    import os

    os.environ.setdefault("NUMBA_THREADING_LAYER", "workqueue")  # as the vLLM engine sets it
    from drafters.datastore import Datastore

    if args.project == "cpu" and (args.step_costs or not args.host_step):
        raise SystemExit(
            "--project cpu: this CPU's step comes from --host-step (python -m lab host-step), "
            "not --step-costs (a GPU's)"
        )
    answers = load_answers(
        args.runs, args.max_new_tokens, load_predictions(args.predictions) if args.predictions else None
    )
    store = Datastore.open(args.store) if args.store else None
    methods, skipped = chosen_methods(args)
    jobs = []
    for batch in args.batch:
        jobs += [(args, method, batch, answers, store) for method in methods]
        if args.project:  # ours (and ours_prediction) with that GPU's budget
            jobs += [
                (args, m, batch, answers, store, args.project)
                for m in ("ours", "ours_prediction")
                if m == "ours" or m in methods
            ]
    _warm_up(jobs)
    rows = []
    context = multiprocessing.get_context("fork")
    calibration = []
    for job in jobs:
        with context.Pool(1) as pool:
            rows.append(pool.apply(_replay_in_child, (job,)))
        calibration += [
            {"method": rows[-1]["method"], "batch": rows[-1]["batch"], **depth}
            for depth in rows[-1].pop("calibration", [])
        ]
    report = {
        "replay": rows,
        "answers": len(answers),
        "generated_tokens": int(sum(len(a.output) for a in answers)),
        "predicted_answers": sum(a.prediction is not None for a in answers),
        "store_tokens": int(len(store)) if store is not None else 0,
        "max_draft": args.max_draft,
        "skipped": skipped,
        "calibration": calibration,
    }
    if calibration and args.plots:
        runs = ", ".join(Path(run).parent.name or run for run in args.runs)
        report["calibration_plot"] = str(calibration_plot(calibration, Path(args.plots), runs))
    if args.project:
        host = read_json(args.host_step)
        report["projection"] = (
            cpu_projection(rows, host)
            if args.project == "cpu"
            else projection(rows, args.project, step_costs(args), host)
        )
        report["projection"]["auto"] = auto_projection(rows, args)
    return report


def chosen_methods(args) -> tuple[list[str], list[str]]:
    """(--methods to replay, those left out: not installed here)."""
    methods = [m for m in (args.methods or ",".join(METHODS)).split(",") if m]
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise SystemExit(f"--methods: unknown {unknown}; choose from {', '.join(METHODS)}")
    if not args.predictions:
        if args.methods and "ours_prediction" in methods:
            raise SystemExit("--methods ours_prediction: the rows' predictions come from --predictions EARLIER_RUN_DIR")
        methods = [m for m in methods if m != "ours_prediction"]
    skipped = [m for m in methods if not available(m)]
    return [m for m in methods if m not in skipped], skipped


def calibration_plot(rows: list[dict], directory: Path, title: str) -> Path:
    from jobs.plots import save_calibration_plot

    directory.mkdir(parents=True, exist_ok=True)
    series = {}
    for row in rows:
        series.setdefault(f"{row['method']}, B = {row['batch']}", []).append(row)
    return save_calibration_plot(series, directory / "calibration.png", f"draft acceptance by depth: {title}")


def _warm_up(jobs: list[tuple]) -> None:
    """Compiles the numba methods' code once in this process, each method with and without a budget
    (the budget's allocation of prediction drafts is its own compiled signature), so no child pays
    for it (arctic's is C++: warming it would only leave its freed tree's memory for a child to
    reuse unseen). Rows with a prediction go first, so that its path runs."""
    warmed = set()
    for args, method, _, answers, store, *budget in jobs:
        if method != "vllm_suffix" and (method, *budget) not in warmed:
            warmed.add((method, *budget))
            replay(args, method, 2, sorted(answers, key=lambda a: a.prediction is None)[:4], store, *budget)
