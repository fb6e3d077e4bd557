"""The benchmark's subcommands end to end on the tiny model (python -m jobs.benchmark SUBCOMMAND):
each writes its report and the table beside it."""

import json
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest

from jobs import benchmark
from tests.processes import environment

REPO = Path(__file__).resolve().parents[3]


def test_every_subcommand_has_its_options_and_an_unknown_one_is_refused(capsys):
    from jobs.benchmark.cli import SUBCOMMANDS, parser

    top = parser()
    for name in SUBCOMMANDS:
        assert (
            top.parse_args(
                [name, "--out", "x.json"] + (["run"] if name in ("replay", "occupancy", "speculators") else [])
            ).command
            == name
        )
    with pytest.raises(SystemExit):
        top.parse_args(["--replay", "run"])  # a mode is a subcommand, not a flag
    assert "invalid choice" in capsys.readouterr().err


def test_benchmark_writes_results_with_identity_checked(tiny_model_dir, tmp_path):
    out = tmp_path / "results.json"
    benchmark.main(
        [
            "quality",
            "--dataset",
            "humaneval",
            "--limit",
            "2",
            "--max-new-tokens",
            "6",
            "--out",
            str(out),
            "--model",
            str(tiny_model_dir),
            "--methods",
            "hf_prompt_lookup:3,plain,context_ngram:1:3",
        ]
    )
    (report,) = json.loads(out.read_text())["datasets"]
    runs = {run["method"]: run for run in report["runs"]}
    assert set(runs) == {"hf_greedy", "hf_prompt_lookup:3", "plain", "context_ngram:1:3"}
    assert "| plain |" in out.with_suffix(".md").read_text()  # the table beside the report
    assert all(run["identical_fraction"] == 1.0 and run["generated_tokens"] == 12 for run in runs.values())
    assert runs["plain"]["tokens_per_call"] == 1.0


def test_benchmark_samples_with_the_same_seeds_and_predicts_the_speedup(tiny_model_dir, tmp_path):
    out = tmp_path / "results.json"
    benchmark.main(
        [
            "quality",
            "--dataset",
            "humaneval",
            "--limit",
            "2",
            "--max-new-tokens",
            "8",
            "--out",
            str(out),
            "--model",
            str(tiny_model_dir),
            "--temperature",
            "0.8",
            "--top-p",
            "0.9",
            "--seed",
            "3",
            "--methods",
            "plain,context_ngram:2:3,self_draft:1:2,hf_assisted:1:2",
        ]
    )
    runs = {run["method"]: run for run in json.loads(out.read_text())["datasets"][0]["runs"]}
    assert set(runs) == {"hf_sample", "plain", "context_ngram:2:3", "self_draft:1:2", "hf_assisted:1:2"}
    # Point drafts use the same per-position uniforms as plain sampling: the same samples.
    assert runs["context_ngram:2:3"]["identical_fraction"] == 1.0
    draft = runs["self_draft:1:2"]
    assert 0 <= draft["alpha"] <= 1 and draft["draft_cost_ratio"] > 0 and draft["predicted_speedup_vs_plain"] > 0
    assert all(run["generated_tokens"] == 16 for run in runs.values())


def test_benchmark_grid_sweeps_k_and_w_and_draws_the_figures(tiny_model_dir, tmp_path):
    out = tmp_path / "grid.json"
    report = benchmark.main(
        [
            "grid",
            "--drafter",
            "context_ngram",
            "--dataset",
            "humaneval,gsm8k",
            "--limit",
            "1",
            "--max-new-tokens",
            "6",
            "--out",
            str(out),
            "--model",
            str(tiny_model_dir),
            "--plots",
            str(tmp_path / "plots"),
        ]
    )
    assert [r["dataset"] for r in json.loads(out.read_text())["datasets"]] == ["humaneval", "gsm8k"]
    for dataset in report["datasets"]:
        methods = {run["method"]: run for run in dataset["runs"]}
        assert len([m for m in methods if m.startswith("context_ngram:") and "auto" not in m]) == 20
        assert all(run["identical_fraction"] == 1.0 for run in methods.values())
        grid = dataset["grid"]
        assert grid["best_fixed"] in methods
        assert grid["best_fixed_speedup"] == max(
            methods[f"context_ngram:{k}:{w}"]["speedup_vs_hf_greedy"] for k in (1, 2, 4, 8, 16) for w in (1, 2, 4, 8)
        )
    names = sorted(p.name for p in (tmp_path / "plots").iterdir())
    for dataset in ("humaneval", "gsm8k"):
        for figure in (
            "tokens_per_call",
            "speedup",
            "accepted_length",
            "accepted_rank",
            "strategy_rows",
            "strategy_wins",
        ):
            assert f"{dataset}_{figure}.png" in names


