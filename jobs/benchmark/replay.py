"""Replay mode: a finished greedy run's outputs through drafters, no model.

    python -m jobs.benchmark --replay RUN_DIR[,RUN_DIR] --batch 1,16,64,256 --out R.json \
        [--store DATASTORE_DIR] [--max-draft 16] [--methods ours,vllm_suffix,vllm_ngram,plain] [--project a100-8b]

Greedy verification accepts exactly a draft's common prefix with the greedy output, so a recorded
greedy output (the run's `prompt_token_ids` and `generated_tokens`) says what any draft would have
gained. B slots run at once, refilled in the run's order as requests end; a request's first step
is its prefill (one token, no draft), each later step verifies its draft and emits the accepted
tokens plus one. Every method drafts at most --max-draft tokens per request-step:
- `ours`: drafters/batch_suffix.py with the config's defaults, one compiled call per step for every
  running request (with --store, an earlier runs' datastore); no step budget (its confidence cut only);
- `ours_budget_<gpu>_<model>` (--project): the same with the step budget of that roofline step cost;
- `vllm_suffix`: arctic-inference's SuffixDecodingCache as vLLM's `suffix` method calls it (tree
  depth 24, min token probability 0.1, spec factor 1.0), per request; with --store, the store's
  documents are first added to its global tree as finished responses (if installed:
  `make install-suffix`);
- `vllm_ngram`: vLLM's numba n-gram lookup (`batch_propose_numba`, as its `ngram` method calls it)
  per step over every running request, n-grams of --ngram-min to --ngram-max tokens;
- `plain`: no drafts (the projection's reference).
With --project every row also has its projected tokens/s on that GPU (see `projection`).
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

import numpy as np

from drafters.budget import GPUS, MODELS, MeasuredStepCost, RooflineStepCost, cost_table


@dataclass(frozen=True)
class Answer:
    prompt: np.ndarray  # [P] int64
    output: np.ndarray  # [G] int64, the greedy output
    max_tokens: int  # what the run allowed it (its output, where the run's cap cut it)


def load_answers(run_dirs: str, max_tokens: int) -> list[Answer]:
    import pyarrow.parquet as pq

    from jobs.report import find_parts

    answers = []
    for run_dir in run_dirs.split(","):
        table = pq.read_table(find_parts(run_dir), columns=["prompt_token_ids", "generated_tokens", "finish_reason"])
        columns = (table.column(name).to_pylist() for name in ("prompt_token_ids", "generated_tokens", "finish_reason"))
        for prompt, output, finish in zip(*columns):
            if prompt and output:  # a request cut by its token budget had exactly that many
                answers.append(Answer(np.array(prompt, np.int64), np.array(output, np.int64),
                                      len(output) if finish == "length" else max(max_tokens, len(output))))
    if not answers:
        raise SystemExit(f"--replay {run_dirs}: no rows with prompt_token_ids and generated_tokens")
    return answers


class Ours:
    """drafters/batch_suffix.py: one call per step for every running request."""

    def __init__(self, args, store, answers, cost=None):
        from drafters.registry import DrafterTables, make_drafter
        from pipeline.config import DecoderConfig

        # as a job builds it: the config's defaults, drafts of up to --max-draft tokens
        config = DecoderConfig(drafter="batch_suffix", w=args.max_draft, datastore="store" if store is not None else "")
        warm = make_drafter(config, DrafterTables(datastore=store), 0)  # its compiled code loaded here, not timed
        del warm
        gc.collect()
        self.drafter = make_drafter(config, DrafterTables(datastore=store), 0)
        self.cost = cost

    def draft(self, batch: list[int], rows: np.ndarray, lengths: np.ndarray, prompts: np.ndarray,
              limits: np.ndarray, tokens: np.ndarray) -> list[np.ndarray]:
        table = None if self.cost is None else cost_table(self.cost(len(batch), lengths), len(batch), self.drafter.w)
        out = self.drafter.step(batch, tokens, rows, lengths, prompts, limits, table)
        return [out.tokens[i, :out.lengths[i]] for i in range(len(batch))]

    def finish(self, key: int, output: np.ndarray) -> None:
        self.drafter.finish(key, output.tolist())


class ArcticSuffix:
    """vLLM's `suffix` method: arctic-inference's cache, called as vLLM's SuffixDecodingProposer does."""

    def __init__(self, args, store, answers, cost=None):
        from arctic_inference.suffix_decoding import SuffixDecodingCache

        documents = store_documents(store)
        self.cache = SuffixDecodingCache(max_tree_depth=24, max_cached_requests=len(documents) + len(answers) + 1)
        for number, document in enumerate(documents):  # earlier runs' outputs: finished responses in its tree
            self.cache.start_request(f"store-{number}", np.zeros(0, np.int32))
            self.cache.add_active_response(f"store-{number}", document.tolist())
            self.cache.stop_request(f"store-{number}")
        self.max_draft, self.seen = args.max_draft, {}

    def draft(self, batch, rows, lengths, prompts, limits, tokens):
        drafts = []
        for key, row, n, prompt, limit in zip(batch, rows, lengths, prompts, limits):
            if key not in self.seen:
                self.cache.start_request(key, tokens[row, :prompt])
                self.seen[key] = prompt
            self.cache.add_active_response(key, tokens[row, self.seen[key]:n].tolist())
            self.seen[key] = n
            draft = self.cache.speculate(key, tokens[row, max(0, n - 24):n], max_spec_tokens=min(self.max_draft, limit - n - 1),
                                         max_spec_factor=1.0, min_token_prob=0.1)
            drafts.append(np.array(draft.token_ids, np.int64))
        return drafts

    def finish(self, key, output):
        self.cache.stop_request(key)
        self.seen.pop(key, None)


