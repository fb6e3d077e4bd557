"""speculators: recorded greedy answers through vLLM >= 0.34's own decode bookkeeping and each
speculator's `propose`, no model (run it where vLLM 0.34 is installed: `make install-vllm034`).

    .venv-vllm034/bin/python -m jobs.benchmark.speculators RUN_DIR [RUN_DIR ...] --batch 16,64 \
        --methods ngrammys,suffix,ngram --k 8 [--predictions EARLIER_RUN_DIR] [--store DATASTORE] \
        [--bigram-table TABLE.npy] [--check-reference] --out R.json

Greedy verification accepts exactly a draft's common prefix with the greedy output, so a recorded
greedy output says what any draft would have gained. B slots run at once, refilled in the run's
order as requests end, as vLLM's V2 runner keeps them: each request enters its `RequestState` slot
(and the speculator's `add_request`), its prefill samples the answer's first token, and every later
step verifies the last draft (k tokens, every slot: vLLM's fixed k) and emits the accepted tokens plus
one through vLLM's own `post_update`; finished requests go to `on_requests_finished` before their
slots are freed; then each method's `propose` drafts for the batch. Methods: `ngrammys` (ours,
pipeline/engines/vllm/v2/; with --predictions each row's earlier output as its prediction, through
the prediction processor's `add_request`), vLLM's `suffix` (its defaults: depth 24, a corpus of 2**20
tokens) and `ngram` (prompt lookup, 5 tokens, vLLM's default). Reported per method and batch:
tokens per request-step (accepted + 1) and draft tokens per accepted token (every verified slot;
`confident_draft_tokens_per_accepted`: the slots rated above 0, which adaptive verification keeps).
With --check-reference each of ours steps is held to tests/drafters/device/reference.py.
"""

from __future__ import annotations

import json
import os
import time
import types
from pathlib import Path

import numpy as np

from jobs.benchmark.arguments import integers
from jobs.benchmark.report import markdown_table

METHODS = ("ngrammys", "suffix", "ngram")


def add_cli_args(parser) -> None:
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR", help="greedy runs whose outputs are replayed")
    parser.add_argument("--batch", type=integers, default=[16], help="running requests, comma-separated")
    parser.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated, of {', '.join(METHODS)}")
    parser.add_argument("--k", type=int, default=8, help="num_speculative_tokens, every method")
    parser.add_argument("--max-new-tokens", type=int, default=0, help="each answer cut to this many tokens (0: whole)")
    parser.add_argument("--limit", type=int, default=0, help="the first N answers (0: all)")
    parser.add_argument("--predictions", nargs="*", default=[], help="earlier runs: each row's prediction")
    parser.add_argument("--store", default="", help="a datastore loaded into our corpus at start")
    parser.add_argument("--bigram-table", default="", help="the model's bigram table (.npy) for ours")
    parser.add_argument("--corpus-tokens", type=int, default=1 << 20, help="our corpus ring (suffix's default size)")
    parser.add_argument("--check-reference", action="store_true", help="hold ours to the plain reference")
    parser.add_argument(
        "--auto",
        action="store_true",
        help="RUN_DIR... are this loop's reports (JSON) on one workload: project drafting.speculation auto on "
        "vLLM 0.34 from them onto --step-costs, replaying nothing",
    )
    parser.add_argument(
        "--step-costs",
        default="",
        help="a GPU's measured step (jobs.benchmark gpu-step, e.g. docs/data/h100_8b_step_ctx448.json): each row "
        "projected onto it, asynchronous (the drafting hidden behind the step), against plain vLLM on the same answers",
    )


def prepare_cpu() -> None:
    """vLLM 0.34's speculator classes on CPU tensors, under Triton's interpreter (shared/notes)."""
    os.environ.setdefault("TRITON_INTERPRET", "1")
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    import vllm.v1.worker.gpu.buffer_utils as buffer_utils

    buffer_utils.is_uva_available = lambda: False  # else RequestState asks for pinned memory


