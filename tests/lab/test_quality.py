"""lab quality (lab/quality.py) on the tiny model: every method against transformers' generate, greedy and sampled."""

import json


from lab.cli import main as lab_main


def test_benchmark_writes_results_with_identity_checked(tiny_model_dir, tmp_path):
    out = tmp_path / "results.json"
    lab_main(
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
    lab_main(
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
    assert (
        0 <= draft["acceptance_rate"] <= 1 and draft["draft_cost_ratio"] > 0 and draft["predicted_speedup_vs_plain"] > 0
    )
    assert all(run["generated_tokens"] == 16 for run in runs.values())