class VllmNgram:
    """vLLM's `ngram` method: its numba batch lookup over the running requests' token rows."""

    def __init__(self, args, store, answers, cost=None):
        from vllm.v1.spec_decode.ngram_proposer import batch_propose_numba

        self.propose, self.args = batch_propose_numba, args

    def draft(self, batch, rows, lengths, prompts, limits, tokens):
        args = self.args
        drafts = np.zeros((tokens.shape[0], args.max_draft), np.int32)
        counts = np.zeros(tokens.shape[0], np.int32)
        numbers = np.zeros(tokens.shape[0], np.int32)
        numbers[rows] = lengths
        self.propose(list(rows), numbers, tokens, args.ngram_min, args.ngram_max, tokens.shape[1], args.max_draft, drafts, counts)
        room = limits - lengths - 1
        return [drafts[row, :max(min(counts[row], limit), 0)].astype(np.int64) for row, limit in zip(rows, room)]

    def finish(self, key, output):
        pass


class Plain:
    """No drafts: every request-step emits one token (the projection's reference)."""

    def __init__(self, args, store, answers, cost=None):
        pass

    def draft(self, batch, rows, lengths, prompts, limits, tokens):
        return [np.zeros(0, np.int64)] * len(batch)

    def finish(self, key, output):
        pass


METHODS = {"ours": Ours, "vllm_suffix": ArcticSuffix, "vllm_ngram": VllmNgram, "plain": Plain}


def store_documents(store) -> list[np.ndarray]:
    if store is None:
        return []
    from drafters.datastore import SEPARATOR

    tokens = np.asarray(store.tokens)
    cuts = np.flatnonzero(tokens == SEPARATOR)
    pieces = (piece[piece != SEPARATOR] for piece in np.split(tokens, cuts))
    return [piece.astype(np.int64) for piece in pieces if len(piece)]


def resident_mb() -> float:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * 4096 / 2**20


class StepClock:
    """The replayed steps' projected GPU seconds (--project): each step's roofline cost for the tokens
    it fed and its requests' own context (drafters/budget.py), summed."""

    def __init__(self, projection: str, measured: dict | None = None):
        gpu, model = (part.lower() for part in projection.split("-"))
        self.gpu, self.model, self.seconds = GPUS[gpu], MODELS[model], 0.0
        self.measured = measured  # a jobs.benchmark.gpu_step report: its step costs, not the roofline's

    def cost(self, running: int, lengths: np.ndarray):
        if self.measured is not None:
            return MeasuredStepCost.from_report(self.measured, running)
        return RooflineStepCost(self.gpu, self.model, running, float(np.mean(lengths)))

    def step(self, running: int, fed: int, context: int) -> None:
        self.seconds += float(self.cost(running, np.array([context / running])).seconds(fed))