def vllm_config(method: str, k: int, batch: int, max_len: int, vocab: int, options: dict, model_dir: str):
    """A VllmConfig whose speculative config runs `method` (a tiny local model config: no weights);
    ours by the engine arguments that run it (its prediction processor among the model's)."""
    from vllm.config import ModelConfig, ParallelConfig, SchedulerConfig, SpeculativeConfig, VllmConfig

    from pipeline.engines.vllm import register_speculator, speculator_arguments

    register_speculator()
    arguments = speculator_arguments(k, options)
    spec = {"ngrammys": arguments["speculative_config"], "suffix": {"method": "suffix"}}.get(method)
    spec = dict(spec or {"method": "ngram_gpu"}, num_speculative_tokens=k)
    processors = arguments["logits_processors"] if method == "ngrammys" else None
    model = ModelConfig(
        model=model_dir, skip_tokenizer_init=True, max_model_len=max_len, dtype="float32", logits_processors=processors
    )
    scheduler = SchedulerConfig(
        max_num_seqs=batch, max_num_batched_tokens=max(2048, max_len), max_model_len=max_len, is_encoder_decoder=False
    )
    speculative = SpeculativeConfig(**spec, target_model_config=model, target_parallel_config=ParallelConfig())
    return VllmConfig(model_config=model, scheduler_config=scheduler, speculative_config=speculative)


def tiny_model_dir(vocab: int, max_len: int, directory: Path) -> str:
    """A model directory with a config.json only: the configs need one, nothing loads weights."""
    directory.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_hidden_layers": 1,
        "vocab_size": vocab,
        "max_position_embeddings": max_len,
        "torch_dtype": "float32",
    }
    (directory / "config.json").write_text(json.dumps(config))
    return str(directory)


