"""Benchmark prompt sets: ShareGPT read record by record from the package's cut JSON file."""

import json

from pipeline.config.package_data import json_list_records
from jobs.benchmark.datasets import load_prompts


def test_sharegpt_prompts_are_first_human_turns_with_text():
    prompts = load_prompts("sharegpt", 25)
    assert len(prompts) == 25 and len({p.request_id for p in prompts}) == 25
    assert all(isinstance(p.prompt, str) and p.prompt.strip() for p in prompts)
    assert prompts[0].prompt.startswith("Summarize the main ideas of Jeff Walker's Product Launch Formula")


def test_a_json_list_cut_inside_a_record_yields_the_records_before_it(tmp_path):
    records = [{"id": str(i), "conversations": [{"from": "human", "value": "x" * (i + 1)}]} for i in range(3)]
    text = json.dumps(records)
    path = tmp_path / "cut.json"
    path.write_text(text[: text.index('"2"') + 2])
    cut = []
    assert [r["id"] for r in json_list_records(path, cut.append)] == ["0", "1"]
    assert cut and cut[0] > 0