def step_costs(args) -> dict | None:
    """--step-costs: a jobs.benchmark.gpu_step report, measured on the GPU that --project names."""
    if not getattr(args, "step_costs", ""):
        return None
    with open(args.step_costs) as handle:
        return json.load(handle)


def replay(args, method: str, batch: int, answers: list[Answer], store, budget: str = "") -> dict:
    """One method at one batch size over every answer (see the module's docstring); `budget`: ours
    with that GPU-model's roofline step budget."""
    gc.collect()
    before = resident_mb()
    clock = StepClock(budget or args.project, step_costs(args)) if (budget or args.project) else None
    drafter = Ours(args, store, answers, clock.cost) if budget else METHODS[method](args, store, answers)
    longest = max(len(a.prompt) + len(a.output) for a in answers) + 1
    tokens = np.zeros((batch, longest), np.int32)
    waiting, free_rows = list(range(len(answers)))[::-1], list(range(batch))[::-1]
    active: dict[int, list] = {}  # answer -> [row, emitted, draft]
    totals = {"steps": 0, "emitted": 0, "drafted": 0}
    seconds, calls, per_step = 0.0, 0, []  # per_step: each step's drafter seconds per request it served
    while waiting or active:
        while waiting and free_rows:  # a free slot takes the next request: its prefill step emits one token
            key, row = waiting.pop(), free_rows.pop()
            tokens[row, :len(answers[key].prompt) + len(answers[key].output)] = np.concatenate(
                [answers[key].prompt, answers[key].output])
            active[key] = [row, 0, None]
        step_seconds = verify(active, answers, drafter, free_rows, totals, clock)
        if active:
            keys = list(active)
            prompts = np.array([len(answers[k].prompt) for k in keys], np.int64)
            lengths = prompts + np.array([active[k][1] for k in keys], np.int64)
            limits = prompts + np.array([answers[k].max_tokens for k in keys], np.int64)
            rows = np.array([active[k][0] for k in keys], np.int64)  # (the engine's arrays: not the drafter's time)
            started = time.perf_counter()
            drafts = drafter.draft(keys, rows, lengths, prompts, limits, tokens)
            step_seconds += time.perf_counter() - started
            calls += len(keys)
            per_step.append(step_seconds / len(keys))
            for key, draft in zip(keys, drafts):
                active[key][2] = draft
        seconds += step_seconds
    steps = totals["steps"]
    row = {"method": f"ours_budget_{budget.replace('-', '_')}" if budget else method, "batch": batch,
           "tokens_per_step": round(totals["emitted"] / steps, 4), "draft_tokens_per_step": round(totals["drafted"] / steps, 4),
           "us_per_request_step_mean": round(1e6 * seconds / max(calls, 1), 2),
           "us_per_request_step_p99": round(1e6 * float(np.percentile(per_step, 99)), 2) if per_step else 0.0,
           "memory_mb": round(resident_mb() - before, 1), "request_steps": steps}
    if clock is not None:  # the drafter runs between steps (vLLM's proposer is synchronous): its time adds
        row["projected_tokens_per_second"] = round(totals["emitted"] / (clock.seconds + seconds), 1)
        row["projected_tokens_per_second_drafting_hidden"] = round(totals["emitted"] / clock.seconds, 1)
    return row


def verify(active: dict, answers: list[Answer], drafter, free_rows: list, totals: dict, clock) -> float:
    """One step for the running requests: each verifies its draft against its recorded output and
    emits the accepted tokens plus one; those that end are finished (returns the drafter's seconds for that)."""
    seconds, fed, context, running = 0.0, 0, 0, len(active)
    for key, state in list(active.items()):
        output = answers[key].output
        draft = state[2] if state[2] is not None else np.zeros(0, np.int64)
        accepted = 0
        while accepted < len(draft) and state[1] + accepted < len(output) - 1 and draft[accepted] == output[state[1] + accepted]:
            accepted += 1
        fed, context = fed + 1 + len(draft), context + len(answers[key].prompt) + state[1]
        state[1] += accepted + 1
        totals["steps"], totals["emitted"], totals["drafted"] = (
            totals["steps"] + 1, totals["emitted"] + accepted + 1, totals["drafted"] + len(draft))
        if state[1] >= len(output):
            started = time.perf_counter()
            drafter.finish(key, output)
            seconds += time.perf_counter() - started
            free_rows.append(state[0])
            del active[key]
    if clock is not None and running:
        clock.step(running, fed, context)
    return seconds