class DecodeLoop:
    """One method's speculator over B slots of vLLM's RequestState, fed recorded answers."""

    def __init__(self, config, answers, batch: int, k: int, predictions: bool, reference=None):
        import torch
        from vllm.v1.worker.gpu.spec_decode import init_speculator
        from vllm.v1.worker.gpu.states import RequestState

        self.torch, self.k, self.batch = torch, k, batch
        self.answers, self.predictions = list(answers), predictions
        self.req_states = RequestState(
            batch,
            config.model_config.max_model_len,
            4096,
            k,
            config.model_config.get_vocab_size(),
            torch.device("cpu"),
            use_dense_all_token_ids=True,
        )
        self.speculator = init_speculator(config, torch.device("cpu"), self.req_states)
        self.sampler = None
        if predictions:  # vLLM's sampler, with the model's logits processors, as the runner builds it
            from vllm.v1.worker.gpu.sample.logits_processor import build_custom_logits_processors
            from vllm.v1.worker.gpu.sample.sampler import Sampler

            processors = build_custom_logits_processors(
                config, self.req_states, False, config.model_config.logits_processors or ()
            )
            vocab = config.model_config.get_vocab_size()
            self.sampler = Sampler(
                config, batch, vocab, torch.device("cpu"), self.req_states, custom_logits_processors=processors
            )
        self.reference = reference  # (check(drafter, batch tensors, drafts)) for ours, or None
        self.running: dict[str, dict] = {}
        self.confident: dict[str, int] = {}  # per request: its last draft's slots rated above 0
        self.admitted = 0
        self.drafts: dict[str, np.ndarray] = {}
        self.totals = dict(request_steps=0, accepted=0, emitted=0, draft_tokens=0, confident=0, steps=0, seconds=0.0)
        self.histogram = [0] * (k + 1)  # request-steps by draft tokens accepted
        self.schedule: list[tuple[int, int, int]] = []  # per engine step: (running, tokens fed, of them confident)

    def admit(self) -> list[str]:
        from vllm.sampling_params import SamplingParams

        from pipeline.engines.vllm import PREDICTION_KEY

        new = []
        while self.answers and len(self.running) < self.batch:
            answer = self.answers.pop(0)
            req_id = f"request-{self.admitted}"
            self.admitted += 1
            prompt = [int(t) for t in answer.prompt]
            self.req_states.add_request(req_id, len(prompt), prompt, 0, len(answer.output))
            slot = self.req_states.req_id_to_index[req_id]
            self.speculator.add_request(slot)
            if self.sampler is not None:
                prediction = [] if answer.prediction is None else [int(t) for t in answer.prediction]
                self.sampler.add_request(slot, SamplingParams(extra_args={PREDICTION_KEY: prediction}))
            self.running[req_id] = dict(slot=slot, output=answer.output, emitted=0)
            new.append(req_id)
        self.req_states.apply_staged_writes()
        return new

    def step(self, new: list[str]) -> None:
        """Verify every running request's draft (a new one: its prefill), post_update, finish, propose."""
        torch, k = self.torch, self.k
        ids = list(self.running)
        sampled = np.zeros((len(ids), k + 1), np.int64)
        num_sampled = np.zeros(len(ids), np.int32)
        num_rejected = np.zeros(len(ids), np.int32)
        for b, req_id in enumerate(ids):
            request = self.running[req_id]
            ahead = request["output"][request["emitted"] :]
            accepted = 0
            if req_id not in new:
                draft = self.drafts[req_id]
                while accepted < min(k, len(ahead) - 1) and draft[accepted] == ahead[accepted]:
                    accepted += 1
                self.totals["request_steps"] += 1
                self.totals["accepted"] += accepted
                self.histogram[accepted] += 1
                self.totals["draft_tokens"] += k
                num_rejected[b] = k - accepted
            sampled[b, : accepted + 1] = ahead[: accepted + 1]
            num_sampled[b] = accepted + 1
            request["emitted"] += accepted + 1
        drafted = len(ids) - len(new)
        confident = sum(int(self.confident.get(i, k)) for i in ids if i not in new)
        self.schedule.append((len(ids), len(ids) + k * drafted, len(ids) + confident))
        self.totals["emitted"] += int(num_sampled.sum())
        idx = torch.tensor([self.running[i]["slot"] for i in ids], dtype=torch.int32)
        rs = self.req_states
        from vllm.v1.worker.gpu.input_batch import post_update

        post_update(
            idx,
            rs.num_computed_tokens.gpu,
            rs.last_sampled_tokens,
            None,
            torch.from_numpy(sampled),
            torch.from_numpy(num_sampled),
            torch.from_numpy(num_rejected),
            None,
            rs.all_token_ids.gpu,
            rs.total_len.gpu,
        )
        finished = {i for i in ids if self.running[i]["emitted"] >= len(self.running[i]["output"])}
        if finished:
            self.speculator.on_requests_finished(finished)
            for req_id in sorted(finished):  # freed slots in one order: the next requests get the same slots
                rs.remove_request(req_id)
                del self.running[req_id]
        self.propose(ids, finished, num_sampled, num_rejected)

    def propose(self, ids, finished, num_sampled, num_rejected) -> None:
        torch = self.torch
        keep = [b for b, req_id in enumerate(ids) if req_id not in finished]
        live = [ids[b] for b in keep]
        if not live:
            return
        idx = torch.tensor([self.running[i]["slot"] for i in live], dtype=torch.int32)
        batch = types.SimpleNamespace(num_reqs=len(live), idx_mapping=idx)
        sampled_t = torch.from_numpy(num_sampled[keep].copy())
        rejected_t = torch.from_numpy(num_rejected[keep].copy())
        state = self.reference.before(self.speculator.drafter) if self.reference else None
        started = time.perf_counter()
        drafts = (
            self.speculator.propose(
                batch,
                None,
                None,
                None,
                None,
                sampled_t,
                rejected_t,
                self.req_states.last_sampled_tokens,
                None,
                None,
                None,
                num_speculative_tokens=self.k,
            )
            .numpy()
            .copy()
        )
        self.totals["seconds"] += time.perf_counter() - started
        if state is not None:
            self.reference.check(state, self.req_states, idx, sampled_t, rejected_t, drafts, self.speculator.drafter)
        rated = hasattr(self.speculator, "drafter")  # ours rates every slot; the others' are all verified
        confidence = self.speculator.draft_token_confidence_probs[: len(live)] if rated else None
        for b, req_id in enumerate(live):
            self.drafts[req_id] = drafts[b]
            self.confident[req_id] = int((confidence[b] > 0).sum()) if rated else self.k
            self.totals["confident"] += self.confident[req_id]
        self.totals["steps"] += 1

    def run(self) -> dict:
        while self.answers or self.running:
            self.step(self.admit())
        steps, accepted = self.totals["request_steps"], max(self.totals["accepted"], 1)
        return dict(
            tokens_per_step=round((self.totals["accepted"] + steps) / max(steps, 1), 4),
            accepted_per_step=round(self.totals["accepted"] / max(steps, 1), 4),
            draft_tokens_per_accepted=round(self.totals["draft_tokens"] / accepted, 3),
            confident_draft_tokens_per_accepted=round(self.totals["confident"] / accepted, 3),
            request_steps=steps,
            engine_steps=self.totals["steps"],
            propose_seconds=round(self.totals["seconds"], 2),
            emitted=self.totals["emitted"],
            accepted_histogram=self.histogram,
            schedule=self.schedule,
        )


def plain_schedule(answers, batch: int) -> list[tuple[int, int, int]]:
    """Plain decoding's steps over the same answers and slots: one token per running request a step."""
    remaining, running, schedule = [len(a.output) for a in answers], [], []
    while remaining or running:
        while remaining and len(running) < batch:
            running.append(remaining.pop(0))
        schedule.append((len(running), len(running), len(running)))
        running = [left - 1 for left in running if left > 1]
    return schedule


