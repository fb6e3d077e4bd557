import json

import pyarrow.parquet as pq
import pytest

from jobs import report
from pipeline.config import load_config
from tests.job_in_process import generate, job_stage


@pytest.fixture(scope="module")
def auto_run(tiny_model_dir, tmp_path_factory):
    """A run directory written by a `k: auto, w: auto` stage: two good rows and one that errored."""
    config = load_config(
        overrides=[
            "engine.name=transformers",
            f"model.name={tiny_model_dir}",
            "drafting.drafter=context_ngram",
            "transformers.k=auto",
            "drafting.w=auto",
            "sampling.max_new_tokens=24",
        ]
    )
    table = generate(
        job_stage(config),
        {"id": ["a", "b", "bad"], "prompt": ["def add(a, b):\n    return a + b\n" * 3, "x = 1\n" * 8, " "]},
    )
    output = tmp_path_factory.mktemp("out")
    (output / "run=r1").mkdir()
    pq.write_table(table, output / "run=r1" / "0.parquet")
    return output, table.to_pydict()


def test_an_auto_stage_records_its_settings(auto_run):
    _, rows = auto_run
    assert rows["auto_k"][0] and rows["auto_w"][0] and rows["k"][0] == 8 and rows["w"][0] == 8
    assert rows["error"][:2] == [None, None] and rows["num_generated_tokens"][:2] == [24, 24]


def test_report_draws_the_acceptance_plots_from_the_parquet(auto_run, tmp_path):
    output, rows = auto_run
    result = report.main([str(output), "--out", str(tmp_path)])  # the output dir holds a single run
    assert (result["rows"], result["errored_rows"]) == (3, 1)
    (label,) = result["settings"]  # one setting: the auto stage's (batched, its rows merged into a tree)
    assert label.startswith("context_ngram k=auto w=auto")
    totals = result["settings"][label]
    assert totals["requests"] == 2 and totals["generated_tokens"] == 48
    assert totals["tokens_per_call"] == pytest.approx(48 / sum(rows["num_target_calls"][:2]), abs=1e-4)
    for name in ("accepted_length", "accepted_rank", "strategy_rows", "strategy_wins", "tokens_per_call"):
        assert (tmp_path / f"{name}.png").stat().st_size > 1000
    assert json.loads((tmp_path / "report.json").read_text())["plots"] == result["plots"]


def test_report_asks_which_run_when_there_are_several(auto_run, tmp_path):
    output, _ = auto_run
    (output / "run=r2").mkdir(exist_ok=True)
    with pytest.raises(report.ReportError, match=r"2 runs \(run=r1, run=r2\)"):
        report.main([str(output)])
    with pytest.raises(report.ReportError, match="no such directory"):
        report.main([str(tmp_path / "missing")])


def test_report_draws_each_actors_speculation_mode_over_its_windows(auto_run, tmp_path):
    """summary.json's speculation: an actor that measured ours, then plain, and kept plain."""
    output, _ = auto_run
    windows = [
        {
            "mode": "batch_suffix",
            "at_busy_seconds": 0.0,
            "seconds": 30.0,
            "tokens": 3000,
            "rows": 40,
            "tokens_per_second": 100.0,
            "prediction_share": 0.0,
        },
        {
            "mode": "none",
            "at_busy_seconds": 30.0,
            "seconds": 31.0,
            "tokens": 3720,
            "rows": 41,
            "tokens_per_second": 120.0,
            "prediction_share": 0.0,
        },
    ]
    actor = {
        "mode": "none",
        "decided_by": "measured",
        "modes": ["batch_suffix", "none"],
        "rule": "open",
        "window_seconds": 30.0,
        "restart_seconds": 6.5,
        "busy_seconds": 61.0,
        "rows": 81,
        "windows": windows,
        "switches": [
            {
                "at_busy_seconds": 30.0,
                "at": 1.0,
                "from": "batch_suffix",
                "to": "none",
                "why": "measure",
                "drain_seconds": 1.2,
                "restart_seconds": 6.5,
            }
        ],
    }
    (output / "run=r1" / "summary.json").write_text(
        json.dumps({"speculation": {"setting": "auto", "actors": {"a1": actor}}})
    )
    try:
        result = report.main([str(output / "run=r1"), "--out", str(tmp_path)])
    finally:
        (output / "run=r1" / "summary.json").unlink()
    assert (tmp_path / "speculation.png").stat().st_size > 1000 and "speculation.png" in result["plots"]
    assert result["speculation"] == [
        {
            "actor": "a1",
            "mode": "none",
            "decided_by": "measured",
            "switches": 1,
            "restart_seconds": 6.5,
            "windows": "batch_suffix 100.0, none 120.0",
        }
    ]
    assert "| a1 | none | measured | 1 | 6.5 |" in (tmp_path / "report.md").read_text()