def _replay_in_child(job):
    return replay(*job)


def available(method: str) -> bool:
    if method != "vllm_suffix":
        return True
    try:
        import arctic_inference.suffix_decoding  # noqa: F401
    except ImportError:
        return False
    return True


def replay_comparison(args) -> dict:
    """Every method at every batch size, methods taking turns within a batch size, each in a fresh
    forked process (its memory its own); then the projection."""
    import os

    os.environ.setdefault("NUMBA_THREADING_LAYER", "workqueue")  # as the vLLM engine sets it
    from drafters.datastore import Datastore

    answers = load_answers(args.replay, args.max_new_tokens)
    store = Datastore.open(args.store) if args.store else None
    methods = [m for m in (args.methods or ",".join(METHODS)).split(",") if m]
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise SystemExit(f"--methods: unknown {unknown}; choose from {', '.join(METHODS)}")
    skipped = [m for m in methods if not available(m)]
    methods = [m for m in methods if m not in skipped]
    jobs = []
    for batch in (int(b) for b in args.batch.split(",")):
        jobs += [(args, method, batch, answers, store) for method in methods]
        if args.project:
            jobs.append((args, "ours", batch, answers, store, args.project))  # ours with that GPU's budget
    _warm_up(args, answers, store, methods)
    rows = []
    context = multiprocessing.get_context("fork")
    for job in jobs:
        with context.Pool(1) as pool:
            rows.append(pool.apply(_replay_in_child, (job,)))
        print(json.dumps(rows[-1]), flush=True)
    report = {"replay": rows, "answers": len(answers), "generated_tokens": int(sum(len(a.output) for a in answers)),
              "store_tokens": int(len(store)) if store is not None else 0, "max_draft": args.max_draft,
              "skipped": skipped}
    if args.project:
        report["projection"] = projection(rows, args.project, step_costs(args))
    return report


def _warm_up(args, answers, store, methods) -> None:
    """Compiles the numba methods' code once in this process, so no child pays for it (arctic's is
    C++: warming it would only leave its freed tree's memory for a child to reuse unseen)."""
    few = answers[:4]
    for method in methods:
        if method != "vllm_suffix":
            replay(args, method, 2, few, store)


def projection(rows: list[dict], name: str, measured: dict | None = None) -> dict:
    """Each row's projected tokens/s against plain decoding's at its batch size. A replayed step t
    that feeds n_t tokens (one per running request plus their drafts) over requests of mean context
    ctx_t takes c(n_t, ctx_t) on the GPU (drafters/budget.py's roofline), and the drafter's own
    seconds d_t after it (vLLM runs a `custom_class` or `suffix` proposer between steps, on the CPU):

        tokens/s = Σ tokens / Σ_t (c(n_t, ctx_t) + d_t)

    with d_t = 0 the ratio `vs_plain_drafting_hidden` (what overlapping the drafting with the step,
    async scheduling, would give). With `measured` (--step-costs), c is the step cost measured on
    that GPU (drafters/budget.py's MeasuredStepCost) instead of the roofline."""
    gpu, model = (part.lower() for part in name.split("-"))
    projected = []
    for batch in sorted({row["batch"] for row in rows}):
        plain = next((r for r in rows if r["batch"] == batch and r["method"] == "plain"), None)
        for row in (r for r in rows if r["batch"] == batch):
            entry = {"method": row["method"], "batch": batch, "tokens_per_second": row["projected_tokens_per_second"]}
            if plain is not None:
                entry["vs_plain"] = round(row["projected_tokens_per_second"] / plain["projected_tokens_per_second"], 3)
                entry["vs_plain_drafting_hidden"] = round(
                    row["projected_tokens_per_second_drafting_hidden"] / plain["projected_tokens_per_second"], 3)
            projected.append(entry)
    step = ("c(n, B) measured (MeasuredStepCost over --step-costs, context "
            f"{measured['context']}, {measured['device']})" if measured is not None
            else "c(n, ctx) = max((2 P + B ctx kv) / bandwidth, 2 P n / flops)")
    return {"gpu": GPUS[gpu].name, "model": MODELS[model].name,
            "formula": f"tokens/s = sum tokens / sum_t (c(n_t, ctx_t) + d_t); {step}", "rows": projected}
