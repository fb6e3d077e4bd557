"""lab throughput (lab/throughput.py) on the tiny model: batched methods per batch size."""

import json


from lab.cli import main as lab_main


def test_benchmark_throughput_compares_batched_methods_at_each_batch_size(tiny_model_dir, tmp_path):
    out = tmp_path / "throughput.json"
    report = lab_main(
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
