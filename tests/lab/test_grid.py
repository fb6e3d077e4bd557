"""lab grid (lab/grid.py) on the tiny model: the paper's k x w sweep and its figures."""

import json


from lab.cli import main as lab_main


def test_benchmark_grid_sweeps_k_and_w_and_draws_the_figures(tiny_model_dir, tmp_path):
    out = tmp_path / "grid.json"
    report = lab_main(
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