STEADY_BATCHES = (16, 64, 256)


def steady_ratio(histogram: list[int], k: int, batch: int, step_costs: dict) -> float:
    """A method's tokens/s over plain's at a steady `batch` on the measured step, asynchronous, drafting k
    tokens a request-step (every slot verified): batch x tokens per request-step per step of
    batch x (1 + k) tokens fed, against batch tokens per step of batch fed. Its tokens per request-step
    at k from the loop's histogram of accepted tokens (at most k of them count: a draft's first k tokens
    are the same whatever the longest draft)."""
    from jobs.benchmark.step_costs import MeasuredStepCost

    steps = max(sum(histogram), 1)
    tokens_per_step = 1 + sum(count * min(accepted, k) for accepted, count in enumerate(histogram)) / steps
    cost = MeasuredStepCost.from_report(step_costs, batch)
    drafted, plain = cost.seconds(np.array([batch * (1 + k), batch]))
    return round(float(tokens_per_step * plain / drafted), 3)


def steady(histogram: list[int], k: int, step_costs: dict) -> dict:
    """Per batch size: the ratio at k (every slot verified, as vLLM runs a fixed k) and at the best
    k' <= k (0: plain), as a draft length by batch size (vLLM's num_speculative_tokens_per_batch_size) runs."""
    rows = {}
    for batch in STEADY_BATCHES:
        ratios = [steady_ratio(histogram, length, batch, step_costs) for length in range(k + 1)]
        best = int(np.argmax(ratios))
        rows[batch] = {"at_k": ratios[k], "best_k": best, "at_best_k": ratios[best]}
    return rows


def project(rows: list[dict], plain: dict[int, list], step_costs: dict) -> None:
    """Each row's tokens/s on the measured GPU step, asynchronous: its emitted tokens over the sum of
    its steps' device seconds at the tokens each fed (every verified slot, and `_trimmed`: only the
    slots rated above 0, as adaptive verification keeps them); against plain on the same answers."""
    from jobs.benchmark.step_costs import MeasuredStepCost

    costs: dict[int, MeasuredStepCost] = {}

    def seconds(schedule, column: int) -> float:  # column 1: every slot fed, 2: the confident ones
        total = 0.0
        for step in schedule:
            cost = costs.setdefault(step[0], MeasuredStepCost.from_report(step_costs, step[0]))
            total += float(cost.seconds(np.array([step[column]]))[0])
        return total

    for row in rows:
        row["steady"] = steady(row["accepted_histogram"], row["k"], step_costs)
        emitted = row["emitted"]
        base = emitted / seconds(plain[row["batch"]], 1)
        row["plain_tokens_per_second"] = round(base, 1)
        row["tokens_per_second"] = round(emitted / seconds(row["schedule"], 1), 1)
        row["tokens_per_second_trimmed"] = round(emitted / seconds(row["schedule"], 2), 1)
        row["vs_plain"] = round(row["tokens_per_second"] / base, 3)
        row["vs_plain_trimmed"] = round(row["tokens_per_second_trimmed"] / base, 3)


def auto_projection(reports: list[dict], step_costs: dict) -> list[dict]:
    """drafting.speculation auto on vLLM 0.34 (rules of platform gpu_v2, greedy rows), projected per steady
    batch from reports of this loop on one workload (ours and vLLM's methods, at one k): the mode its
    rule starts in (ours at H100_DRAFT_LENGTHS' draft length for that batch), and where the rule
    measures, the fastest candidate less the measuring budget (MEASURE_BUDGET of the work)."""
    from pipeline.engines import speculation
    from pipeline.engines.vllm import H100_DRAFT_LENGTHS

    smallest = min(row["batch"] for report in reports for row in report["rows"])
    # Acceptance read at the loop's smallest batch (the recorded reports ran one): its histogram per method.
    rows = {row["method"]: row for report in reports for row in report["rows"] if row["batch"] == smallest}
    predictions = any(report.get("predictions") for report in reports)
    cells = []
    for batch in STEADY_BATCHES:
        rule = speculation.platform_rule("gpu_v2", batch, predictions, greedy=True)
        k = next(length for first, last, length in H100_DRAFT_LENGTHS if first <= batch <= last)
        ours = steady_ratio(rows["ngrammys"]["accepted_histogram"], k, batch, step_costs)
        modes = {"ours": ours, "plain": 1.0}
        modes.update(
            {
                method: steady_ratio(rows[method]["accepted_histogram"], rows[method]["k"], batch, step_costs)
                for method in ("suffix", "ngram")
                if method in rows
            }
        )
        start = ours if rule.choice == speculation.DRAFTING else 1.0
        best = max(modes.values())
        settled = best * (1 - speculation.MEASURE_BUDGET) if rule.measure and best > start else start
        cells.append(dict(batch=batch, k=k, rule=rule.why, start=round(start, 3), auto=round(settled, 3), **modes))
    return cells