def test_benchmark_throughput_compares_batched_methods_at_each_batch_size(tiny_model_dir, tmp_path):
    out = tmp_path / "throughput.json"
    report = benchmark.main(
        [
            "throughput",
            "--batch",
            "1,3",
            "--spec",
            "context_ngram:2:3",
            "--dataset",
            "humaneval",
            "--limit",
            "4",
            "--max-new-tokens",
            "8",
            "--out",
            str(out),
            "--model",
            str(tiny_model_dir),
        ]
    )
    runs = report["runs"]
    # generate as its users get it, generate on our engine's attention call, ours plain, ours drafting.
    methods = ["hf_greedy", "hf_greedy_gqa", "plain", "context_ngram:2:3"]
    assert [(r["batch"], r["method"]) for r in runs[1:5]] == [(1, method) for method in methods]
    assert {r["method"] for r in runs if r["batch"] == 3} == set(methods)
    # Ours is identical to single-request greedy at every batch size (generate batched may not be).
    assert all(r["identical_fraction"] == 1.0 for r in runs if not r["method"].startswith("hf_greedy"))
    assert json.loads(out.read_text())["runs"] == runs


@pytest.mark.nightly  # vLLM started beside our engine (about 1.5 minutes): make test-nightly
def test_benchmark_compares_engines_side_by_side_on_the_same_prompts(tiny_model_dir, tmp_path, processes):
    """engines: vLLM plain, vLLM's n-gram, ours on vLLM and ours on the
    transformers engine, per batch size, each checked against plain greedy on the same engine.
    A process of its own: vLLM's n-gram imports numba, which no later vLLM start in a process survives."""
    out = tmp_path / "engines.json"
    processes.run(
        [
            sys.executable,
            "-m",
            "jobs.benchmark",
            "engines",
            "--batch",
            "1,2",
            "--spec",
            "context_ngram:1:3,mixed:1:auto",
            "--reference",
            "context_ngram:2:3",
            "--dataset",
            "humaneval",
            "--limit",
            "3",
            "--rounds",
            "2",
            "--max-new-tokens",
            "8",
            "--model",
            str(tiny_model_dir),
            "--out",
            str(out),
        ],
        cwd=REPO,
        env=environment(),
        timeout=600,
    )
    report = json.loads(out.read_text())
    runs = report["runs"]
    # Two rounds at two batch sizes, each run on 3 prompts of its own: 12 prompts, none repeated.
    assert (report["prompts"], report["prompts_per_run"], report["rounds"]) == (12, 3, 2)
    assert [(c["round"], c["batch"]) for c in report["chunks"]] == [(1, 1), (1, 2), (2, 1), (2, 2)]
    assert len({p for c in report["chunks"] for p in c["prompts"]}) == 12
    assert all(len(r["tokens_per_second_rounds"]) == 2 for r in runs)
    expected = {
        ("vllm", "plain"),
        ("vllm", "vllm_ngram"),
        ("vllm", "context_ngram:1:3"),
        ("vllm", "mixed:1:auto"),
        ("transformers", "context_ngram:2:3"),
    } | ({("vllm", "vllm_suffix")} if find_spec("arctic_inference") else set())
    for batch in (1, 2):
        rows = {(r["engine"], r["method"]): r for r in runs if r["batch"] == batch}
        assert set(rows) == expected
        assert all(r["tokens_per_second"] > 0 and r["tokens_per_call"] >= 1 for r in rows.values())
        assert all(r["identical_fraction"] == 1.0 for r in rows.values() if r["engine"] == "vllm")
        assert rows["vllm", "plain"]["tokens_per_call"] == 1.0 and rows["vllm", "plain"]["vs_plain"] == 1.0


@pytest.mark.nightly  # vLLM started (about a minute): make test-nightly
def test_edits_writes_a_series_runs_that_the_replay_drafts_from(tiny_model_dir, tmp_path, processes):
    """edits --write-runs: plain vLLM's earlier run and an edited rerun as Parquet, the rows joined by
    id; the replay gives each edited row its earlier output as prediction (ours_prediction)."""
    runs = tmp_path / "runs"
    processes.run(
        [
            sys.executable,
            "-m",
            "jobs.benchmark",
            "edits",
            "--dataset",
            "corpus-rewrite-code",
            "--limit",
            "4",
            "--max-new-tokens",
            "8",
            "--batch",
            "4",
            "--edit",
            "line,field",
            "--write-runs",
            str(runs),
            "--model",
            str(tiny_model_dir),
            "--out",
            str(tmp_path / "edits.json"),
        ],
        cwd=REPO,
        env=environment(),
        timeout=600,
    )
    written = json.loads((tmp_path / "edits.json").read_text())
    assert [(r["run"], r["rows"]) for r in written["runs"]] == [("earlier", 4), ("line", 4), ("field", 4)]
    report = benchmark.main(
        [
            "replay",
            str(runs / "line"),
            "--predictions",
            str(runs / "earlier"),
            "--batch",
            "2",
            "--methods",
            "ours_prediction,plain",
            "--project",
            "",
            "--out",
            str(tmp_path / "r.json"),
        ]
    )
    assert report["predicted_answers"] == 4 and {r["method"] for r in report["replay"]} == {"ours_prediction", "plain"}


def test_scale_edits_a_count_or_a_share_of_each_corpus_spread_over_it():
    from jobs.benchmark.scale import edited_count, edited_documents

    assert edited_documents(2000, edited_count("20")) == set(range(0, 2000, 100))
    assert edited_documents(1_000_000, edited_count("1%")) == set(range(0, 1_000_000, 100))
    assert len(edited_documents(200_000, edited_count("1%"))) == 2000
    with pytest.raises(ValueError, match="--edited 150%"):
        edited_count("150%")
