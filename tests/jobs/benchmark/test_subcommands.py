"""The benchmark's subcommands end to end on the tiny model (python -m jobs.benchmark SUBCOMMAND):
each writes its report and the table beside it."""

import json
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest

from tests.processes import environment

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("program", ["jobs.benchmark.cli", "lab.cli"])
def test_every_subcommand_has_its_options_and_an_unknown_one_is_refused(program, capsys):
    """ngrammys bench and the lab's python -m lab: each subcommand parses its options."""
    import importlib

    cli = importlib.import_module(program)
    top = cli.parser()
    for name in cli.SUBCOMMANDS:
        assert (
            top.parse_args(
                [name, "--out", "x.json"] + (["run"] if name in ("replay", "occupancy", "speculators") else [])
            ).command
            == name
        )
    with pytest.raises(SystemExit):
        top.parse_args(["--replay", "run"])  # a mode is a subcommand, not a flag
    assert "invalid choice" in capsys.readouterr().err


def test_the_product_offers_what_a_user_runs_to_decide_and_the_lab_the_rest():
    """At most 8 subcommands in `ngrammys bench`; the lab's instruments are none of them, and the
    product's modules import nothing of the lab (tests/test_layers.py holds every import)."""
    from jobs.benchmark.cli import SUBCOMMANDS
    from lab.cli import SUBCOMMANDS as LAB

    assert len(SUBCOMMANDS) <= 8 and not set(SUBCOMMANDS) & set(LAB)
    assert all(module.startswith("jobs.benchmark.") for module in SUBCOMMANDS.values())
    assert all(module.startswith("lab.") for module in LAB.values())


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