def replay(args, answers, method: str, batch: int, reference=None) -> dict:
    prepare_cpu()
    max_len = max(len(a.prompt) + len(a.output) for a in answers) + args.k + 2
    max_len = 1 << (max_len - 1).bit_length()
    vocab = int(max(max(a.prompt.max(), a.output.max()) for a in answers)) + 1
    options = {"max_depth": 24, "corpus_tokens": args.corpus_tokens}
    if args.bigram_table:
        options["bigram_table"] = args.bigram_table
    if args.store:
        options["store"] = args.store
    model_dir = tiny_model_dir(max(vocab, 128), max_len, Path(args.work_dir))
    config = vllm_config(method, args.k, batch, max_len, vocab, options, model_dir)
    loop = DecodeLoop(config, answers, batch, args.k, bool(args.predictions) and method == "ngrammys", reference)
    return dict(method=method, batch=batch, k=args.k, **loop.run())


def run(args) -> dict:
    from jobs.benchmark.replay_answers import load_answers, load_predictions

    if args.auto:
        if not args.step_costs:
            raise SystemExit("--auto projects onto a GPU's measured step: give --step-costs")
        reports = [json.loads(Path(path).read_text()) for path in args.runs]
        costs = json.loads(Path(args.step_costs).read_text())
        return dict(reports=args.runs, step_costs=args.step_costs, auto=auto_projection(reports, costs))

    predictions = load_predictions(args.predictions) if args.predictions else None
    answers = load_answers(args.runs, args.max_new_tokens, predictions)
    if args.limit:
        answers = answers[: args.limit]
    if args.max_new_tokens:
        answers = [
            a.__class__(a.prompt, a.output[: args.max_new_tokens], a.max_tokens, a.id, a.prediction) for a in answers
        ]
    args.work_dir = getattr(args, "work_dir", "") or os.path.join(
        os.path.dirname(os.path.abspath(args.out or ".")), ".speculators-model"
    )
    reference = None
    if args.check_reference:
        from tests.drafters.device.check import ReferenceCheck

        reference = ReferenceCheck()
    rows = []
    for batch in args.batch:
        for method in [m.strip() for m in args.methods.split(",") if m.strip()]:
            if method not in METHODS:
                raise SystemExit(f"--methods: unknown method {method!r}; choose from {', '.join(METHODS)}")
            rows.append(replay(args, answers, method, batch, reference if method == "ngrammys" else None))
            print(json.dumps({key: value for key, value in rows[-1].items() if key != "schedule"}), flush=True)
    if args.step_costs:
        project(
            rows,
            {batch: plain_schedule(answers, batch) for batch in args.batch},
            json.loads(Path(args.step_costs).read_text()),
        )
    for row in rows:
        del row["schedule"]
    report = dict(
        runs=args.runs, predictions=args.predictions, answers=len(answers), step_costs=args.step_costs, rows=rows
    )
    if reference is not None:
        report["reference_request_steps_equal"] = reference.compared
    return report


def markdown(report: dict) -> str:
    if "auto" in report:
        lines = [
            "| running | auto starts | auto settles | ours (k) | plain | suffix (k=8) | ngram |",
            "|---|---|---|---|---|---|---|",
        ]
        for c in report["auto"]:
            lines.append(
                f"| {c['batch']} | {c['start']:.2f}x | {c['auto']:.2f}x | {c['ours']:.2f}x (k={c['k']}) | 1.00x "
                f"| {c.get('suffix', 0):.2f}x | {c.get('ngram', 0):.2f}x |"
            )
        return "\n".join(lines) + "\n"
    return markdown_table(report["rows"])


if __name__ == "__main__":  # vLLM 0.34's venv has no Ray: this subcommand runs on its own there
    import argparse

    from jobs.benchmark.report import write

    parser = argparse.ArgumentParser(prog="python -m jobs.benchmark.speculators", description=__doc__)
    add_cli_args(parser)
    parser.add_argument("--out", default="speculators.json", help="the report: JSON here, its table beside it (.md)")
    cli_args = parser.parse_args()
    result = run(cli_args)
    write(result, cli_args.out, markdown(result))
