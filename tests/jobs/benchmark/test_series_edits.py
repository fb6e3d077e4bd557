"""series-edits' pure parts: its cells, the job's inputs and commands, and the table from summaries."""

import sys

import pytest

from jobs.benchmark.datasets import Prompt
from jobs.benchmark.document_edits import edit
from jobs.benchmark.job_runs import job_command, summary_path
from jobs.benchmark.series_edits import cell_rows, cells, corpus_rows, goals, series_directory, variant

DOCUMENT = "Rewrite this.\n\n" + "".join(f"line {i} = {i}\n" for i in range(9))


def test_cells_are_edit_kinds_and_batch_sizes_and_anything_else_is_refused():
    assert cells("line:1, field:16,") == [("line", 1), ("field", 16)]
    for bad in ("line", "word:1", "line:0", "line:x"):
        with pytest.raises(ValueError, match="a cell is EDIT:B"):
            cells(bad)


def test_the_inputs_are_the_prompts_and_the_same_ids_edited():
    prompts = [Prompt("a", DOCUMENT), Prompt("b", "short")]
    assert corpus_rows(prompts) == [{"id": "a", "prompt": DOCUMENT}, {"id": "b", "prompt": "short"}]
    edited = corpus_rows(prompts, "paragraph")
    assert edited == [{"id": "a", "prompt": edit(DOCUMENT, "paragraph")}, {"id": "b", "prompt": "short"}]
    assert edited[0]["prompt"] != DOCUMENT


def test_a_run_is_the_job_as_a_user_types_it():
    command = job_command("in.jsonl", "out", "edited", ["job.series=s", "vllm.max_num_seqs=1"])
    assert command == [
        sys.executable,
        "-m",
        "jobs.generate",
        "--input",
        "in.jsonl",
        "--output",
        "out",
        "--run-id",
        "edited",
        "--set",
        "job.series=s",
        "--set",
        "vllm.max_num_seqs=1",
    ]
    assert summary_path("{...}\nParquet: d/*.parquet\nSummary: d/summary.json\n") == "d/summary.json"


def summary(speed, calls, tokens, accepted=0):
    return {
        "tokens_per_second_after_startup": speed,
        "tokens_per_call": calls,
        "generated_tokens": 6,
        "accepted_prediction_tokens": accepted,
        "rejected_prediction_tokens": 0,
        "tokens": tokens,
    }


def test_the_table_compares_ours_with_suffix_and_plain_and_the_goals_read_it():
    plain = {"a": [1, 2, 3], "b": [4, 5, 6]}
    results = {
        "ours": summary(30.0, 7.5, plain, accepted=5),
        "vllm_suffix": summary(20.0, 3.0, {"a": [1, 2, 3], "b": [4, 5]}),
        "plain": summary(10.0, 1.0, plain),
    }
    rows = {row["method"]: row for row in cell_rows("line", 1, results)}
    assert [rows[m]["identical_to_plain"] for m in ("ours", "vllm_suffix", "plain")] == ["2/2", "1/2", "2/2"]
    assert (rows["ours"]["speed_vs_vllm_suffix"], rows["ours"]["calls_vs_vllm_suffix"]) == (1.5, 2.5)
    assert (rows["ours"]["speed_vs_plain"], rows["ours"]["calls_vs_plain"]) == (3.0, 7.5)
    assert rows["ours"]["accepted_prediction_tokens"] == 5 and "speed_vs_plain" not in rows["plain"]
    assert [(g["goal"], g["met"]) for g in goals(list(rows.values()))] == [
        ("tokens/call vs vllm_suffix >= 2.5", True),
        ("tokens/s vs vllm_suffix >= 1.4", True),
    ]
    slower = {row["method"]: row for row in cell_rows("line", 16, {**results, "plain": summary(40.0, 1.0, plain)})}
    assert [(g["goal"], g["met"]) for g in goals(list(slower.values()))] == [
        ("tokens/s vs vllm_suffix >= 1.0", True),
        ("tokens/s vs plain >= 1.0", False),
    ]


def test_a_variant_of_ours_is_named_compared_and_runs_on_a_series_of_its_own():
    assert variant("long:drafting.prediction_w=128, drafting.w=8") == (
        "ours:long",
        ["drafting.prediction_w=128", "drafting.w=8"],
    )
    for bad in ("long", "long:", "2x:engine.w=1", "long:drafting.prediction_w"):
        with pytest.raises(ValueError, match="an ours variant is NAME:"):
            variant(bad)
    assert (series_directory("ours"), series_directory("ours:long")) == ("series", "series-long")
    plain = {"a": [1, 2, 3]}
    results = {
        "ours": summary(30.0, 6.0, plain),
        "ours:long": summary(20.0, 9.0, plain),
        "vllm_suffix": summary(20.0, 3.0, plain),
        "plain": summary(10.0, 1.0, plain),
    }
    rows = {row["method"]: row for row in cell_rows("line", 1, results)}
    assert (rows["ours:long"]["speed_vs_vllm_suffix"], rows["ours:long"]["calls_vs_vllm_suffix"]) == (1.0, 3.0)
    assert "first_run" in rows["ours"] and "first_run" not in rows["ours:long"]
    assert [(g["method"], g["met"]) for g in goals(list(rows.values()))] == [
        ("ours", False),
        ("ours", True),
        ("ours:long", True),
        ("ours:long", False),
    ]
